//! The PostgreSQL engine's events: subscriptions, the outbox (one row per event and
//! subscription, claimed with `FOR UPDATE SKIP LOCKED`) and the attempt log.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::Pool;
use futures_util::future::BoxFuture;

use super::{PostgresStore, client, failed, millis};
use crate::store::record::within;
use crate::store::{
    AfterAttempt, ClaimedDelivery, DeliveryAttempt, EventStore, KEPT_ATTEMPTS, OutboxEvent,
    StoreError, StoredSubscription,
};

/// Deliveries claimed per call at most (each gets a claim token made here).
const CLAIM_BATCH: usize = 1_000;

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

impl EventStore for PostgresStore {
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

    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        Some(self.answers())
    }
}
