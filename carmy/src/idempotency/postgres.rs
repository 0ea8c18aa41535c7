//! Records in PostgreSQL, shared by every replica that uses the same database.

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{AsyncMessage, NoTls, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::task::AbortOnDropHandle;

use super::announcements::{AnnouncedIds, Announcements};
use super::options::take_params;
use super::record::{Cleanup, Found, Stored, reserve_within, within};
use super::{
    AfterAttempt, Cancellation, ClaimedDelivery, DeliveryAttempt, ExecutionQuery, ExecutionRecord,
    ExecutionState, ExecutionSummary, Fingerprint, Finish, IdempotencyKey, IdempotencyStore,
    KEPT_ATTEMPTS, KEPT_PROGRESS, OutboxEvent, RecordedEvent, RecordedOutcome, Reservation,
    StoreError, StoreOptions, StoredSubscription,
};
use crate::tls;

/// The schema, one versioned step at a time; applied steps are listed in
/// `carmy_idempotency_migrations`. Append, never edit.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "idempotency_records",
        include_str!("../../migrations/postgres/0001_idempotency_records.sql"),
    ),
    (
        2,
        "executions",
        include_str!("../../migrations/postgres/0002_executions.sql"),
    ),
    (
        3,
        "events",
        include_str!("../../migrations/postgres/0003_events.sql"),
    ),
];

/// Held while migrating, so replicas starting together apply each step once.
const MIGRATION_LOCK: i64 = 0x6361_726d_7969_6470; // "carmyidp"

/// How often each store deletes expired records, and how many per statement.
const CLEANUP_EVERY: Duration = Duration::from_secs(60);
const CLEANUP_BATCH: i64 = 1_000;

const POOL_SIZE: usize = 16;

/// Deliveries claimed per call at most (each gets a claim token made here).
const CLAIM_BATCH: usize = 1_000;

/// Claims a key, or reads the record that holds it, in one round trip: `claimed` is true when
/// the key was inserted or taken over from an expired record. A running record whose lease
/// has passed turns uncertain in the same statement. A live record is otherwise left
/// untouched, not locked: `ON CONFLICT DO UPDATE … WHERE` would lock the row even where it
/// updates nothing, so concurrent retries of one key would queue on the lock, each behind the
/// previous one's commit (a WAL flush each: about 550 a second at 16 clients on this machine,
/// against 18,700 without the lock). No row: the record changed after the statement's snapshot
/// was taken; the caller runs it again.
const RESERVE: &str = "\
WITH inserted AS (
    INSERT INTO carmy_idempotency_records
        (caller, request_id, tool, digest, execution_id, state, reserved_at, lease_until,
         expires_at)
    VALUES ($1, $2, $3, $4, $5, 'running', now(),
            now() + $6::bigint * interval '1 millisecond',
            now() + ($6::bigint + $7::bigint) * interval '1 millisecond')
    ON CONFLICT (caller, request_id) DO NOTHING
    RETURNING tool, digest, execution_id, state, reserved_at, status, category, code, body
), taken_over AS (
    UPDATE carmy_idempotency_records
    SET tool = $3, digest = $4, execution_id = $5, state = 'running', reserved_at = now(),
        lease_until = now() + $6::bigint * interval '1 millisecond',
        expires_at = now() + ($6::bigint + $7::bigint) * interval '1 millisecond',
        status = NULL, category = NULL, code = NULL, body = NULL
    WHERE caller = $1 AND request_id = $2 AND expires_at <= now()
      AND NOT EXISTS (SELECT 1 FROM inserted)
    RETURNING tool, digest, execution_id, state, reserved_at, status, category, code, body
), lapsed AS (
    UPDATE carmy_idempotency_records SET state = 'uncertain'
    WHERE caller = $1 AND request_id = $2 AND state = 'running'
      AND lease_until < now() AND expires_at > now()
      AND NOT EXISTS (SELECT 1 FROM inserted)
    RETURNING tool, digest, execution_id, state, reserved_at, status, category, code, body
), found AS (
    SELECT true AS claimed, * FROM inserted
    UNION ALL
    SELECT true, * FROM taken_over
    UNION ALL
    SELECT false, * FROM lapsed
    UNION ALL
    SELECT false, tool, digest, execution_id, state, reserved_at, status, category, code, body
    FROM carmy_idempotency_records
    WHERE caller = $1 AND request_id = $2 AND expires_at > now()
      AND NOT EXISTS (SELECT 1 FROM inserted) AND NOT EXISTS (SELECT 1 FROM lapsed)
)
SELECT claimed, tool, digest, execution_id, state,
       (extract(epoch FROM now() - reserved_at) * 1000)::bigint AS running_ms,
       status, category, code, body
FROM found";

/// Only the execution that reserved the key may finish it (also after its lease passed).
const FINISH: &str = "\
UPDATE carmy_idempotency_records
SET state = $4, status = $5, category = $6, code = $7, body = $8,
    expires_at = now() + $9::bigint * interval '1 millisecond'
WHERE caller = $1 AND request_id = $2 AND execution_id = $3 AND state <> 'finished'";

const RELEASE: &str = "\
DELETE FROM carmy_idempotency_records WHERE caller = $1 AND request_id = $2 AND execution_id = $3";

/// One batch of expired records; `SKIP LOCKED` lets replicas clean up side by side.
const PURGE_BATCH: &str = "\
DELETE FROM carmy_idempotency_records
WHERE (caller, request_id) IN (
    SELECT caller, request_id FROM carmy_idempotency_records
    WHERE expires_at < now()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)";

