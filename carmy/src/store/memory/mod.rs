//! The default engine: in memory, bounded; each concern in a file of its own (records in
//! [`keys`], events in [`outbox`], executions those of every in-process engine).

mod approvals;
mod keys;
mod outbox;

use std::hash::RandomState;
use std::sync::Mutex;

use self::approvals::MemoryApprovals;
use self::keys::{Limits, Shard};
use self::outbox::MemoryOutbox;
use super::ProcessExecutions;

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

/// The default engine: idempotency records, executions and events in this process's memory.
/// Zero setup, lost on restart, private to one replica (use a shared store when running
/// several).
///
/// Bounded by a number of records and by the bytes they take (recorded answers, keys, ids):
/// when full it evicts the oldest finished records first and never a running one, and each
/// caller (the key's caller id) has a fair share: a caller holding at least its share makes
/// room with its own oldest records, and one within its share never loses a record to
/// another's. A reservation that finds no record it may evict (its caller's are all running,
/// or only running ones remain) is refused (`IDEMPOTENCY_CAPACITY`). Records live in
/// independently locked shards, so concurrent calls rarely contend; each shard holds an equal
/// part of both bounds, shared fairly among the callers holding records there, and an answer
/// larger than a shard's part is not kept: the record turns uncertain (a retry gets
/// `EXECUTION_UNCERTAIN`, never a second run).
///
/// It also keeps executions for their callers (`protocol.md` §9), for this process only:
/// another replica cannot look them up. They have a byte bound of their own, `max_bytes` as
/// well, shared fairly among the callers in the same way: when it is reached, the executions
/// that ended first are dropped (a caller at its share's own first), never a running one, and
/// a new execution that still does not fit is refused (`503 IDEMPOTENCY_UNAVAILABLE`).
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
    approvals: MemoryApprovals,
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
                .map(|_| Mutex::new(Shard::new(limits)))
                .collect(),
            limits,
            hasher,
            executions: ProcessExecutions::new(max_bytes),
            outbox: MemoryOutbox::new(max_bytes),
            approvals: MemoryApprovals::default(),
        }
    }

    /// How many bytes the kept executions take now, as their bound counts them.
    pub fn execution_bytes(&self) -> usize {
        self.executions.bytes()
    }
}

// The executions are kept in this process, as the file engine keeps them.
super::process_executions::kept_in_process!(MemoryStore);
