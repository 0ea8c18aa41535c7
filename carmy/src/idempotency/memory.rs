//! The default store: in memory, bounded, sharded.

mod outbox;

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use hashbrown::HashTable;
use tokio::sync::watch;
use tokio::time::Instant;

use self::outbox::MemoryOutbox;
use super::{
    AfterAttempt, Cancellation, ClaimedDelivery, DeliveryAttempt, ExecutionQuery, ExecutionRecord,
    ExecutionSummary, Fingerprint, Finish, IdempotencyKey, IdempotencyStore, OutboxEvent,
    ProcessExecutions, RecordedEvent, RecordedOutcome, Reservation, StoreError, StoredResponse,
    StoredSubscription,
};

/// Records kept by default before the oldest finished ones are evicted.
const DEFAULT_CAPACITY: usize = 100_000;
/// Bytes of records (mostly recorded answers) kept by default.
const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;
/// Shards hold at least this many bytes, so one shard keeps a large answer.
const MIN_SHARD_BYTES: usize = 4 * 1024 * 1024;
/// Shards hold at most this many records, so a lock covers a small map: 7/8 of 4,096, the most
/// a hash table of 4,096 buckets holds before it doubles.
const RECORDS_PER_SHARD: usize = 3_584;
const MAX_SHARDS: usize = 64;

/// Idempotency records in this process's memory: zero setup, lost on restart, private to one
/// replica (use a shared store when running several).
///
/// Bounded by a number of records and by the bytes they take (recorded answers, keys, ids):
/// when full it evicts the oldest finished records first and never a running one; when only
/// running ones remain, a new reservation is refused (`IDEMPOTENCY_CAPACITY`). Records live in
/// independently locked shards, so concurrent calls rarely contend; each shard holds an equal
/// part of both bounds, and an answer larger than a shard's part is not kept: the record turns
/// uncertain (a retry gets `EXECUTION_UNCERTAIN`, never a second run).
///
/// It also keeps executions for their callers (`protocol.md` §9), for this process only:
/// another replica cannot look them up. They have a byte bound of their own, `max_bytes` as
/// well: when it is reached, the executions that ended first are dropped, never a running one,
/// and a new execution that still does not fit is refused (`503 IDEMPOTENCY_UNAVAILABLE`).
///
/// And it keeps event subscriptions and the outbox (`protocol.md` §8), in this process only:
/// subscriptions, pending deliveries and their attempts are **lost on restart** (events not yet
/// delivered are never sent); use a persistent store where that matters. Pending deliveries
/// are bounded by `max_bytes` too: beyond it a new event is refused, never an old one dropped.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    limits: Limits,
    /// Hashes a key once per operation: the hash picks its shard and finds it in the shard's
    /// table. SipHash, randomly keyed, as `HashMap`'s, against keys chosen to collide.
    hasher: RandomState,
    executions: ProcessExecutions,
    outbox: MemoryOutbox,
}

/// One shard's part of the store's bounds.
#[derive(Clone, Copy)]
struct Limits {
    records: usize,
    bytes: usize,
}

struct Shard {
    /// Found by [`MemoryStore::hasher`]'s hash of the record's key.
    records: HashTable<Record>,
    hasher: RandomState,
    /// The sum of the records' [`weight`]s.
    bytes: usize,
    /// Finished records, oldest first, as (hash of the key, generation): a generation is the
    /// shard's alone, so it finds its record among those of its hash without the key (neither
    /// held, nor hashed again, nor compared when evicting). Entries whose record has since
    /// changed are skipped.
    finished: VecDeque<(u64, u64)>,
    next_generation: u64,
}

struct Record {
    key: IdempotencyKey,
    /// The recorded call's tool, reported on a conflict.
    tool: Arc<str>,
    /// The first half of the fingerprint's SHA-256: 128 bits tell calls apart as surely, and
    /// 16 bytes less per record keeps 100,000 records within 64 MiB.
    digest: [u8; 16],
    state: State,
    expires_at: Instant,
    generation: u64,
    /// What the record takes in memory, as [`weight`] counts it.
    bytes: usize,
}

