//! The Redis engine's events (`protocol.md` §8), under one hash tag (one cluster slot):
//! subscriptions in hashes indexed by creation time, the outbox as delivery hashes and a sorted
//! set by due time, and each subscription's attempt log in a list.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;

use super::{Inner, RedisStore, failed};
use crate::store::record::within;
use crate::store::{
    AfterAttempt, ClaimedDelivery, DeliveryAttempt, EventStore, KEPT_ATTEMPTS, OutboxEvent,
    StoreError, StoredSubscription,
};

/// The outbox's keys (`protocol.md` §8) share one hash tag, so every outbox script touches one
/// cluster slot.
const OUTBOX: &str = "carmy:outbox:{events}:";

/// Deliveries claimed per call at most (each gets a claim token made here).
const CLAIM_BATCH: usize = 1_000;

/// The deliveries by due time (ms): a sorted set of delivery ids.
fn due_key() -> String {
    format!("{OUTBOX}due")
}

/// The subscriptions by creation time (ms), then id: a sorted set of ids.
fn subscriptions_key() -> String {
    format!("{OUTBOX}subscriptions")
}

/// A subscription's hash.
fn subscription_key(id: &str) -> String {
    format!("{OUTBOX}subscription:{id}")
}

/// A subscription's deliveries: a set of delivery ids.
fn deliveries_of_key(subscription_id: &str) -> String {
    format!("{OUTBOX}deliveries-of:{subscription_id}")
}

/// A subscription's latest attempts, newest first: a list.
fn attempts_key(subscription_id: &str) -> String {
    format!("{OUTBOX}attempts:{subscription_id}")
}

/// A delivery's id; the length prefix keeps the event and subscription ids apart whatever
/// they contain.
fn delivery_id(event_id: &str, subscription_id: &str) -> String {
    format!("{}:{event_id}:{subscription_id}", event_id.len())
}

/// A delivery's hash.
fn delivery_key(delivery_id: &str) -> String {
    format!("{OUTBOX}delivery:{delivery_id}")
}

