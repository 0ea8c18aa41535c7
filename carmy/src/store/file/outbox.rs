//! The file store's events (`protocol.md` §8): subscriptions, the outbox and the attempt logs,
//! each in a table of its own, changed in durable write transactions like the records.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use redb::{
    Durability, ReadTransaction, ReadableTable, ReadableTableMetadata, TableDefinition,
    WriteTransaction,
};

use super::{Decoder, Encoder, FileStore, epoch_ms, failed, from_epoch_ms, millis, now_ms};
use crate::store::outbox::new_claim;
use crate::store::{
    AfterAttempt, ClaimedDelivery, DeliveryAttempt, EventStore, KEPT_ATTEMPTS, OutboxEvent,
    StoreError, StoredSubscription,
};

/// Subscription id → the encoded subscription.
const SUBSCRIPTIONS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("carmy_subscriptions");
/// (subscription id, event id) → the encoded delivery.
const DELIVERIES: TableDefinition<'_, (&str, &str), &[u8]> =
    TableDefinition::new("carmy_deliveries");
/// (due, subscription id, event id) of every delivery: the order they are claimed in.
const DUE: TableDefinition<'_, (u64, &str, &str), ()> = TableDefinition::new("carmy_due");
/// (subscription id, sequence) → the encoded attempt; the highest sequence is the newest.
const ATTEMPTS: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("carmy_attempts");

pub(super) fn create_tables(transaction: &WriteTransaction) -> Result<(), StoreError> {
    transaction.open_table(SUBSCRIPTIONS).map_err(failed)?;
    transaction.open_table(DELIVERIES).map_err(failed)?;
    transaction.open_table(DUE).map_err(failed)?;
    transaction.open_table(ATTEMPTS).map_err(failed)?;
    Ok(())
}

fn unreadable(what: &str) -> StoreError {
    StoreError::message(format!("unreadable {what} in the store file"))
}

fn encode_subscription(subscription: &StoredSubscription) -> Vec<u8> {
    let mut out = Encoder::new();
    out.field(Some(subscription.id.as_bytes()));
    out.field(Some(subscription.url.as_bytes()));
    out.number(subscription.event_types.len() as u64);
    for event_type in &subscription.event_types {
        out.field(Some(event_type.as_bytes()));
    }
    out.field(subscription.description.as_deref().map(str::as_bytes));
    out.field(Some(&subscription.secret));
    let previous = subscription.previous_secret.as_ref();
    out.field(previous.map(|(secret, _)| &**secret));
    out.optional_number(previous.map(|(_, until)| epoch_ms(*until)));
    out.number(epoch_ms(subscription.created_at));
    out.field(subscription.disabled_reason.as_deref().map(str::as_bytes));
    out.optional_number(subscription.failing_since.map(epoch_ms));
    out.0
}

fn decode_subscription(bytes: &[u8]) -> Option<StoredSubscription> {
    let mut input = Decoder::new(bytes)?;
    let id = input.text()??;
    let url = input.text()??;
    let event_types = (0..input.number()?)
        .map(|_| input.text()?)
        .collect::<Option<Vec<_>>>()?;
    let description = input.text()?;
    let secret = input.field()??.into();
    let previous_secret = match (input.field()?, input.optional_number()?) {
        (Some(secret), Some(until)) => Some((secret.into(), from_epoch_ms(until))),
        (None, None) => None,
        _ => return None,
    };
    Some(StoredSubscription {
        id: Arc::from(id),
        url,
        event_types,
        description,
        secret,
        previous_secret,
        created_at: from_epoch_ms(input.number()?),
        disabled_reason: input.text()?,
        failing_since: input.optional_number()?.map(from_epoch_ms),
    })
}

/// A delivery as the file keeps it (its ids are its key).
struct Delivery {
    event_type: String,
    body: Vec<u8>,
    attempts: u32,
    /// When it may be claimed (ms since the epoch): its next attempt, or the end of its
    /// claim's lease.
    due: u64,
    claim: Option<String>,
}

impl Delivery {
    fn encode(&self) -> Vec<u8> {
        let mut out = Encoder::new();
        out.number(self.attempts.into());
        out.number(self.due);
        out.field(self.claim.as_deref().map(str::as_bytes));
        out.field(Some(self.event_type.as_bytes()));
        out.field(Some(&self.body));
        out.0
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let mut input = Decoder::new(bytes)?;
        Some(Delivery {
            attempts: u32::try_from(input.number()?).ok()?,
            due: input.number()?,
            claim: input.text()?,
            event_type: input.text()??,
            body: input.field()??.to_vec(),
        })
    }
}