/// What a reservation asks for.
#[derive(Clone, Copy)]
struct Claim<'a> {
    fingerprint: &'a Fingerprint,
    execution_id: &'a Arc<str>,
    lease: Duration,
    ttl: Duration,
}

/// Each state holds the id of the execution that reserved the key: once, as the answer's own
/// copy when there is one (16 bytes less per record than a field beside the state).
enum State {
    /// Dropping the sender wakes the duplicates waiting for this execution. It is made for
    /// the first duplicate: most calls have none, and a channel is an allocation and, when
    /// dropped, a wake-up of its eight waiter lists.
    Running {
        execution_id: Arc<str>,
        changed: Option<watch::Sender<()>>,
        lease_until: Instant,
    },
    Finished(StoredResponse),
    Uncertain {
        execution_id: Arc<str>,
    },
}

impl Record {
    fn execution_id(&self) -> &Arc<str> {
        match &self.state {
            State::Running { execution_id, .. } | State::Uncertain { execution_id } => execution_id,
            State::Finished(response) => &response.execution_id,
        }
    }

    /// Ends the record without an answer: a retry learns that the call may have happened.
    fn make_uncertain(&mut self) {
        let execution_id = self.execution_id().clone();
        self.state = State::Uncertain { execution_id };
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .field("max_bytes", &self.max_bytes())
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl MemoryStore {
    /// A store that keeps up to 100,000 records and 64 MiB.
    pub fn new() -> Self {
        Self::with_limits(DEFAULT_CAPACITY, DEFAULT_MAX_BYTES)
    }

    /// A store that keeps up to about `capacity` records (at least one) and 64 MiB.
    pub fn with_capacity(capacity: usize) -> Self {
        Self::with_limits(capacity, DEFAULT_MAX_BYTES)
    }

    /// A store that keeps up to about `capacity` records (at least one) taking up to about
    /// `max_bytes`. Both are split evenly among the shards, so eviction can start in a busy
    /// shard a little before the whole store is full.
    pub fn with_limits(capacity: usize, max_bytes: usize) -> Self {
        let capacity = capacity.max(1);
        let shard_count = capacity
            .div_ceil(RECORDS_PER_SHARD)
            .min(max_bytes / MIN_SHARD_BYTES)
            .clamp(1, MAX_SHARDS);
        let limits = Limits {
            records: capacity.div_ceil(shard_count),
            bytes: max_bytes / shard_count,
        };
        let hasher = RandomState::new();
        MemoryStore {
            shards: (0..shard_count)
                .map(|_| {
                    Mutex::new(Shard {
                        records: HashTable::with_capacity(limits.records.min(RECORDS_PER_SHARD)),
                        hasher: hasher.clone(),
                        bytes: 0,
                        finished: VecDeque::new(),
                        next_generation: 0,
                    })
                })
                .collect(),
            limits,
            hasher,
            executions: ProcessExecutions::new(max_bytes),
            outbox: MemoryOutbox::new(max_bytes),
        }
    }

    /// How many records the store keeps at most.
    pub fn capacity(&self) -> usize {
        self.limits.records * self.shards.len()
    }

    /// How many bytes its records take at most.
    pub fn max_bytes(&self) -> usize {
        self.limits.bytes * self.shards.len()
    }

    /// How many bytes its records take now, as the bound counts them.
    pub fn bytes(&self) -> usize {
        (0..self.shards.len())
            .map(|index| self.lock(index).bytes)
            .sum()
    }

    /// How many bytes the kept executions take now, as their bound counts them.
    pub fn execution_bytes(&self) -> usize {
        self.executions.bytes()
    }

    /// How many records it holds now (running, finished and uncertain).
    pub fn len(&self) -> usize {
        (0..self.shards.len())
            .map(|index| self.lock(index).records.len())
            .sum()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key's hash, and its shard, locked.
    fn shard(&self, key: &IdempotencyKey) -> (u64, MutexGuard<'_, Shard>) {
        let hash = self.hasher.hash_one(key);
        // The hash's middle bits: the table takes its low bits for a bucket and its top seven
        // for a tag, which would otherwise be alike for every key of a shard.
        let index = ((hash >> 32) as usize) % self.shards.len();
        (hash, self.lock(index))
    }

    fn lock(&self, index: usize) -> MutexGuard<'_, Shard> {
        // No code panics while holding a shard lock; recover the data if it ever happens.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Shard {
    fn reserve(
        &mut self,
        hash: u64,
        key: &IdempotencyKey,
        claim: Claim<'_>,
        limits: Limits,
        now: Instant,
    ) -> Reservation {
        let generation = self.next_generation();
        if let Some(record) = self.records.find_mut(hash, |record| record.key == *key) {
            if record.expires_at > now {
                if record.tool != claim.fingerprint.tool
                    || record.digest != short_digest(claim.fingerprint)
                {
                    return Reservation::Conflict {
                        tool: record.tool.clone(),
                    };
                }
                match &mut record.state {
                    State::Running {
                        execution_id,
                        changed,
                        lease_until,
                    } if *lease_until > now => {
                        let mut changed = changed
                            .get_or_insert_with(|| watch::channel(()).0)
                            .subscribe();
                        let lease_until = *lease_until;
                        return Reservation::Running {
                            execution_id: execution_id.clone(),
                            changed: Box::pin(async move {
                                // The sender is dropped when the record changes; the lease
                                // passing changes it too.
                                tokio::select! {
                                    _ = changed.changed() => {}
                                    () = tokio::time::sleep_until(lease_until) => {}
                                }
                            }),
                        };
                    }
                    State::Running { .. } => {
                        // Its execution outlived its lease: from now on it is uncertain.
                        record.make_uncertain();
                        record.generation = generation;
                        let execution_id = record.execution_id().clone();
                        self.queue_finished(hash, generation);
                        return Reservation::Uncertain { execution_id };
                    }
                    State::Finished(response) => return Reservation::Finished(response.clone()),
                    State::Uncertain { execution_id } => {
                        return Reservation::Uncertain {
                            execution_id: execution_id.clone(),
                        };
                    }
                }
            }
            self.remove(hash, key);
        }
        let bytes = weight(key, &claim.fingerprint.tool, claim.execution_id, None);
        if !self.make_room(limits, bytes, None, now) {
            return Reservation::Full;
        }
        let lease_until = now + claim.lease;
        let hasher = &self.hasher;
        self.records.insert_unique(
            hash,
            Record {
                key: key.clone(),
                tool: claim.fingerprint.tool.clone(),
                digest: short_digest(claim.fingerprint),
                state: State::Running {
                    execution_id: Arc::clone(claim.execution_id),
                    changed: None,
                    lease_until,
                },
                // A running record lives until its lease, whatever the ttl; then uncertain.
                expires_at: lease_until + claim.ttl,
                generation,
                bytes,
            },
            |record| hasher.hash_one(&record.key),
        );
        self.bytes += bytes;
        Reservation::Reserved
    }

    fn finish(
        &mut self,
        hash: u64,
        key: &IdempotencyKey,
        finish: Finish,
        limits: Limits,
        now: Instant,
        ttl: Duration,
    ) {
        let generation = self.next_generation();
        let Some(record) = self
            .records
            .find_mut(hash, |record| record.key == *key)
            .filter(|record| *record.execution_id() == *finish.execution_id())
        else {
            return;
        };
        let bytes = match finish {
            Finish::Response(response) => {
                let bytes = weight(key, &record.tool, &response.execution_id, Some(&response));
                record.state = State::Finished(response);
                bytes
            }
            Finish::Uncertain { .. } => {
                record.make_uncertain();
                record.bytes
            }
        };
        self.bytes = self.bytes - record.bytes + bytes;
        record.bytes = bytes;
        record.expires_at = now + ttl;
        record.generation = generation;
        self.queue_finished(hash, generation);
        if !self.make_room(limits, 0, Some(generation), now)
            && let Some(record) = self.records.find_mut(hash, |record| record.key == *key)
        {
            // This answer alone is over the shard's part of the bound: keep that the call
            // happened, not what it answered.
            let bytes = weight(key, &record.tool, record.execution_id(), None);
            tracing::warn!(
                answer_bytes = record.bytes,
                max_bytes = limits.bytes,
                "an answer too large for the idempotency store was not kept: a retry gets \
                 EXECUTION_UNCERTAIN"
            );
            record.make_uncertain();
            self.bytes = self.bytes - record.bytes + bytes;
            record.bytes = bytes;
        }
    }

    /// Frees `key` if `execution_id` still holds it.
    fn release(&mut self, hash: u64, key: &IdempotencyKey, execution_id: &str) {
        self.remove_if(hash, |record| {
            record.key == *key && **record.execution_id() == *execution_id
        });
    }

    fn remove(&mut self, hash: u64, key: &IdempotencyKey) {
        self.remove_if(hash, |record| record.key == *key);
    }

    /// Drops the record of hash `hash` that `is_it` picks, if there is one, and its bytes.
    fn remove_if(&mut self, hash: u64, is_it: impl Fn(&Record) -> bool) {
        if let Ok(entry) = self.records.find_entry(hash, is_it) {
            self.bytes -= entry.remove().0.bytes;
        }
    }

    fn queue_finished(&mut self, hash: u64, generation: u64) {
        self.finished.push_back((hash, generation));
        if self.finished.len() > 2 * self.records.len().max(16) {
            self.compact_finished();
        }
    }

    /// Makes room for a new record of `incoming` bytes (none: room for what is held), evicting
    /// the oldest finished records, never the one of generation `keep`, then expired ones.
    /// `false` if it cannot.
    fn make_room(
        &mut self,
        limits: Limits,
        incoming: usize,
        keep: Option<u64>,
        now: Instant,
    ) -> bool {
        let new_records = usize::from(incoming > 0);
        let fits = |shard: &Shard| {
            shard.records.len() + new_records <= limits.records
                && shard.bytes + incoming <= limits.bytes
        };
        while !fits(self) {
            let Some((hash, generation)) = self.finished.pop_front() else {
                break;
            };
            if keep == Some(generation) {
                self.finished.push_front((hash, generation));
                break;
            }
            self.remove_if(hash, |record| record.generation == generation);
        }
        if !fits(self) {
            // Only running records remain; drop those that outlived their lease and ttl.
            self.purge_expired(now);
        }
        fits(self)
    }

    fn purge_expired(&mut self, now: Instant) -> usize {
        let before = self.records.len();
        let bytes = &mut self.bytes;
        self.records.retain(|record| {
            let keep = record.expires_at > now;
            if !keep {
                *bytes -= record.bytes;
            }
            keep
        });
        self.compact_finished();
        before - self.records.len()
    }

    /// Drops queue entries whose record has changed or gone.
    fn compact_finished(&mut self) {
        let records = &self.records;
        self.finished.retain(|&(hash, generation)| {
            records
                .find(hash, |record| record.generation == generation)
                .is_some()
        });
    }

    fn next_generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }
}

/// What a record takes in memory: its fixed parts, its key, tool and execution id (counted
/// whole even where shared), and its answer.
fn weight(
    key: &IdempotencyKey,
    tool: &str,
    execution_id: &str,
    response: Option<&StoredResponse>,
) -> usize {
    const FIXED: usize = size_of::<Record>()
        + size_of::<(u64, u64)>()
        + size_of::<StoredResponse>()
        // Four `Arc` headers and a hash table's control byte and slack.
        + 4 * 16
        + 16;
    FIXED
        + key.caller().len()
        + key.request_id().len()
        + tool.len()
        + execution_id.len()
        + response.map_or(0, |response| {
            response.body.len() + response.code.as_deref().map_or(0, str::len)
        })
}

fn short_digest(fingerprint: &Fingerprint) -> [u8; 16] {
    let mut digest = [0; 16];
    digest.copy_from_slice(&fingerprint.digest[..16]);
    digest
}

impl IdempotencyStore for MemoryStore {
    fn reserve<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        execution_id: &'a Arc<str>,
        lease: Duration,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        let claim = Claim {
            fingerprint,
            execution_id,
            lease,
            ttl,
        };
        let (hash, mut shard) = self.shard(key);
        let reservation = shard.reserve(hash, key, claim, self.limits, Instant::now());
        drop(shard);
        Box::pin(std::future::ready(Ok(reservation)))
    }

    fn finish<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        finish: Finish,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (hash, mut shard) = self.shard(key);
        shard.finish(hash, key, finish, self.limits, Instant::now(), ttl);
        Box::pin(std::future::ready(Ok(())))
    }

