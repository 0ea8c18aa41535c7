//! The default store: in memory, bounded, sharded.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{
    Fingerprint, Finish, IdempotencyKey, IdempotencyStore, Reservation, StoreError, StoredResponse,
};

/// Records kept by default before the oldest finished ones are evicted.
const DEFAULT_CAPACITY: usize = 100_000;
/// Shards hold at most this many records, so a lock covers a small map: 7/8 of 4,096, the most
/// a hash table of 4,096 buckets holds before it doubles.
const RECORDS_PER_SHARD: usize = 3_584;
const MAX_SHARDS: usize = 64;

/// Idempotency records in this process's memory: zero setup, lost on restart, private to one
/// replica (use a shared store when running several).
///
/// Bounded: when full it evicts the oldest finished records first and never a running one;
/// when only running ones remain, a new reservation is refused (`IDEMPOTENCY_CAPACITY`).
/// Records live in independently locked shards, so concurrent calls rarely contend.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    shard_capacity: usize,
    hasher: RandomState,
}

#[derive(Default)]
struct Shard {
    records: HashMap<IdempotencyKey, Record>,
    /// Finished records, oldest first, as (key, generation); entries whose record has since
    /// changed are skipped.
    finished: VecDeque<(IdempotencyKey, u64)>,
    next_generation: u64,
}

struct Record {
    /// The recorded call's tool, reported on a conflict.
    tool: Arc<str>,
    /// The first half of the fingerprint's SHA-256: 128 bits tell calls apart as surely, and
    /// 16 bytes less per record keeps 100,000 records within 64 MiB.
    digest: [u8; 16],
    /// The execution that reserved the key.
    execution_id: Arc<str>,
    state: State,
    expires_at: Instant,
    generation: u64,
}

/// What a reservation asks for.
#[derive(Clone, Copy)]
struct Claim<'a> {
    fingerprint: &'a Fingerprint,
    execution_id: &'a Arc<str>,
    lease: Duration,
    ttl: Duration,
}

enum State {
    /// Dropping the sender wakes the duplicates waiting for this execution.
    Running {
        changed: watch::Sender<()>,
        lease_until: Instant,
    },
    Finished(StoredResponse),
    Uncertain,
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
            .finish()
    }
}