const BEGIN_EXECUTION: &str = "\
INSERT INTO carmy_executions (execution_id, caller, tool, expires_at)
VALUES ($1, $2, $3, now() + $4::bigint * interval '1 millisecond')";

/// Adds a running execution's event, drops those older than the kept window, and announces
/// it (`NOTIFY`, sent when the statement commits).
const RECORD_PROGRESS: &str = "\
WITH added AS (
    INSERT INTO carmy_execution_events (execution_id, id, data)
    SELECT $1, $2, $3
    WHERE EXISTS (SELECT 1 FROM carmy_executions WHERE execution_id = $1 AND status IS NULL)
    ON CONFLICT DO NOTHING
    RETURNING pg_notify('carmy_executions', execution_id)
)
DELETE FROM carmy_execution_events
WHERE execution_id = $1 AND id <= $2 - $4::bigint AND EXISTS (SELECT 1 FROM added)";

const END_EXECUTION: &str = "\
UPDATE carmy_executions
SET status = $2, category = $3, code = $4, body = $5, final_event_id = $6,
    expires_at = now() + $7::bigint * interval '1 millisecond'
WHERE execution_id = $1 AND status IS NULL
RETURNING pg_notify('carmy_executions', execution_id)";

/// An execution of `caller`; an ended one only until it expires.
const EXECUTION: &str = "\
SELECT tool, status, category, code, body, final_event_id, cancel_requested
FROM carmy_executions
WHERE execution_id = $1 AND caller = $2 AND (status IS NULL OR expires_at > now())";

const EXECUTION_EVENTS: &str = "\
SELECT id, data FROM carmy_execution_events WHERE execution_id = $1 ORDER BY id";

/// A page of the caller's executions, newest (greatest UUID v7) first.
const EXECUTIONS: &str = "\
SELECT execution_id, tool, status FROM carmy_executions
WHERE caller = $1 AND (status IS NULL OR expires_at > now())
  AND ($2::text IS NULL OR execution_id < $2)
  AND ($3::text IS NULL OR tool = $3)
  AND ($4::text IS NULL OR ($4 = 'running' AND status IS NULL) OR status = $4)
ORDER BY execution_id DESC
LIMIT $5";

/// Marks the caller's running execution cancelled and announces it; says what it found.
const CANCEL_EXECUTION: &str = "\
WITH requested AS (
    UPDATE carmy_executions SET cancel_requested = true
    WHERE execution_id = $1 AND caller = $2 AND status IS NULL
    RETURNING pg_notify('carmy_executions', execution_id)
)
SELECT EXISTS (SELECT 1 FROM requested) AS requested,
       EXISTS (SELECT 1 FROM carmy_executions
               WHERE execution_id = $1 AND caller = $2 AND status IS NOT NULL
                 AND expires_at > now()) AS ended";

const PURGE_EXECUTIONS: &str = "\
DELETE FROM carmy_executions
WHERE execution_id IN (
    SELECT execution_id FROM carmy_executions
    WHERE expires_at < now()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)";

/// Saves a subscription, replacing the one with its id.
///
/// $1 id, $2 url, $3 event types, $4 description, $5 secret, $6 previous secret, $7 until when
/// it signs, $8 created at, $9 disabled reason, $10 failing since.
const SAVE_SUBSCRIPTION: &str = "\
INSERT INTO carmy_event_subscriptions
    (id, url, event_types, description, secret, previous_secret, previous_secret_until,
     created_at, disabled_reason, failing_since)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (id) DO UPDATE
SET url = excluded.url, event_types = excluded.event_types, description = excluded.description,
    secret = excluded.secret, previous_secret = excluded.previous_secret,
    previous_secret_until = excluded.previous_secret_until, created_at = excluded.created_at,
    disabled_reason = excluded.disabled_reason, failing_since = excluded.failing_since";

/// The subscription $1.
const SUBSCRIPTION: &str = "\
SELECT id, url, event_types, description, secret, previous_secret, previous_secret_until,
       created_at, disabled_reason, failing_since
FROM carmy_event_subscriptions WHERE id = $1";

/// Every subscription, oldest first.
const SUBSCRIPTIONS: &str = "\
SELECT id, url, event_types, description, secret, previous_secret, previous_secret_until,
       created_at, disabled_reason, failing_since
FROM carmy_event_subscriptions ORDER BY created_at, id";

/// Deletes the subscription $1 with its deliveries and its attempts; the row count says whether
/// the subscription was there.
const DELETE_SUBSCRIPTION: &str = "\
WITH deliveries AS (DELETE FROM carmy_event_deliveries WHERE subscription_id = $1),
     attempts AS (DELETE FROM carmy_event_attempts WHERE subscription_id = $1)
DELETE FROM carmy_event_subscriptions WHERE id = $1";

/// Writes an event's deliveries, due now; one already written stays as it is.
///
/// $1 event id, $2 event type, $3 body, $4 the subscription ids.
const ENQUEUE_EVENT: &str = "\
INSERT INTO carmy_event_deliveries (event_id, subscription_id, event_type, body, due)
SELECT $1, subscription_id, $2, $3, now() FROM unnest($4::text[]) AS subscription_id
ON CONFLICT DO NOTHING";