    fn release<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (hash, mut shard) = self.shard(key);
        shard.release(hash, key, execution_id);
        Box::pin(std::future::ready(Ok(())))
    }

    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        let now = Instant::now();
        let purged = (0..self.shards.len())
            .map(|index| self.lock(index).purge_expired(now))
            .sum::<usize>()
            + self.executions.purge_expired();
        Box::pin(std::future::ready(Ok(purged)))
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
        self.executions.begin(caller, execution_id, tool, lease)
    }

    fn record_progress<'a>(
        &'a self,
        execution_id: &'a str,
        event: RecordedEvent,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.executions.progress(execution_id, event)
    }

    fn end_execution<'a>(
        &'a self,
        execution_id: &'a str,
        outcome: RecordedOutcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.executions.end(execution_id, outcome, ttl)
    }

    fn execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ExecutionRecord>, StoreError>> {
        self.executions.get(caller, execution_id)
    }

    fn executions<'a>(
        &'a self,
        caller: &'a str,
        query: &'a ExecutionQuery,
    ) -> BoxFuture<'a, Result<Vec<ExecutionSummary>, StoreError>> {
        self.executions.list(caller, query)
    }

    fn cancel_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Cancellation, StoreError>> {
        self.executions.cancel(caller, execution_id)
    }

    fn execution_changed(&self, execution_id: &str) -> BoxFuture<'static, ()> {
        self.executions.changed(execution_id)
    }

    fn keeps_events(&self) -> bool {
        true
    }

    fn save_subscription<'a>(
        &'a self,
        subscription: &'a StoredSubscription,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.outbox.save_subscription(subscription);
        Box::pin(std::future::ready(Ok(())))
    }

    fn subscription<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredSubscription>, StoreError>> {
        Box::pin(std::future::ready(Ok(self.outbox.subscription(id))))
    }

    fn subscriptions(&self) -> BoxFuture<'_, Result<Vec<StoredSubscription>, StoreError>> {
        Box::pin(std::future::ready(Ok(self.outbox.subscriptions())))
    }

    fn delete_subscription<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(self.outbox.delete_subscription(id))))
    }

    fn enqueue_event<'a>(
        &'a self,
        event: &'a OutboxEvent,
        subscription_ids: &'a [Arc<str>],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(std::future::ready(
            self.outbox.enqueue_event(event, subscription_ids),
        ))
    }

    fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<ClaimedDelivery>, StoreError>> {
        Box::pin(std::future::ready(Ok(self
            .outbox
            .claim_deliveries(limit, lease))))
    }

    fn finish_attempt<'a>(
        &'a self,
        claimed: &'a ClaimedDelivery,
        attempt: &'a DeliveryAttempt,
        after: AfterAttempt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.outbox.finish_attempt(claimed, attempt, after);
        Box::pin(std::future::ready(Ok(())))
    }

    fn delivery_attempts<'a>(
        &'a self,
        subscription_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeliveryAttempt>, StoreError>> {
        Box::pin(std::future::ready(Ok(self
            .outbox
            .delivery_attempts(subscription_id, limit))))
    }

    fn pending_deliveries(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(std::future::ready(Ok(self.outbox.pending_deliveries())))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::runtime::ExecutionStatus;

    /// Reserves and finishes `request_id` as `caller`.
    fn record(store: &MemoryStore, caller: &str, request_id: &str) {
        let key = IdempotencyKey::new(caller, request_id);
        let fingerprint = Fingerprint {
            tool: Arc::from("tool"),
            digest: [7; 32],
        };
        let execution_id: Arc<str> = Arc::from(format!("exec_{request_id}"));
        let ttl = Duration::from_secs(60);
        let reserved = futures_util::FutureExt::now_or_never(store.reserve(
            &key,
            &fingerprint,
            &execution_id,
            ttl,
            ttl,
        ));
        assert!(matches!(reserved, Some(Ok(Reservation::Reserved))));
        let response = StoredResponse {
            execution_id,
            status: ExecutionStatus::Completed,
            category: None,
            code: None,
            body: Bytes::from_static(b"{}"),
        };
        let finished = store.finish(&key, Finish::Response(response), ttl);
        assert!(matches!(
            futures_util::FutureExt::now_or_never(finished),
            Some(Ok(()))
        ));
    }

    #[tokio::test]
    async fn keys_spread_over_every_shard() {
        // Keys that went to a few of the 64 shards would evict each other long before the store
        // is full. Spread evenly, over 99 in 100 stay when it is filled to its capacity.
        let capacity = MAX_SHARDS * RECORDS_PER_SHARD;
        let store = MemoryStore::with_limits(capacity, MAX_SHARDS * MIN_SHARD_BYTES);
        assert_eq!(store.shards.len(), MAX_SHARDS);
        for number in 0..capacity {
            record(&store, "caller", &format!("req-{number}"));
        }
        let kept = store.len();
        assert!(kept >= capacity * 97 / 100, "kept {kept} of {capacity}");
        let fullest = (0..store.shards.len())
            .map(|index| store.lock(index).records.len())
            .max();
        assert_eq!(fullest, Some(RECORDS_PER_SHARD));
    }

    /// The answer recorded for `request_id` as `caller`, if the store replays one; a key it
    /// does not hold is reserved instead.
    fn replayed(store: &MemoryStore, caller: &str, request_id: &str) -> Option<Arc<str>> {
        let key = IdempotencyKey::new(caller, request_id);
        let fingerprint = Fingerprint {
            tool: Arc::from("tool"),
            digest: [7; 32],
        };
        let execution_id: Arc<str> = Arc::from("exec_other");
        let found = futures_util::FutureExt::now_or_never(store.reserve(
            &key,
            &fingerprint,
            &execution_id,
            Duration::from_secs(1),
            Duration::from_secs(1),
        ));
        match found {
            Some(Ok(Reservation::Finished(response))) => Some(response.execution_id),
            _ => None,
        }
    }

    #[tokio::test]
    async fn the_newest_records_are_found_after_evictions() {
        let store = MemoryStore::with_limits(3, MIN_SHARD_BYTES);
        for number in 0..10 {
            record(&store, "caller", &format!("req-{number}"));
        }
        // The oldest were evicted; the newest three are replayed.
        assert_eq!(store.len(), 3);
        for number in 7..10 {
            let request_id = format!("req-{number}");
            let execution_id = replayed(&store, "caller", &request_id);
            assert_eq!(
                execution_id.as_deref(),
                Some(&*format!("exec_{request_id}"))
            );
        }
        // An evicted key is free again.
        record(&store, "caller", "req-0");
    }

    /// A key recorded again after its record expired stands twice in the line of finished
    /// records: the first entry, stale, evicts nothing, and the key leaves at its new place.
    #[tokio::test(start_paused = true)]
    async fn a_key_recorded_again_is_evicted_at_its_new_place_in_line() {
        let store = MemoryStore::with_limits(2, MIN_SHARD_BYTES);
        assert_eq!(store.shards.len(), 1);
        record(&store, "caller", "a");
        // Past its 60 s ttl, `a` is recorded anew after `b`.
        tokio::time::advance(Duration::from_secs(61)).await;
        record(&store, "caller", "b");
        record(&store, "caller", "a");
        assert_eq!(store.lock(0).finished.len(), 3);
        // Room for `c`: `b` is the oldest record, not the `a` of the stale entry.
        record(&store, "caller", "c");
        assert_eq!(store.len(), 2);
        assert_eq!(replayed(&store, "caller", "a").as_deref(), Some("exec_a"));
        assert_eq!(replayed(&store, "caller", "c").as_deref(), Some("exec_c"));
        assert_eq!(replayed(&store, "caller", "b"), None, "b was evicted");
    }
}