fn encode_attempt(attempt: &DeliveryAttempt) -> Vec<u8> {
    let mut out = Encoder::new();
    out.number(epoch_ms(attempt.at));
    out.number(millis(attempt.duration));
    out.optional_number(attempt.status.map(u64::from));
    out.field(Some(attempt.event_id.as_bytes()));
    out.field(attempt.error.as_deref().map(str::as_bytes));
    out.0
}

fn decode_attempt(bytes: &[u8]) -> Option<DeliveryAttempt> {
    let mut input = Decoder::new(bytes)?;
    Some(DeliveryAttempt {
        at: from_epoch_ms(input.number()?),
        duration: Duration::from_millis(input.number()?),
        status: match input.optional_number()? {
            Some(status) => Some(u16::try_from(status).ok()?),
            None => None,
        },
        event_id: Arc::from(input.text()??),
        error: input.text()?,
    })
}

fn read_delivery(
    table: &impl ReadableTable<(&'static str, &'static str), &'static [u8]>,
    key: (&str, &str),
) -> Result<Option<Delivery>, StoreError> {
    match table.get(key).map_err(failed)? {
        Some(bytes) => Delivery::decode(bytes.value())
            .map(Some)
            .ok_or_else(|| unreadable("delivery")),
        None => Ok(None),
    }
}

fn save_subscription(
    transaction: &WriteTransaction,
    subscription: &StoredSubscription,
) -> Result<(), StoreError> {
    let mut table = transaction.open_table(SUBSCRIPTIONS).map_err(failed)?;
    table
        .insert(
            &*subscription.id,
            encode_subscription(subscription).as_slice(),
        )
        .map_err(failed)?;
    Ok(())
}

fn subscription(
    transaction: &ReadTransaction,
    id: &str,
) -> Result<Option<StoredSubscription>, StoreError> {
    let table = transaction.open_table(SUBSCRIPTIONS).map_err(failed)?;
    match table.get(id).map_err(failed)? {
        Some(bytes) => decode_subscription(bytes.value())
            .map(Some)
            .ok_or_else(|| unreadable("subscription")),
        None => Ok(None),
    }
}