impl MemoryStore {
    /// A store that keeps up to 100,000 records.
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }

    /// A store that keeps up to about `capacity` records (at least one). The capacity is split
    /// evenly among the shards, so eviction can start in a busy shard a little before the whole
    /// store is full.
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let shard_count = capacity.div_ceil(RECORDS_PER_SHARD).clamp(1, MAX_SHARDS);
        let shard_capacity = capacity.div_ceil(shard_count);
        MemoryStore {
            shards: (0..shard_count)
                .map(|_| {
                    Mutex::new(Shard {
                        records: HashMap::with_capacity(shard_capacity),
                        ..Shard::default()
                    })
                })
                .collect(),
            shard_capacity,
            hasher: RandomState::new(),
        }
    }

    /// How many records the store keeps at most.
    pub fn capacity(&self) -> usize {
        self.shard_capacity * self.shards.len()
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

    fn shard(&self, key: &IdempotencyKey) -> MutexGuard<'_, Shard> {
        let index = (self.hasher.hash_one(key) as usize) % self.shards.len();
        self.lock(index)
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
        key: &IdempotencyKey,
        claim: Claim<'_>,
        capacity: usize,
        now: Instant,
    ) -> Reservation {
        let generation = self.next_generation();
        if let Some(record) = self.records.get_mut(key) {
            if record.expires_at > now {
                if record.tool != claim.fingerprint.tool
                    || record.digest != short_digest(claim.fingerprint)
                {
                    return Reservation::Conflict {
                        tool: record.tool.clone(),
                    };
                }
                match &record.state {
                    State::Running {
                        changed,
                        lease_until,
                    } if *lease_until > now => {
                        let mut changed = changed.subscribe();
                        let lease_until = *lease_until;
                        return Reservation::Running {
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
                        record.state = State::Uncertain;
                        record.generation = generation;
                        let execution_id = record.execution_id.clone();
                        self.queue_finished(key, generation);
                        return Reservation::Uncertain { execution_id };
                    }
                    State::Finished(response) => return Reservation::Finished(response.clone()),
                    State::Uncertain => {
                        return Reservation::Uncertain {
                            execution_id: record.execution_id.clone(),
                        };
                    }
                }
            }
            self.records.remove(key);
        }
        if self.records.len() >= capacity && !self.make_room(capacity, now) {
            return Reservation::Full;
        }
        self.records.insert(
            key.clone(),
            Record {
                tool: claim.fingerprint.tool.clone(),
                digest: short_digest(claim.fingerprint),
                execution_id: Arc::clone(claim.execution_id),
                state: State::Running {
                    changed: watch::channel(()).0,
                    lease_until: now + claim.lease,
                },
                expires_at: now + claim.ttl,
                generation,
            },
        );
        Reservation::Reserved
    }

    fn finish(&mut self, key: &IdempotencyKey, finish: Finish, now: Instant, ttl: Duration) {
        let generation = self.next_generation();
        let Some(record) = self
            .records
            .get_mut(key)
            .filter(|record| record.execution_id == *finish.execution_id())
        else {
            return;
        };
        record.state = match finish {
            Finish::Response(response) => {
                // Share the response's copy of the id: one allocation per record, not two.
                record.execution_id = response.execution_id.clone();
                State::Finished(response)
            }
            Finish::Uncertain { .. } => State::Uncertain,
        };
        record.expires_at = now + ttl;
        record.generation = generation;
        self.queue_finished(key, generation);
    }

    fn queue_finished(&mut self, key: &IdempotencyKey, generation: u64) {
        self.finished.push_back((key.clone(), generation));
        if self.finished.len() > 2 * self.records.len().max(16) {
            self.compact_finished();
        }
    }

    /// Frees one slot: expired records first, then the oldest finished one.
    fn make_room(&mut self, capacity: usize, now: Instant) -> bool {
        while let Some((key, generation)) = self.finished.pop_front() {
            let current = self
                .records
                .get(&key)
                .is_some_and(|record| record.generation == generation);
            if current {
                self.records.remove(&key);
                if self.records.len() < capacity {
                    return true;
                }
            }
        }
        // Only running records remain; drop those that outlived their ttl.
        self.records.retain(|_, record| record.expires_at > now);
        self.records.len() < capacity
    }

    fn purge_expired(&mut self, now: Instant) -> usize {
        let before = self.records.len();
        self.records.retain(|_, record| record.expires_at > now);
        self.compact_finished();
        before - self.records.len()
    }

    /// Drops queue entries whose record has changed or gone.
    fn compact_finished(&mut self) {
        let records = &self.records;
        self.finished.retain(|(key, generation)| {
            records
                .get(key)
                .is_some_and(|record| record.generation == *generation)
        });
    }

    fn next_generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }
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
        let reservation = self
            .shard(key)
            .reserve(key, claim, self.shard_capacity, Instant::now());
        Box::pin(std::future::ready(Ok(reservation)))
    }

    fn finish<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        finish: Finish,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.shard(key).finish(key, finish, Instant::now(), ttl);
        Box::pin(std::future::ready(Ok(())))
    }

    fn release<'a>(&'a self, key: &'a IdempotencyKey) -> BoxFuture<'a, Result<(), StoreError>> {
        self.shard(key).records.remove(key);
        Box::pin(std::future::ready(Ok(())))
    }

    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        let now = Instant::now();
        let purged = (0..self.shards.len())
            .map(|index| self.lock(index).purge_expired(now))
            .sum();
        Box::pin(std::future::ready(Ok(purged)))
    }
}