/// A duration in whole milliseconds, zero included (a retry due at once).
fn whole_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch (negative before it).
fn epoch_millis(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_millis()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

fn epoch_time(millis: i64) -> SystemTime {
    let offset = Duration::from_millis(millis.unsigned_abs());
    if millis >= 0 {
        UNIX_EPOCH + offset
    } else {
        UNIX_EPOCH - offset
    }
}

/// An attempt as the log keeps it (JSON).
#[derive(serde::Serialize, serde::Deserialize)]
struct LoggedAttempt {
    event_id: String,
    at_ms: i64,
    status: Option<u16>,
    duration_ms: u64,
    error: Option<String>,
}

fn unreadable_event(what: &str) -> StoreError {
    StoreError::message(format!("unreadable event store entry: {what}"))
}

/// The fields of a subscription's hash.
fn subscription_fields(subscription: &StoredSubscription) -> Vec<(&'static str, Vec<u8>)> {
    let mut fields = vec![
        ("url", subscription.url.clone().into_bytes()),
        (
            "event_types",
            serde_json::to_vec(&subscription.event_types).unwrap_or_default(),
        ),
        ("secret", subscription.secret.to_vec()),
        (
            "created_at",
            epoch_millis(subscription.created_at)
                .to_string()
                .into_bytes(),
        ),
    ];
    if let Some(description) = &subscription.description {
        fields.push(("description", description.clone().into_bytes()));
    }
    if let Some((secret, until)) = &subscription.previous_secret {
        fields.push(("previous_secret", secret.to_vec()));
        fields.push((
            "previous_secret_until",
            epoch_millis(*until).to_string().into_bytes(),
        ));
    }
    if let Some(reason) = &subscription.disabled_reason {
        fields.push(("disabled_reason", reason.clone().into_bytes()));
    }
    if let Some(since) = subscription.failing_since {
        fields.push((
            "failing_since",
            epoch_millis(since).to_string().into_bytes(),
        ));
    }
    fields
}

/// A subscription from its hash's fields.
fn read_subscription(
    id: &str,
    mut fields: HashMap<String, Vec<u8>>,
) -> Result<StoredSubscription, StoreError> {
    let mut text = |name: &str| -> Result<Option<String>, StoreError> {
        fields
            .remove(name)
            .map(|bytes| String::from_utf8(bytes).map_err(|_| unreadable_event(name)))
            .transpose()
    };
    let time = |value: Option<String>, name: &str| -> Result<Option<SystemTime>, StoreError> {
        value
            .map(|value| {
                value
                    .parse()
                    .map(epoch_time)
                    .map_err(|_| unreadable_event(name))
            })
            .transpose()
    };
    let url = text("url")?.ok_or_else(|| unreadable_event("url"))?;
    let event_types = text("event_types")?.ok_or_else(|| unreadable_event("event_types"))?;
    let description = text("description")?;
    let created_at =
        time(text("created_at")?, "created_at")?.ok_or_else(|| unreadable_event("created_at"))?;
    let previous_until = time(text("previous_secret_until")?, "previous_secret_until")?;
    let disabled_reason = text("disabled_reason")?;
    let failing_since = time(text("failing_since")?, "failing_since")?;
    Ok(StoredSubscription {
        id: Arc::from(id),
        url,
        event_types: serde_json::from_str(&event_types)
            .map_err(|_| unreadable_event("event_types"))?,
        description,
        secret: fields
            .remove("secret")
            .ok_or_else(|| unreadable_event("secret"))?
            .into_boxed_slice(),
        previous_secret: fields
            .remove("previous_secret")
            .zip(previous_until)
            .map(|(secret, until)| (secret.into_boxed_slice(), until)),
        created_at,
        disabled_reason,
        failing_since,
    })
}

fn from_value<T: redis::FromRedisValue>(value: redis::Value) -> Result<T, StoreError> {
    redis::from_redis_value(value).map_err(StoreError::new)
}

impl Inner {
    async fn save_subscription(&self, subscription: &StoredSubscription) -> Result<(), StoreError> {
        let mut invocation = self
            .save_subscription
            .key(subscription_key(&subscription.id));
        invocation
            .key(subscriptions_key())
            .arg(&*subscription.id)
            .arg(epoch_millis(subscription.created_at));
        for (name, value) in subscription_fields(subscription) {
            invocation.arg(name).arg(value);
        }
        let _: i64 = invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        Ok(())
    }

    async fn subscription(&self, id: &str) -> Result<Option<StoredSubscription>, StoreError> {
        let fields: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
            .arg(subscription_key(id))
            .query_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        if fields.is_empty() {
            return Ok(None);
        }
        read_subscription(id, fields).map(Some)
    }

    async fn subscriptions(&self) -> Result<Vec<StoredSubscription>, StoreError> {
        let reply: Vec<redis::Value> = self
            .subscriptions
            .key(subscriptions_key())
            .arg(subscription_key(""))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        let mut found = Vec::with_capacity(reply.len() / 2);
        let mut entries = reply.into_iter();
        while let (Some(id), Some(fields)) = (entries.next(), entries.next()) {
            let id: String = from_value(id)?;
            found.push(read_subscription(&id, from_value(fields)?)?);
        }
        Ok(found)
    }

    async fn delete_subscription(&self, id: &str) -> Result<bool, StoreError> {
        let deleted: i64 = self
            .delete_subscription
            .key(subscription_key(id))
            .key(subscriptions_key())
            .key(deliveries_of_key(id))
            .key(attempts_key(id))
            .key(due_key())
            .arg(id)
            .arg(delivery_key(""))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        Ok(deleted > 0)
    }

    async fn enqueue_event(
        &self,
        event: &OutboxEvent,
        subscription_ids: &[Arc<str>],
    ) -> Result<(), StoreError> {
        if subscription_ids.is_empty() {
            return Ok(());
        }
        let mut invocation = self.enqueue_event.key(due_key());
        invocation
            .arg(delivery_key(""))
            .arg(deliveries_of_key(""))
            .arg(&*event.event_id)
            .arg(&*event.event_type)
            .arg(event.body.as_ref());
        for subscription_id in subscription_ids {
            invocation
                .arg(&**subscription_id)
                .arg(delivery_id(&event.event_id, subscription_id));
        }
        let _: i64 = invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        Ok(())
    }

    async fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let limit = limit.min(CLAIM_BATCH);
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut invocation = self.claim_deliveries.key(due_key());
        invocation
            .arg(limit)
            .arg(whole_millis(lease))
            .arg(delivery_key(""));
        for _ in 0..limit {
            invocation.arg(uuid::Uuid::now_v7().to_string());
        }
        let reply: Vec<Vec<Vec<u8>>> = invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        reply
            .into_iter()
            .map(|claim| {
                let [subscription_id, event_id, event_type, body, attempts, token] =
                    <[Vec<u8>; 6]>::try_from(claim).map_err(|_| unreadable_event("claim"))?;
                let text = |bytes: Vec<u8>, name: &str| {
                    String::from_utf8(bytes).map_err(|_| unreadable_event(name))
                };
                Ok(ClaimedDelivery {
                    subscription_id: Arc::from(text(subscription_id, "subscription_id")?),
                    event: OutboxEvent {
                        event_id: Arc::from(text(event_id, "event_id")?),
                        event_type: Arc::from(text(event_type, "event_type")?),
                        body: body.into(),
                    },
                    attempts: text(attempts, "attempts")?
                        .parse()
                        .map_err(|_| unreadable_event("attempts"))?,
                    claim: Arc::from(text(token, "claim")?),
                })
            })
            .collect()
    }

    async fn finish_attempt(
        &self,
        claimed: &ClaimedDelivery,
        attempt: &DeliveryAttempt,
        after: AfterAttempt,
    ) -> Result<(), StoreError> {
        let delivery = delivery_id(&claimed.event.event_id, &claimed.subscription_id);
        let logged = serde_json::to_vec(&LoggedAttempt {
            event_id: attempt.event_id.to_string(),
            at_ms: epoch_millis(attempt.at),
            status: attempt.status,
            duration_ms: whole_millis(attempt.duration),
            error: attempt.error.clone(),
        })
        .map_err(StoreError::new)?;
        let (action, delay) = match after {
            AfterAttempt::Delivered | AfterAttempt::Failed => ("remove", 0),
            AfterAttempt::RetryIn(delay) => ("retry", whole_millis(delay)),
        };
        let _: i64 = self
            .finish_attempt
            .key(delivery_key(&delivery))
            .key(due_key())
            .key(deliveries_of_key(&claimed.subscription_id))
            .key(attempts_key(&claimed.subscription_id))
            .arg(&delivery)
            .arg(&*claimed.claim)
            .arg(logged)
            .arg(KEPT_ATTEMPTS)
            .arg(action)
            .arg(delay)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        Ok(())
    }

    async fn delivery_attempts(
        &self,
        subscription_id: &str,
        limit: usize,
    ) -> Result<Vec<DeliveryAttempt>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let last = isize::try_from(limit - 1).unwrap_or(isize::MAX);
        let entries: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(attempts_key(subscription_id))
            .arg(0)
            .arg(last)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        entries
            .iter()
            .map(|entry| {
                let logged: LoggedAttempt =
                    serde_json::from_slice(entry).map_err(|_| unreadable_event("attempt"))?;
                Ok(DeliveryAttempt {
                    event_id: Arc::from(logged.event_id),
                    at: epoch_time(logged.at_ms),
                    status: logged.status,
                    duration: Duration::from_millis(logged.duration_ms),
                    error: logged.error,
                })
            })
            .collect()
    }
}