/// Claims up to $1 due deliveries, earliest due first, in one statement: the rows are locked
/// with `SKIP LOCKED` (replicas claiming together take different ones), given the claim tokens
/// of $3 (in due order) and made due again when the lease of $2 ms passes, should the claiming
/// replica die before it finishes the attempt. `n` is the claim's place in due order.
const CLAIM_DELIVERIES: &str = "\
UPDATE carmy_event_deliveries AS delivery
SET claim = ($3::text[])[picked.n::integer],
    due = now() + $2::bigint * interval '1 millisecond'
FROM (
    SELECT event_id, subscription_id, row_number() OVER (ORDER BY due) AS n
    FROM (
        SELECT event_id, subscription_id, due FROM carmy_event_deliveries
        WHERE due <= now()
        ORDER BY due
        LIMIT $1
        FOR UPDATE SKIP LOCKED
    ) AS due_now
) AS picked
WHERE delivery.event_id = picked.event_id AND delivery.subscription_id = picked.subscription_id
RETURNING picked.n, delivery.subscription_id, delivery.event_id, delivery.event_type,
          delivery.body, delivery.attempts, delivery.claim";

/// The start of [`FINISH_REMOVE`] and [`FINISH_RETRY`]: logs an attempt and trims the log of
/// its subscription to the latest ones (those already there but the $8 latest go, then the new
/// one is added: the statement does not see its own insert).
///
/// $1 subscription id, $2 event id, $3 claim, $4 when the attempt started, $5 status code,
/// $6 duration (ms), $7 error, $8 how many logged attempts to keep besides this one.
macro_rules! log_attempt {
    () => {
        "\
WITH logged AS (
    INSERT INTO carmy_event_attempts (subscription_id, event_id, at, status, duration_ms, error)
    VALUES ($1, $2, $4, $5, $6, $7)
), trimmed AS (
    DELETE FROM carmy_event_attempts
    WHERE subscription_id = $1 AND id < (
        SELECT min(id) FROM (
            SELECT id FROM carmy_event_attempts WHERE subscription_id = $1
            ORDER BY id DESC LIMIT $8
        ) AS kept
    )
)
"
    };
}

/// Logs an attempt (see [`log_attempt`]), then removes the delivery if the claim $3 still holds
/// it (delivered, or failed for good).
const FINISH_REMOVE: &str = concat!(
    log_attempt!(),
    "\
DELETE FROM carmy_event_deliveries
WHERE event_id = $2 AND subscription_id = $1 AND claim = $3"
);

/// Logs an attempt (see [`log_attempt`]), then, if the claim $3 still holds the delivery,
/// counts the attempt and makes it due again in $9 ms, unclaimed.
const FINISH_RETRY: &str = concat!(
    log_attempt!(),
    "\
UPDATE carmy_event_deliveries
SET attempts = attempts + 1, due = now() + $9::bigint * interval '1 millisecond', claim = NULL
WHERE event_id = $2 AND subscription_id = $1 AND claim = $3"
);

/// The latest $2 attempts to the subscription $1, newest first.
const DELIVERY_ATTEMPTS: &str = "\
SELECT event_id, at, status, duration_ms, error FROM carmy_event_attempts
WHERE subscription_id = $1
ORDER BY id DESC
LIMIT $2";

const PENDING_DELIVERIES: &str = "SELECT count(*) FROM carmy_event_deliveries";

/// The channel on which changes of executions are announced (`NOTIFY`, payload the id).
const ANNOUNCEMENTS: &str = "carmy_executions";

