//! The PostgreSQL engine's executions: a row each, their progress in a table of events; every
//! change announced (`NOTIFY`) in the statement that makes it.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use futures_util::future::BoxFuture;

use super::{PostgresStore, client, failed, millis};
use crate::store::record::{Stored, within};
use crate::store::{
    Cancellation, ExecutionQuery, ExecutionRecord, ExecutionState, ExecutionStore,
    ExecutionSummary, Finish, KEPT_PROGRESS, RecordedEvent, RecordedOutcome, StoreError,
};

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

pub(super) const PURGE_EXECUTIONS: &str = "\
DELETE FROM carmy_executions
WHERE execution_id IN (
    SELECT execution_id FROM carmy_executions
    WHERE expires_at < now()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)";

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

impl ExecutionStore for PostgresStore {
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

    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        Some(self.answers())
    }
}