impl EventStore for RedisStore {
    fn save_subscription<'a>(
        &'a self,
        subscription: &'a StoredSubscription,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.save_subscription(subscription),
        ))
    }

    fn subscription<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredSubscription>, StoreError>> {
        Box::pin(within(self.timeout, self.inner.subscription(id)))
    }

    fn subscriptions(&self) -> BoxFuture<'_, Result<Vec<StoredSubscription>, StoreError>> {
        Box::pin(within(self.timeout, self.inner.subscriptions()))
    }

    fn delete_subscription<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(within(self.timeout, self.inner.delete_subscription(id)))
    }

    fn enqueue_event<'a>(
        &'a self,
        event: &'a OutboxEvent,
        subscription_ids: &'a [Arc<str>],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.enqueue_event(event, subscription_ids),
        ))
    }

    fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<ClaimedDelivery>, StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.claim_deliveries(limit, lease),
        ))
    }

    fn finish_attempt<'a>(
        &'a self,
        claimed: &'a ClaimedDelivery,
        attempt: &'a DeliveryAttempt,
        after: AfterAttempt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.finish_attempt(claimed, attempt, after),
        ))
    }

    fn delivery_attempts<'a>(
        &'a self,
        subscription_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeliveryAttempt>, StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.delivery_attempts(subscription_id, limit),
        ))
    }

    fn pending_deliveries(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(within(self.timeout, async move {
            redis::cmd("ZCARD")
                .arg(due_key())
                .query_async(&mut self.inner.connection.clone())
                .await
                .map_err(failed)
        }))
    }

    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        Some(self.answers())
    }
}