/// Idempotency records in a PostgreSQL table, so that replicas sharing the database never run
/// one request twice. The reservation is one statement (`INSERT … ON CONFLICT DO NOTHING`, or
/// the takeover of an expired record), atomic across replicas;
/// expiry follows the server's clock; each store deletes expired records every minute.
///
/// The schema is created on connect by embedded, versioned migrations, applied under an
/// advisory lock. Every call has the time limits of its [`StoreOptions`]. Changes of executions
/// are announced with `NOTIFY` and heard on one connection of its own (`LISTEN`), so other
/// replicas stream and cancel them as they happen.
///
/// It keeps events too (`protocol.md` §8): subscriptions, the outbox (one row per event and
/// subscription, claimed with `FOR UPDATE SKIP LOCKED` so replicas share the work, due again
/// when a dead replica's lease passes) and the attempt log, in the tables of migration 3.
pub struct PostgresStore {
    pool: Pool,
    options: StoreOptions,
    announcements: Arc<Announcements>,
    _cleanup: Cleanup,
    _listener: AbortOnDropHandle<()>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

fn failed(error: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError(Box::new(error))
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user@host:port/db`), applies the
    /// migrations, and starts the periodic cleanup. Fails if the database cannot be reached.
    ///
    /// TLS follows libpq's `sslmode`, with rustls: `disable` and `prefer` (the default) do not
    /// encrypt; `require` encrypts without checking the certificate; `verify-full` (and
    /// `verify-ca`, which rustls checks as strictly) checks the certificate and the host name
    /// against the platform's root certificates, or those of `sslrootcert=PATH`.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, StoreOptions::new()).await
    }

    /// Like [`PostgresStore::connect`], with time limits and certificates of `options`.
    pub async fn connect_with(url: &str, options: StoreOptions) -> Result<Self, StoreError> {
        Self::open(url, options, CLEANUP_EVERY).await
    }

    /// Like [`PostgresStore::connect`], deleting expired records every `interval`.
    pub async fn connect_with_cleanup(url: &str, interval: Duration) -> Result<Self, StoreError> {
        Self::open(url, StoreOptions::new(), interval).await
    }

    async fn open(
        url: &str,
        options: StoreOptions,
        interval: Duration,
    ) -> Result<Self, StoreError> {
        let (url, options) = options.with_url(url)?;
        let (url, mode) = take_params(&url, &["sslmode"]);
        let mode = mode.last().map_or("prefer", |(_, mode)| mode.as_str());
        let mut config = tokio_postgres::Config::from_str(&url).map_err(failed)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.acquire_timeout);
        }
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let tls = match mode {
            "disable" | "allow" | "prefer" => Tls::Off,
            "require" => {
                config.ssl_mode(SslMode::Require);
                Tls::On(MakeRustlsConnect::new(tls::encrypted_only()?))
            }
            "verify-ca" | "verify-full" => {
                config.ssl_mode(SslMode::Require);
                Tls::On(MakeRustlsConnect::new(tls::verified(
                    &options.root_certificates,
                )?))
            }
            other => {
                return Err(StoreError::message(format!(
                    "`sslmode={other}` in the store URL: expected disable, prefer, require, \
                     verify-ca or verify-full"
                )));
            }
        };
        let manager = tls.manager(config.clone(), manager_config);
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.acquire_timeout))
            .create_timeout(Some(options.acquire_timeout))
            .recycle_timeout(Some(options.acquire_timeout))
            .build()
            .map_err(failed)?;
        let mut client = pool.get().await.map_err(failed)?;
        within(options.command_timeout, async {
            migrate(&mut client).await.map_err(failed)
        })
        .await?;
        drop(client);
        let cleanup = {
            let pool = pool.clone();
            let timeout = options.command_timeout;
            Cleanup::every(interval, move || {
                let pool = pool.clone();
                async move { purge(&pool, timeout).await }
            })
        };
        let announcements = Announcements::new(options.execution_recheck);
        let listen = move || -> BoxFuture<'static, Result<AnnouncedIds, StoreError>> {
            let (config, tls) = (config.clone(), tls.clone());
            Box::pin(within(
                options.acquire_timeout + options.command_timeout,
                async move { tls.listen(&config).await },
            ))
        };
        let listener = announcements.listen(listen().await?, listen);
        Ok(PostgresStore {
            pool,
            options,
            announcements,
            _cleanup: cleanup,
            _listener: listener,
        })
    }
}

/// Whether connections are encrypted (see [`PostgresStore::connect`]).
#[derive(Clone)]
enum Tls {
    Off,
    On(MakeRustlsConnect),
}

impl Tls {
    fn manager(&self, config: tokio_postgres::Config, manager_config: ManagerConfig) -> Manager {
        match self {
            Tls::Off => Manager::from_config(config, NoTls, manager_config),
            Tls::On(tls) => Manager::from_config(config, tls.clone(), manager_config),
        }
    }

    /// A connection of its own that listens for announced executions.
    async fn listen(&self, config: &tokio_postgres::Config) -> Result<AnnouncedIds, StoreError> {
        match self {
            Tls::Off => listen(config, NoTls).await,
            Tls::On(tls) => listen(config, tls.clone()).await,
        }
    }
}

/// Opens a connection, sends `LISTEN`, and yields the announced execution ids until the
/// connection ends.
async fn listen<T>(config: &tokio_postgres::Config, tls: T) -> Result<AnnouncedIds, StoreError>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut connection) = config.connect(tls).await.map_err(failed)?;
    // The connection does its work when polled for messages: poll it while LISTEN runs.
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    let subscribe = format!("LISTEN {ANNOUNCEMENTS}");
    {
        let mut subscribed = std::pin::pin!(client.batch_execute(&subscribe));
        loop {
            tokio::select! {
                done = &mut subscribed => {
                    done.map_err(failed)?;
                    break;
                }
                message = messages.next() => match message {
                    Some(Ok(_)) => {}
                    Some(Err(error)) => return Err(failed(error)),
                    None => return Err(StoreError::message("the listening connection closed")),
                },
            }
        }
    }
    let ids = messages
        // Ends with the connection (an error, or its end); the client lives as long.
        .scan(client, |_, message| std::future::ready(message.ok()))
        .filter_map(|message| {
            std::future::ready(match message {
                AsyncMessage::Notification(notification) => Some(notification.payload().to_owned()),
                _ => None,
            })
        });
    Ok(ids.boxed())
}

/// A pooled connection; the pool's own time limits apply.
async fn client(pool: &Pool) -> Result<deadpool_postgres::Client, StoreError> {
    pool.get().await.map_err(failed)
}

/// Claims `key`, or reads the record that holds it: one statement, run again in the rare case
/// where the record changed under it. No time limit of its own: see [`reserve_within`].
async fn reserve_key(
    pool: Pool,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    execution_id: Arc<str>,
    lease: Duration,
    ttl: Duration,
) -> Result<Reservation, StoreError> {
    let client = client(&pool).await?;
    let reserve = client.prepare_cached(RESERVE).await.map_err(failed)?;
    let digest = fingerprint.digest.as_slice();
    loop {
        let row = client
            .query_opt(
                &reserve,
                &[
                    &key.caller(),
                    &key.request_id(),
                    &&*fingerprint.tool,
                    &digest,
                    &&*execution_id,
                    &millis(lease),
                    &millis(ttl),
                ],
            )
            .await
            .map_err(failed)?;
        let Some(row) = row else { continue };
        if row.try_get("claimed").map_err(failed)? {
            return Ok(Reservation::Reserved);
        }
        let body: Option<Vec<u8>> = row.try_get("body").map_err(failed)?;
        let status: Option<String> = row.try_get("status").map_err(failed)?;
        let found = Found {
            tool: row.try_get("tool").map_err(failed)?,
            digest: row.try_get("digest").map_err(failed)?,
            execution_id: row.try_get("execution_id").map_err(failed)?,
            state: row.try_get("state").map_err(failed)?,
            running_for: Duration::from_millis(
                u64::try_from(row.try_get::<_, i64>("running_ms").map_err(failed)?).unwrap_or(0),
            ),
            response: match (status, body) {
                (Some(status), Some(body)) => Some(Stored {
                    status,
                    category: row.try_get("category").map_err(failed)?,
                    code: row.try_get("code").map_err(failed)?,
                    body,
                }),
                _ => None,
            },
        };
        return found.reservation(&fingerprint);
    }
}

async fn finish_key(
    pool: &Pool,
    key: &IdempotencyKey,
    finish: Finish<'_>,
    ttl: Duration,
) -> Result<(), StoreError> {
    let (state, stored) = Stored::of(finish);
    let client = client(pool).await?;
    let statement = client.prepare_cached(FINISH).await.map_err(failed)?;
    client
        .execute(
            &statement,
            &[
                &key.caller(),
                &key.request_id(),
                &&**finish.execution_id(),
                &state,
                &stored.as_ref().map(|stored| stored.status.as_str()),
                &stored
                    .as_ref()
                    .and_then(|stored| stored.category.as_deref()),
                &stored.as_ref().and_then(|stored| stored.code.as_deref()),
                &stored.as_ref().map(|stored| stored.body.as_slice()),
                &millis(ttl),
            ],
        )
        .await
        .map_err(failed)?;
    Ok(())
}

async fn release_key(
    pool: &Pool,
    key: &IdempotencyKey,
    execution_id: &str,
) -> Result<(), StoreError> {
    let client = client(pool).await?;
    let statement = client.prepare_cached(RELEASE).await.map_err(failed)?;
    client
        .execute(
            &statement,
            &[&key.caller(), &key.request_id(), &execution_id],
        )
        .await
        .map_err(failed)?;
    Ok(())
}

fn event_id(id: u64) -> i64 {
    i64::try_from(id).unwrap_or(i64::MAX)
}

async fn read_execution(
    pool: &Pool,
    caller: &str,
    execution_id: &str,
) -> Result<Option<ExecutionRecord>, StoreError> {
    let client = client(pool).await?;
    let statement = client.prepare_cached(EXECUTION).await.map_err(failed)?;
    let Some(row) = client
        .query_opt(&statement, &[&execution_id, &caller])
        .await
        .map_err(failed)?
    else {
        return Ok(None);
    };
    let events = client
        .prepare_cached(EXECUTION_EVENTS)
        .await
        .map_err(failed)?;
    let progress = client
        .query(&events, &[&execution_id])
        .await
        .map_err(failed)?
        .iter()
        .map(|event| {
            Ok(RecordedEvent {
                id: u64::try_from(event.try_get::<_, i64>("id").map_err(failed)?).unwrap_or(0),
                data: event.try_get::<_, Vec<u8>>("data").map_err(failed)?.into(),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let status: Option<String> = row.try_get("status").map_err(failed)?;
    let body: Option<Vec<u8>> = row.try_get("body").map_err(failed)?;
    let final_event_id: Option<i64> = row.try_get("final_event_id").map_err(failed)?;
    let outcome = match (status, body, final_event_id) {
        (Some(status), Some(body), Some(event_id)) => {
            let stored = Stored {
                status,
                category: row.try_get("category").map_err(failed)?,
                code: row.try_get("code").map_err(failed)?,
                body,
            };
            Some(RecordedOutcome {
                response: stored.response(execution_id)?,
                event_id: u64::try_from(event_id).unwrap_or(0),
            })
        }
        _ => None,
    };
    Ok(Some(ExecutionRecord {
        execution_id: Arc::from(execution_id),
        tool: Arc::from(row.try_get::<_, String>("tool").map_err(failed)?),
        progress,
        outcome,
        cancel_requested: row.try_get("cancel_requested").map_err(failed)?,
    }))
}

async fn list_executions(
    pool: &Pool,
    caller: &str,
    query: &ExecutionQuery,
) -> Result<Vec<ExecutionSummary>, StoreError> {
    let client = client(pool).await?;
    let statement = client.prepare_cached(EXECUTIONS).await.map_err(failed)?;
    let state = query.state.map(ExecutionState::as_str);
    let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
    client
        .query(
            &statement,
            &[&caller, &query.before, &query.tool, &state, &limit],
        )
        .await
        .map_err(failed)?
        .iter()
        .map(|row| {
            let status: Option<String> = row.try_get("status").map_err(failed)?;
            let state = match status {
                None => ExecutionState::Running,
                Some(status) => ExecutionState::from_wire(&status).ok_or_else(|| {
                    StoreError::message(format!("unreadable execution: status `{status}`"))
                })?,
            };
            Ok(ExecutionSummary {
                execution_id: Arc::from(row.try_get::<_, String>("execution_id").map_err(failed)?),
                tool: Arc::from(row.try_get::<_, String>("tool").map_err(failed)?),
                state,
            })
        })
        .collect()
}

/// `time` to the whole millisecond (down): what the stores keep of a time.
fn whole_millis(time: SystemTime) -> SystemTime {
    match time.duration_since(UNIX_EPOCH) {
        Ok(since) => time - Duration::from_nanos(u64::from(since.subsec_nanos() % 1_000_000)),
        Err(_) => time,
    }
}

fn unreadable_event(what: &str) -> StoreError {
    StoreError::message(format!("unreadable event store row: {what}"))
}

/// A row of [`SUBSCRIPTION`] or [`SUBSCRIPTIONS`].
fn read_subscription(row: &tokio_postgres::Row) -> Result<StoredSubscription, StoreError> {
    let previous: Option<Vec<u8>> = row.try_get("previous_secret").map_err(failed)?;
    let until: Option<SystemTime> = row.try_get("previous_secret_until").map_err(failed)?;
    Ok(StoredSubscription {
        id: Arc::from(row.try_get::<_, String>("id").map_err(failed)?),
        url: row.try_get("url").map_err(failed)?,
        event_types: row.try_get("event_types").map_err(failed)?,
        description: row.try_get("description").map_err(failed)?,
        secret: row
            .try_get::<_, Vec<u8>>("secret")
            .map_err(failed)?
            .into_boxed_slice(),
        previous_secret: previous
            .zip(until)
            .map(|(secret, until)| (secret.into_boxed_slice(), until)),
        created_at: row.try_get("created_at").map_err(failed)?,
        disabled_reason: row.try_get("disabled_reason").map_err(failed)?,
        failing_since: row.try_get("failing_since").map_err(failed)?,
    })
}

async fn save_subscription(
    pool: &Pool,
    subscription: &StoredSubscription,
) -> Result<(), StoreError> {
    let client = client(pool).await?;
    let statement = client
        .prepare_cached(SAVE_SUBSCRIPTION)
        .await
        .map_err(failed)?;
    let (previous_secret, previous_until) = match &subscription.previous_secret {
        Some((secret, until)) => (Some(&**secret), Some(whole_millis(*until))),
        None => (None, None),
    };
    client
        .execute(
            &statement,
            &[
                &&*subscription.id,
                &subscription.url,
                &subscription.event_types,
                &subscription.description,
                &&*subscription.secret,
                &previous_secret,
                &previous_until,
                &whole_millis(subscription.created_at),
                &subscription.disabled_reason,
                &subscription.failing_since.map(whole_millis),
            ],
        )
        .await
        .map_err(failed)?;
    Ok(())
}

async fn claim_deliveries(
    pool: &Pool,
    limit: usize,
    lease: Duration,
) -> Result<Vec<ClaimedDelivery>, StoreError> {
    let limit = limit.min(CLAIM_BATCH);
    if limit == 0 {
        return Ok(Vec::new());
    }
    let tokens: Vec<String> = (0..limit)
        .map(|_| uuid::Uuid::now_v7().to_string())
        .collect();
    let client = client(pool).await?;
    let statement = client
        .prepare_cached(CLAIM_DELIVERIES)
        .await
        .map_err(failed)?;
    let rows = client
        .query(
            &statement,
            &[
                &i64::try_from(limit).unwrap_or(i64::MAX),
                &millis(lease),
                &tokens,
            ],
        )
        .await
        .map_err(failed)?;
    let mut claimed = rows
        .iter()
        .map(|row| {
            let place: i64 = row.try_get("n").map_err(failed)?;
            let attempts: i32 = row.try_get("attempts").map_err(failed)?;
            let delivery = ClaimedDelivery {
                subscription_id: Arc::from(
                    row.try_get::<_, String>("subscription_id")
                        .map_err(failed)?,
                ),
                event: OutboxEvent {
                    event_id: Arc::from(row.try_get::<_, String>("event_id").map_err(failed)?),
                    event_type: Arc::from(row.try_get::<_, String>("event_type").map_err(failed)?),
                    body: row.try_get::<_, Vec<u8>>("body").map_err(failed)?.into(),
                },
                attempts: u32::try_from(attempts).map_err(|_| unreadable_event("attempts"))?,
                claim: Arc::from(row.try_get::<_, String>("claim").map_err(failed)?),
            };
            Ok((place, delivery))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    claimed.sort_by_key(|(place, _)| *place);
    Ok(claimed.into_iter().map(|(_, delivery)| delivery).collect())
}

async fn finish_attempt(
    pool: &Pool,
    claimed: &ClaimedDelivery,
    attempt: &DeliveryAttempt,
    after: AfterAttempt,
) -> Result<(), StoreError> {
    let client = client(pool).await?;
    let (sql, delay) = match after {
        AfterAttempt::Delivered | AfterAttempt::Failed => (FINISH_REMOVE, None),
        AfterAttempt::RetryIn(delay) => (FINISH_RETRY, Some(millis(delay))),
    };
    let statement = client.prepare_cached(sql).await.map_err(failed)?;
    let kept_besides = i64::try_from(KEPT_ATTEMPTS.saturating_sub(1)).unwrap_or(i64::MAX);
    let at = whole_millis(attempt.at);
    let status = attempt.status.map(i32::from);
    let duration = millis(attempt.duration);
    let (subscription_id, event_id, claim): (&str, &str, &str) = (
        &claimed.subscription_id,
        &claimed.event.event_id,
        &claimed.claim,
    );
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
        &subscription_id,
        &event_id,
        &claim,
        &at,
        &status,
        &duration,
        &attempt.error,
        &kept_besides,
    ];
    if let Some(delay) = &delay {
        params.push(delay);
    }
    client.execute(&statement, &params).await.map_err(failed)?;
    Ok(())
}

async fn delivery_attempts(
    pool: &Pool,
    subscription_id: &str,
    limit: usize,
) -> Result<Vec<DeliveryAttempt>, StoreError> {
    let client = client(pool).await?;
    let statement = client
        .prepare_cached(DELIVERY_ATTEMPTS)
        .await
        .map_err(failed)?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    client
        .query(&statement, &[&subscription_id, &limit])
        .await
        .map_err(failed)?
        .iter()
        .map(|row| {
            let status: Option<i32> = row.try_get("status").map_err(failed)?;
            let duration: i64 = row.try_get("duration_ms").map_err(failed)?;
            Ok(DeliveryAttempt {
                event_id: Arc::from(row.try_get::<_, String>("event_id").map_err(failed)?),
                at: row.try_get("at").map_err(failed)?,
                status: status
                    .map(u16::try_from)
                    .transpose()
                    .map_err(|_| unreadable_event("status"))?,
                duration: Duration::from_millis(
                    u64::try_from(duration).map_err(|_| unreadable_event("duration"))?,
                ),
                error: row.try_get("error").map_err(failed)?,
            })
        })
        .collect()
}

/// Applies the migrations not yet applied, holding the advisory lock.
async fn migrate(client: &mut deadpool_postgres::Client) -> Result<(), tokio_postgres::Error> {
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

/// Deletes every expired record, a batch per statement of at most `timeout`.
async fn purge(pool: &Pool, timeout: Duration) -> Result<usize, StoreError> {
    Ok(purge_with(pool, timeout, PURGE_BATCH).await?
        + purge_with(pool, timeout, PURGE_EXECUTIONS).await?)
}

/// Runs the batch deletion `sql` until a batch deletes fewer than a full one.
async fn purge_with(pool: &Pool, timeout: Duration, sql: &str) -> Result<usize, StoreError> {
    let client = client(pool).await?;
    let statement = within(timeout, async {
        client.prepare_cached(sql).await.map_err(failed)
    })
    .await?;
    let mut purged = 0;
    loop {
        let deleted = within(timeout, async {
            client
                .execute(&statement, &[&CLEANUP_BATCH])
                .await
                .map_err(failed)
        })
        .await?;
        purged += usize::try_from(deleted).unwrap_or(usize::MAX);
        if deleted < CLEANUP_BATCH.unsigned_abs() {
            return Ok(purged);
        }
    }
}

impl IdempotencyStore for PostgresStore {
    fn reserve<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        execution_id: &'a Arc<str>,
        lease: Duration,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        let reserve = reserve_key(
            self.pool.clone(),
            key.clone(),
            fingerprint.clone(),
            Arc::clone(execution_id),
            lease,
            ttl,
        );
        let (pool, key, execution_id, timeout) = (
            self.pool.clone(),
            key.clone(),
            Arc::clone(execution_id),
            self.options.command_timeout,
        );
        let undo = move || {
            let (pool, key, execution_id) = (pool.clone(), key.clone(), Arc::clone(&execution_id));
            async move { within(timeout, release_key(&pool, &key, &execution_id)).await }
        };
        Box::pin(reserve_within(
            self.options.command_timeout,
            lease,
            reserve,
            undo,
        ))
    }

    fn finish<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        finish: Finish<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            within(
                self.options.command_timeout,
                finish_key(&self.pool, key, finish, ttl),
            )
            .await
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(
            self.options.command_timeout,
            release_key(&self.pool, key, execution_id),
        ))
    }

    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(purge(&self.pool, self.options.command_timeout))
    }

    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        Some(Box::pin(within(self.options.command_timeout, async move {
            client(&self.pool)
                .await?
                .simple_query("SELECT 1")
                .await
                .map_err(failed)?;
            Ok(())
        })))
    }

    fn keeps_executions(&self) -> bool {
        true
    }

    fn begin_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a Arc<str>,
        tool: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(self.options.command_timeout, async move {
            let client = client(&self.pool).await?;
            let statement = client
                .prepare_cached(BEGIN_EXECUTION)
                .await
                .map_err(failed)?;
            client
                .execute(
                    &statement,
                    &[&&**execution_id, &caller, &tool, &millis(lease)],
                )
                .await
                .map_err(failed)?;
            Ok(())
        }))
    }

    fn record_progress<'a>(
        &'a self,
        execution_id: &'a str,
        event: RecordedEvent,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(self.options.command_timeout, async move {
            let client = client(&self.pool).await?;
            let statement = client
                .prepare_cached(RECORD_PROGRESS)
                .await
                .map_err(failed)?;
            let kept = i64::try_from(KEPT_PROGRESS).unwrap_or(i64::MAX);
            client
                .execute(
                    &statement,
                    &[
                        &execution_id,
                        &event_id(event.id),
                        &event.data.as_ref(),
                        &kept,
                    ],
                )
                .await
                .map_err(failed)?;
            Ok(())
        }))
    }

    fn end_execution<'a>(
        &'a self,
        execution_id: &'a str,
        outcome: RecordedOutcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(self.options.command_timeout, async move {
            let (_, stored) = Stored::of(Finish::Response(&outcome.response));
            let stored =
                stored.ok_or_else(|| StoreError::message("an ended execution has a response"))?;
            let client = client(&self.pool).await?;
            let statement = client.prepare_cached(END_EXECUTION).await.map_err(failed)?;
            client
                .execute(
                    &statement,
                    &[
                        &execution_id,
                        &stored.status,
                        &stored.category,
                        &stored.code,
                        &stored.body,
                        &event_id(outcome.event_id),
                        &millis(ttl),
                    ],
                )
                .await
                .map_err(failed)?;
            Ok(())
        }))
    }

    fn execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ExecutionRecord>, StoreError>> {
        Box::pin(within(
            self.options.command_timeout,
            read_execution(&self.pool, caller, execution_id),
        ))
    }

    fn executions<'a>(
        &'a self,
        caller: &'a str,
        query: &'a ExecutionQuery,
    ) -> BoxFuture<'a, Result<Vec<ExecutionSummary>, StoreError>> {
        Box::pin(within(
            self.options.command_timeout,
            list_executions(&self.pool, caller, query),
        ))
    }

    fn cancel_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Cancellation, StoreError>> {
        Box::pin(within(self.options.command_timeout, async move {
            let client = client(&self.pool).await?;
            let statement = client
                .prepare_cached(CANCEL_EXECUTION)
                .await
                .map_err(failed)?;
            let row = client
                .query_one(&statement, &[&execution_id, &caller])
                .await
                .map_err(failed)?;
            let requested: bool = row.try_get("requested").map_err(failed)?;
            let ended: bool = row.try_get("ended").map_err(failed)?;
            Ok(if requested {
                Cancellation::Requested
            } else if ended {
                Cancellation::Ended
            } else {
                Cancellation::NotFound
            })
        }))
    }

    fn execution_changed(&self, execution_id: &str) -> BoxFuture<'static, ()> {
        self.announcements.changed(execution_id)
    }

    fn keeps_events(&self) -> bool {
        true
    }

    fn save_subscription<'a>(
        &'a self,
        subscription: &'a StoredSubscription,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(
            self.options.command_timeout,
            save_subscription(&self.pool, subscription),
        ))
    }

    fn subscription<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredSubscription>, StoreError>> {
        Box::pin(within(self.options.command_timeout, async move {
            let client = client(&self.pool).await?;
            let statement = client.prepare_cached(SUBSCRIPTION).await.map_err(failed)?;
            client
                .query_opt(&statement, &[&id])
                .await
                .map_err(failed)?
                .as_ref()
                .map(read_subscription)
                .transpose()
        }))
    }

    fn subscriptions(&self) -> BoxFuture<'_, Result<Vec<StoredSubscription>, StoreError>> {
        Box::pin(within(self.options.command_timeout, async move {
            let client = client(&self.pool).await?;
            let statement = client.prepare_cached(SUBSCRIPTIONS).await.map_err(failed)?;
            client
                .query(&statement, &[])
                .await
                .map_err(failed)?
                .iter()
                .map(read_subscription)
                .collect()
        }))
    }

    fn delete_subscription<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(within(self.options.command_timeout, async move {
            let client = client(&self.pool).await?;
            let statement = client
                .prepare_cached(DELETE_SUBSCRIPTION)
                .await
                .map_err(failed)?;
            let deleted = client.execute(&statement, &[&id]).await.map_err(failed)?;
            Ok(deleted > 0)
        }))
    }

    fn enqueue_event<'a>(
        &'a self,
        event: &'a OutboxEvent,
        subscription_ids: &'a [Arc<str>],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(self.options.command_timeout, async move {
            if subscription_ids.is_empty() {
                return Ok(());
            }
            let client = client(&self.pool).await?;
            let statement = client.prepare_cached(ENQUEUE_EVENT).await.map_err(failed)?;
            let subscriptions: Vec<&str> = subscription_ids.iter().map(|id| &**id).collect();
            client
                .execute(
                    &statement,
                    &[
                        &&*event.event_id,
                        &&*event.event_type,
                        &event.body.as_ref(),
                        &subscriptions,
                    ],
                )
                .await
                .map_err(failed)?;
            Ok(())
        }))
    }

    fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<ClaimedDelivery>, StoreError>> {
        Box::pin(within(
            self.options.command_timeout,
            claim_deliveries(&self.pool, limit, lease),
        ))
    }

    fn finish_attempt<'a>(
        &'a self,
        claimed: &'a ClaimedDelivery,
        attempt: &'a DeliveryAttempt,
        after: AfterAttempt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(
            self.options.command_timeout,
            finish_attempt(&self.pool, claimed, attempt, after),
        ))
    }

    fn delivery_attempts<'a>(
        &'a self,
        subscription_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeliveryAttempt>, StoreError>> {
        Box::pin(within(
            self.options.command_timeout,
            delivery_attempts(&self.pool, subscription_id, limit),
        ))
    }

    fn pending_deliveries(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(within(self.options.command_timeout, async move {
            let client = client(&self.pool).await?;
            let statement = client
                .prepare_cached(PENDING_DELIVERIES)
                .await
                .map_err(failed)?;
            let count: i64 = client
                .query_one(&statement, &[])
                .await
                .map_err(failed)?
                .try_get(0)
                .map_err(failed)?;
            Ok(usize::try_from(count).unwrap_or(usize::MAX))
        }))
    }
}