/// Oldest first (ties by id).
fn subscriptions(transaction: &ReadTransaction) -> Result<Vec<StoredSubscription>, StoreError> {
    let table = transaction.open_table(SUBSCRIPTIONS).map_err(failed)?;
    let mut all = table
        .iter()
        .map_err(failed)?
        .map(|entry| {
            let (_, bytes) = entry.map_err(failed)?;
            decode_subscription(bytes.value()).ok_or_else(|| unreadable("subscription"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    Ok(all)
}

fn delete_subscription(transaction: &WriteTransaction, id: &str) -> Result<bool, StoreError> {
    let existed = transaction
        .open_table(SUBSCRIPTIONS)
        .map_err(failed)?
        .remove(id)
        .map_err(failed)?
        .is_some();
    let mut deliveries = transaction.open_table(DELIVERIES).map_err(failed)?;
    let mut gone = Vec::new();
    for entry in deliveries.range((id, "")..).map_err(failed)? {
        let (key, bytes) = entry.map_err(failed)?;
        let (subscription_id, event_id) = key.value();
        if subscription_id != id {
            break;
        }
        let delivery = Delivery::decode(bytes.value()).ok_or_else(|| unreadable("delivery"))?;
        gone.push((event_id.to_owned(), delivery.due));
    }
    let mut due = transaction.open_table(DUE).map_err(failed)?;
    for (event_id, due_at) in &gone {
        deliveries.remove((id, event_id.as_str())).map_err(failed)?;
        due.remove((*due_at, id, event_id.as_str()))
            .map_err(failed)?;
    }
    transaction
        .open_table(ATTEMPTS)
        .map_err(failed)?
        .retain_in((id, 0)..=(id, u64::MAX), |_, _| false)
        .map_err(failed)?;
    Ok(existed)
}

/// A delivery of the same event to the same subscription is written once.
fn enqueue_event(
    transaction: &WriteTransaction,
    event: &OutboxEvent,
    subscription_ids: &[Arc<str>],
    now: u64,
) -> Result<(), StoreError> {
    let mut deliveries = transaction.open_table(DELIVERIES).map_err(failed)?;
    let mut due = transaction.open_table(DUE).map_err(failed)?;
    let delivery = Delivery {
        event_type: event.event_type.to_string(),
        body: event.body.to_vec(),
        attempts: 0,
        due: now,
        claim: None,
    }
    .encode();
    for subscription_id in subscription_ids {
        let key = (&**subscription_id, &*event.event_id);
        if deliveries.get(key).map_err(failed)?.is_some() {
            continue;
        }
        deliveries
            .insert(key, delivery.as_slice())
            .map_err(failed)?;
        due.insert((now, key.0, key.1), ()).map_err(failed)?;
    }
    Ok(())
}

/// Whether a delivery is due at `now`.
fn any_due(transaction: &ReadTransaction, now: u64) -> Result<bool, StoreError> {
    let due = transaction.open_table(DUE).map_err(failed)?;
    Ok(due
        .first()
        .map_err(failed)?
        .is_some_and(|(key, _)| key.value().0 <= now))
}

/// The earliest due first; each is due again when its lease passes (rounded up to the
/// millisecond, so the lease holds at least as long as asked).
fn claim_deliveries(
    transaction: &WriteTransaction,
    limit: usize,
    lease: Duration,
    at: SystemTime,
) -> Result<Vec<ClaimedDelivery>, StoreError> {
    let now = epoch_ms(at);
    let lease_until = at
        .checked_add(lease)
        .and_then(|until| until.duration_since(UNIX_EPOCH).ok())
        .map_or(u64::MAX, |until| {
            millis(until).saturating_add(u64::from(until.subsec_nanos() % 1_000_000 != 0))
        });
    let mut due = transaction.open_table(DUE).map_err(failed)?;
    let mut deliveries = transaction.open_table(DELIVERIES).map_err(failed)?;
    let mut ready = Vec::new();
    for entry in due.iter().map_err(failed)? {
        let (key, _) = entry.map_err(failed)?;
        let (due_at, subscription_id, event_id) = key.value();
        if due_at > now || ready.len() == limit {
            break;
        }
        ready.push((due_at, subscription_id.to_owned(), event_id.to_owned()));
    }
    let mut claimed = Vec::with_capacity(ready.len());
    for (due_at, subscription_id, event_id) in ready {
        let key = (subscription_id.as_str(), event_id.as_str());
        due.remove((due_at, key.0, key.1)).map_err(failed)?;
        let Some(mut delivery) = read_delivery(&deliveries, key)? else {
            continue;
        };
        let claim = new_claim();
        delivery.due = lease_until;
        delivery.claim = Some(claim.to_string());
        deliveries
            .insert(key, delivery.encode().as_slice())
            .map_err(failed)?;
        due.insert((delivery.due, key.0, key.1), ())
            .map_err(failed)?;
        claimed.push(ClaimedDelivery {
            subscription_id: Arc::from(subscription_id),
            event: OutboxEvent {
                event_id: Arc::from(event_id),
                event_type: Arc::from(delivery.event_type),
                body: Bytes::from(delivery.body),
            },
            attempts: delivery.attempts,
            claim,
        });
    }
    Ok(claimed)
}

fn finish_attempt(
    transaction: &WriteTransaction,
    claimed: &ClaimedDelivery,
    attempt: &DeliveryAttempt,
    after: AfterAttempt,
    now: u64,
) -> Result<(), StoreError> {
    let key = (&*claimed.subscription_id, &*claimed.event.event_id);
    let mut attempts = transaction.open_table(ATTEMPTS).map_err(failed)?;
    let log = (key.0, 0)..=(key.0, u64::MAX);
    let next = match attempts.range(log).map_err(failed)?.next_back() {
        Some(newest) => newest.map_err(failed)?.0.value().1 + 1,
        None => 0,
    };
    attempts
        .insert((key.0, next), encode_attempt(attempt).as_slice())
        .map_err(failed)?;
    let first_kept = (next + 1).saturating_sub(KEPT_ATTEMPTS as u64);
    if first_kept > 0 {
        attempts
            .retain_in((key.0, 0)..(key.0, first_kept), |_, _| false)
            .map_err(failed)?;
    }

    let mut deliveries = transaction.open_table(DELIVERIES).map_err(failed)?;
    let Some(mut delivery) = read_delivery(&deliveries, key)?
        .filter(|delivery| delivery.claim.as_deref() == Some(&*claimed.claim))
    else {
        // A stale claim: another replica holds the delivery now.
        return Ok(());
    };
    let mut due = transaction.open_table(DUE).map_err(failed)?;
    due.remove((delivery.due, key.0, key.1)).map_err(failed)?;
    match after {
        AfterAttempt::RetryIn(delay) => {
            delivery.attempts = delivery.attempts.saturating_add(1);
            delivery.due = now.saturating_add(millis(delay));
            delivery.claim = None;
            deliveries
                .insert(key, delivery.encode().as_slice())
                .map_err(failed)?;
            due.insert((delivery.due, key.0, key.1), ())
                .map_err(failed)?;
        }
        AfterAttempt::Delivered | AfterAttempt::Failed => {
            deliveries.remove(key).map_err(failed)?;
        }
    }
    Ok(())
}

/// Newest first.
fn delivery_attempts(
    transaction: &ReadTransaction,
    subscription_id: &str,
    limit: usize,
) -> Result<Vec<DeliveryAttempt>, StoreError> {
    let attempts = transaction.open_table(ATTEMPTS).map_err(failed)?;
    attempts
        .range((subscription_id, 0)..=(subscription_id, u64::MAX))
        .map_err(failed)?
        .rev()
        .take(limit)
        .map(|entry| {
            let (_, bytes) = entry.map_err(failed)?;
            decode_attempt(bytes.value()).ok_or_else(|| unreadable("delivery attempt"))
        })
        .collect()
}

fn pending_deliveries(transaction: &ReadTransaction) -> Result<usize, StoreError> {
    let deliveries = transaction.open_table(DELIVERIES).map_err(failed)?;
    let pending = deliveries.len().map_err(failed)?;
    usize::try_from(pending).map_err(StoreError::new)
}

impl EventStore for FileStore {
    fn save_subscription<'a>(
        &'a self,
        subscription: &'a StoredSubscription,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let subscription = subscription.clone();
        Box::pin(self.transact(move |transaction| save_subscription(transaction, &subscription)))
    }

    fn subscription<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredSubscription>, StoreError>> {
        let id = id.to_owned();
        Box::pin(self.view(move |transaction| subscription(transaction, &id)))
    }

    fn subscriptions(&self) -> BoxFuture<'_, Result<Vec<StoredSubscription>, StoreError>> {
        Box::pin(self.view(subscriptions))
    }

    fn delete_subscription<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let id = id.to_owned();
        Box::pin(self.transact(move |transaction| delete_subscription(transaction, &id)))
    }

    fn enqueue_event<'a>(
        &'a self,
        event: &'a OutboxEvent,
        subscription_ids: &'a [Arc<str>],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (event, subscription_ids) = (event.clone(), subscription_ids.to_vec());
        Box::pin(self.transact(move |transaction| {
            enqueue_event(transaction, &event, &subscription_ids, now_ms())
        }))
    }

    fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<ClaimedDelivery>, StoreError>> {
        Box::pin(async move {
            // Replicas poll while the outbox is idle: look before taking the write lock, so an
            // idle outbox never writes the file.
            if !self
                .view(|transaction| any_due(transaction, now_ms()))
                .await?
            {
                return Ok(Vec::new());
            }
            // Claims need not survive a crash: only this process could honour them, and a claim
            // lost with it leaves the delivery due at once on restart. Not syncing them keeps
            // a short lease from passing while its claim is written.
            self.transact_as(Durability::None, move |transaction| {
                claim_deliveries(transaction, limit, lease, SystemTime::now())
            })
            .await
        })
    }

    fn finish_attempt<'a>(
        &'a self,
        claimed: &'a ClaimedDelivery,
        attempt: &'a DeliveryAttempt,
        after: AfterAttempt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (claimed, attempt) = (claimed.clone(), attempt.clone());
        Box::pin(self.transact(move |transaction| {
            finish_attempt(transaction, &claimed, &attempt, after, now_ms())
        }))
    }

    fn delivery_attempts<'a>(
        &'a self,
        subscription_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeliveryAttempt>, StoreError>> {
        let subscription_id = subscription_id.to_owned();
        Box::pin(
            self.view(move |transaction| delivery_attempts(transaction, &subscription_id, limit)),
        )
    }

    fn pending_deliveries(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(self.view(pending_deliveries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_round_trip_and_damaged_bytes_are_refused_not_misread() {
        let at = from_epoch_ms(1_780_000_000_123);
        let subscription = StoredSubscription {
            id: Arc::from("sub_1"),
            url: "https://hooks.example.com/in".to_owned(),
            event_types: vec!["tools.changed".to_owned(), "health.changed".to_owned()],
            description: None,
            secret: vec![1; 32].into(),
            previous_secret: Some((vec![2; 24].into(), at)),
            created_at: at,
            disabled_reason: Some("HTTP 410 Gone".to_owned()),
            failing_since: Some(at),
        };
        let bytes = encode_subscription(&subscription);
        assert_eq!(decode_subscription(&bytes), Some(subscription));
        for length in 0..bytes.len() {
            assert!(
                decode_subscription(&bytes[..length]).is_none(),
                "{length} bytes"
            );
        }
    }

    #[test]
    fn deliveries_and_attempts_round_trip() {
        let delivery = Delivery {
            event_type: "execution.finished".to_owned(),
            body: b"{}".to_vec(),
            attempts: 3,
            due: 42,
            claim: Some("claim".to_owned()),
        };
        let decoded = Delivery::decode(&delivery.encode()).expect("decodes");
        assert_eq!(decoded.encode(), delivery.encode());
        let attempt = DeliveryAttempt {
            event_id: Arc::from("evt_1"),
            at: from_epoch_ms(1_780_000_000_123),
            status: None,
            duration: Duration::from_millis(15_000),
            error: Some("timed out".to_owned()),
        };
        assert_eq!(decode_attempt(&encode_attempt(&attempt)), Some(attempt));
    }
}
