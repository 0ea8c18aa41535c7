//! The schema, created on connect by embedded, versioned migrations, applied under an
//! advisory lock.

use std::collections::HashSet;

/// The schema, one versioned step at a time; applied steps are listed in
/// `carmy_idempotency_migrations`. Append, never edit.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "idempotency_records",
        include_str!("../../../migrations/postgres/0001_idempotency_records.sql"),
    ),
    (
        2,
        "executions",
        include_str!("../../../migrations/postgres/0002_executions.sql"),
    ),
    (
        3,
        "events",
        include_str!("../../../migrations/postgres/0003_events.sql"),
    ),
];

/// Held while migrating, so replicas starting together apply each step once.
const MIGRATION_LOCK: i64 = 0x6361_726d_7969_6470; // "carmyidp"

/// Applies the migrations not yet applied, holding the advisory lock.
pub(super) async fn migrate(
    client: &mut deadpool_postgres::Client,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let migrated = apply_migrations(client).await;
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    migrated?;
    unlocked.map(drop)
}

async fn apply_migrations(
    client: &mut deadpool_postgres::Client,
) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS carmy_idempotency_migrations (
                version    integer     PRIMARY KEY,
                name       text        NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )",
        )
        .await?;
    let applied: HashSet<i32> = client
        .query("SELECT version FROM carmy_idempotency_migrations", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    for (version, name, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        let transaction = client.transaction().await?;
        transaction.batch_execute(sql).await?;
        transaction
            .execute(
                "INSERT INTO carmy_idempotency_migrations (version, name) VALUES ($1, $2)",
                &[version, name],
            )
            .await?;
        transaction.commit().await?;
        tracing::info!(version, name, "applied idempotency store migration");
    }
    Ok(())
}
