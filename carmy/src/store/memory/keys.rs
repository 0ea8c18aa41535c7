//! The memory engine's idempotency records: independently locked shards, each a hash table
//! of records, the line of its ended records, and its callers' accounts.

mod callers;
mod line;
mod room;

use std::hash::BuildHasher;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use hashbrown::HashTable;
use tokio::sync::watch;
use tokio::time::Instant;

use self::callers::{Callers, Who};
use self::line::Line;
use super::{MemoryStore, RECORDS_PER_SHARD};
use crate::status::ExecutionStatus;
use crate::store::{
    Fingerprint, Finish, IdempotencyKey, KeyStore, Reservation, StoreError, StoredResponse,
};
use crate::tool_error::Category;

/// One shard's part of the store's bounds.
#[derive(Clone, Copy)]
pub(super) struct Limits {
    pub(super) records: usize,
    pub(super) bytes: usize,
}

pub(super) struct Shard {
    /// Where each record is, found by [`MemoryStore::hasher`]'s hash of its key, which the slot
    /// keeps: the table never hashes a key again, and its slots are small (a hash and a place), so
    /// a probe reads little memory.
    index: HashTable<Slot>,
    /// Ended records (finished or uncertain), oldest first. Eviction takes a caller's oldest,
    /// so it mostly reads memory in order instead of a record scattered in a table (at
    /// capacity, every new record evicts one).
    line: Line,
    /// What each caller holds, for its fair share of the bounds.
    callers: Callers,
    /// The sum of the records' [`weight`]s.
    bytes: usize,
}

struct Slot {
    hash: u64,
    place: Place,
}

enum Place {
    /// Boxed: a running record is large, and few are running at once.
    Running(Box<Running>),
    /// Its number in [`Shard::line`].
    Ended(u64),
}

/// A reserved key whose execution has not ended.
struct Running {
    key: IdempotencyKey,
    /// The recorded call's tool, reported on a conflict.
    tool: Arc<str>,
    /// The first half of the fingerprint's SHA-256: 128 bits tell calls apart as surely, and
    /// 16 bytes less per record keeps 100,000 records within 64 MiB.
    digest: [u8; 16],
    execution_id: Arc<str>,
    /// Dropping the sender wakes the duplicates waiting for this execution. It is made for the
    /// first duplicate: most calls have none, and a channel is an allocation and, when dropped,
    /// a wake-up of its eight waiter lists.
    changed: Option<watch::Sender<()>>,
    lease_until: Instant,
    /// A running record lives until its lease, whatever the ttl; then it is uncertain.
    expires_at: Instant,
    /// What the record takes in memory, as [`weight`] counts it.
    bytes: usize,
}

/// A finished or uncertain record. Its texts share one allocation, so evicting it frees one
/// block rather than one per text.
struct Ended {
    /// The hash of its key, to find its slot.
    hash: u64,
    caller: Arc<str>,
    tool: Arc<str>,
    digest: [u8; 16],
    expires_at: Instant,
    /// `None`: uncertain, the call may have happened.
    answer: Option<(ExecutionStatus, Option<Category>)>,
    /// The request id, the execution id, the answer's error code, then its body.
    text: Box<[u8]>,
    request_id_len: usize,
    execution_id_len: usize,
    code_len: Option<usize>,
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

/// What a record is made of, whichever its state: what an ended record is built from.
struct Called<'a> {
    hash: u64,
    caller: &'a Arc<str>,
    request_id: &'a [u8],
    tool: &'a Arc<str>,
    digest: [u8; 16],
    execution_id: &'a [u8],
}

impl Running {
    fn called(&self, hash: u64) -> Called<'_> {
        Called {
            hash,
            caller: &self.key.caller,
            request_id: self.key.request_id.as_bytes(),
            tool: &self.tool,
            digest: self.digest,
            execution_id: self.execution_id.as_bytes(),
        }
    }
}

impl Ended {
    /// The record of `called`, ended with `answer` (`None`: uncertain).
    fn new(called: &Called<'_>, answer: Option<&StoredResponse>, expires_at: Instant) -> Self {
        let code = answer.and_then(|answer| answer.code.as_deref());
        let body = answer.map_or(&[][..], |answer| &answer.body[..]);
        let mut text = Vec::with_capacity(
            called.request_id.len()
                + called.execution_id.len()
                + code.map_or(0, str::len)
                + body.len(),
        );
        text.extend_from_slice(called.request_id);
        text.extend_from_slice(called.execution_id);
        text.extend_from_slice(code.unwrap_or_default().as_bytes());
        text.extend_from_slice(body);
        let bytes = weight(ENDED, called.caller, called.tool, text.len());
        Ended {
            hash: called.hash,
            caller: Arc::clone(called.caller),
            tool: Arc::clone(called.tool),
            digest: called.digest,
            expires_at,
            answer: answer.map(|answer| (answer.status, answer.category)),
            text: text.into_boxed_slice(),
            request_id_len: called.request_id.len(),
            execution_id_len: called.execution_id.len(),
            code_len: code.map(str::len),
            bytes,
        }
    }

    fn called(&self) -> Called<'_> {
        Called {
            hash: self.hash,
            caller: &self.caller,
            request_id: self.request_id(),
            tool: &self.tool,
            digest: self.digest,
            execution_id: self.execution_id(),
        }
    }

    fn request_id(&self) -> &[u8] {
        &self.text[..self.request_id_len]
    }

    fn execution_id(&self) -> &[u8] {
        &self.text[self.request_id_len..][..self.execution_id_len]
    }

    fn is(&self, key: &IdempotencyKey) -> bool {
        self.caller == key.caller && self.request_id() == key.request_id.as_bytes()
    }

    /// The execution id, as the answers that name it carry it.
    fn shared_execution_id(&self) -> Arc<str> {
        Arc::from(String::from_utf8_lossy(self.execution_id()))
    }

    /// What a retry of the call gets.
    fn replay(&self) -> Reservation {
        let Some((status, category)) = self.answer else {
            return Reservation::Uncertain {
                execution_id: self.shared_execution_id(),
            };
        };
        let texts = self.request_id_len + self.execution_id_len;
        let code_len = self.code_len.unwrap_or(0);
        Reservation::Finished(StoredResponse {
            execution_id: self.shared_execution_id(),
            status,
            category,
            code: self
                .code_len
                .map(|_| Arc::from(String::from_utf8_lossy(&self.text[texts..][..code_len]))),
            body: Bytes::copy_from_slice(&self.text[texts + code_len..]),
        })
    }
}

impl MemoryStore {
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

    /// How many records it holds now (running, finished and uncertain).
    pub fn len(&self) -> usize {
        (0..self.shards.len())
            .map(|index| self.lock(index).index.len())
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
    pub(super) fn new(limits: Limits) -> Self {
        Shard {
            index: HashTable::with_capacity(limits.records.min(RECORDS_PER_SHARD)),
            line: Line::default(),
            callers: Callers::new(),
            bytes: 0,
        }
    }

    fn reserve(
        &mut self,
        hash: u64,
        key: &IdempotencyKey,
        claim: Claim<'_>,
        limits: Limits,
        now: Instant,
    ) -> Reservation {
        let Shard { index, line, .. } = self;
        if let Some(slot) = index.find_mut(hash, |slot| {
            picks(slot, hash, line, |record| record.is(key))
        }) {
            match &mut slot.place {
                Place::Running(running) if running.expires_at > now => {
                    if let Some(conflict) = conflict(&running.tool, running.digest, claim) {
                        return conflict;
                    }
                    if running.lease_until > now {
                        let mut changed = running
                            .changed
                            .get_or_insert_with(|| watch::channel(()).0)
                            .subscribe();
                        let lease_until = running.lease_until;
                        return Reservation::Running {
                            execution_id: running.execution_id.clone(),
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
                    // Its execution outlived its lease: from now on it is uncertain.
                    let execution_id = running.execution_id.clone();
                    let expires_at = running.expires_at;
                    let who = self.callers.who(&key.caller);
                    self.end(hash, who, |record| record.is(key), None, expires_at);
                    return Reservation::Uncertain { execution_id };
                }
                Place::Ended(number) => {
                    if let Some(record) = line.get(*number)
                        && record.expires_at > now
                    {
                        return conflict(&record.tool, record.digest, claim)
                            .unwrap_or_else(|| record.replay());
                    }
                }
                Place::Running(_) => {}
            }
            let who = self.callers.who(&key.caller);
            self.remove_if(hash, who, |record| record.is(key));
        }
        // A replay needs no account: the caller's is looked up only for a new record.
        let who = self.callers.who(&key.caller);
        let texts = key.request_id.len() + claim.execution_id.len();
        let bytes = weight(RUNNING, &key.caller, &claim.fingerprint.tool, texts);
        if !self.make_room(limits, who, bytes, None, now) {
            return Reservation::Full;
        }
        let lease_until = now + claim.lease;
        let running = Running {
            key: key.clone(),
            tool: claim.fingerprint.tool.clone(),
            digest: short_digest(claim.fingerprint),
            execution_id: Arc::clone(claim.execution_id),
            changed: None,
            lease_until,
            expires_at: lease_until + claim.ttl,
            bytes,
        };
        let place = Place::Running(Box::new(running));
        self.index
            .insert_unique(hash, Slot { hash, place }, |slot| slot.hash);
        self.bytes += bytes;
        self.callers.add(who, &key.caller, bytes);
        Reservation::Reserved
    }

    fn finish(
        &mut self,
        hash: u64,
        key: &IdempotencyKey,
        finish: Finish<'_>,
        limits: Limits,
        now: Instant,
        ttl: Duration,
    ) {
        let execution_id = finish.execution_id().as_bytes();
        let response = match finish {
            Finish::Response(response) => Some(response),
            Finish::Uncertain { .. } => None,
        };
        let held = |record: Shape<'_>| record.is(key) && record.execution_id() == execution_id;
        let who = self.callers.who(&key.caller);
        let Some(number) = self.end(hash, who, held, response, now + ttl) else {
            return;
        };
        if !self.make_room(limits, who, 0, Some(number), now)
            && let Some(response) = response
        {
            // This answer alone is over the shard's part of the bound: keep that the call
            // happened, not what it answered.
            tracing::warn!(
                answer_bytes = response.body.len(),
                max_bytes = limits.bytes,
                "an answer too large for the idempotency store was not kept: a retry gets \
                 EXECUTION_UNCERTAIN"
            );
            self.end(hash, who, held, None, now + ttl);
        }
    }

    /// Ends the record of hash `hash` that `is_it` picks, held by `who`, with `answer` (`None`:
    /// uncertain), at the back of the line; returns its number there, `None` if there is no such
    /// record.
    fn end(
        &mut self,
        hash: u64,
        who: Who<'_>,
        is_it: impl Fn(Shape<'_>) -> bool,
        answer: Option<&StoredResponse>,
        expires_at: Instant,
    ) -> Option<u64> {
        let Shard {
            index,
            line,
            callers,
            bytes,
        } = self;
        let slot = index.find_mut(hash, |slot| picks(slot, hash, line, &is_it))?;
        let record = match &slot.place {
            Place::Running(running) => Ended::new(&running.called(hash), answer, expires_at),
            Place::Ended(earlier) => Ended::new(&line.get(*earlier)?.called(), answer, expires_at),
        };
        let number = line.next();
        let earlier = std::mem::replace(&mut slot.place, Place::Ended(number));
        let dropped = drop_record(&earlier, line);
        let weight = record.bytes;
        *bytes = *bytes - dropped + weight;
        line.push(record);
        callers.change(who, line, |caller| {
            caller.bytes = caller.bytes - dropped + weight;
            caller.ended.push_back(number);
        });
        // Closing gaps renumbers the line: the record's number is the back's.
        self.compact_if_sparse();
        Some(self.line.next() - 1)
    }

    /// Frees `key` if `execution_id` still holds it.
    fn release(&mut self, hash: u64, key: &IdempotencyKey, execution_id: &str) {
        let who = self.callers.who(&key.caller);
        self.remove_if(hash, who, |record| {
            record.is(key) && record.execution_id() == execution_id.as_bytes()
        });
    }

    /// Drops the record of hash `hash` that `is_it` picks, held by `who`, if there is one, and
    /// its bytes.
    fn remove_if(&mut self, hash: u64, who: Who<'_>, is_it: impl Fn(Shape<'_>) -> bool) {
        let Shard {
            index,
            line,
            callers,
            bytes,
        } = self;
        if let Ok(entry) = index.find_entry(hash, |slot| picks(slot, hash, line, &is_it)) {
            let weight = drop_record(&entry.remove().0.place, line);
            *bytes -= weight;
            callers.left(who, weight, line);
        }
        self.compact_if_sparse();
    }
}

/// A record as a lookup sees it, whichever its state.
#[derive(Clone, Copy)]
enum Shape<'a> {
    Running(&'a Running),
    Ended(&'a Ended),
    /// A slot whose ended record is gone (never left so: a slot goes with its record).
    Missing,
}

impl<'a> Shape<'a> {
    fn is(self, key: &IdempotencyKey) -> bool {
        match self {
            Shape::Running(running) => running.key == *key,
            Shape::Ended(record) => record.is(key),
            Shape::Missing => false,
        }
    }

    fn execution_id(self) -> &'a [u8] {
        match self {
            Shape::Running(running) => running.execution_id.as_bytes(),
            Shape::Ended(record) => record.execution_id(),
            Shape::Missing => &[],
        }
    }
}

fn shape<'a>(slot: &'a Slot, line: &'a Line) -> Shape<'a> {
    match &slot.place {
        Place::Running(running) => Shape::Running(running),
        Place::Ended(number) => line.get(*number).map_or(Shape::Missing, Shape::Ended),
    }
}

/// Whether `slot` holds the record of hash `hash` that `is_it` picks.
fn picks(slot: &Slot, hash: u64, line: &Line, is_it: impl Fn(Shape<'_>) -> bool) -> bool {
    slot.hash == hash && is_it(shape(slot, line))
}

/// Takes the ended record `place` holds out of the line (leaving a gap); returns the bytes the
/// record took, a running one's too (it goes with its slot: dropping it wakes the duplicates
/// waiting for it).
fn drop_record(place: &Place, line: &mut Line) -> usize {
    match place {
        Place::Running(running) => running.bytes,
        Place::Ended(number) => line.take(*number).map_or(0, |record| record.bytes),
    }
}

/// Whether `slot` is the place of the ended record numbered `number`.
fn is_numbered(slot: &Slot, number: u64) -> bool {
    matches!(slot.place, Place::Ended(at) if at == number)
}

/// What a running record takes beyond its texts: its slot, its box, the box's and the texts'
/// `Arc` headers (counted whole even where shared), and a hash table's control byte and slack.
const RUNNING: usize = size_of::<Slot>() + size_of::<Running>() + 4 * 16 + 16;
/// What an ended record takes beyond its texts: its slot, its place in the line and in its
/// caller's account, its block's header, and a hash table's control byte and slack.
const ENDED: usize = size_of::<Slot>() + size_of::<Option<Ended>>() + size_of::<u64>() + 16 + 16;

/// What a record takes in memory, as the bounds count it: `fixed` ([`RUNNING`] or [`ENDED`]),
/// its caller's id and tool (counted whole even where shared), and its other texts.
fn weight(fixed: usize, caller: &str, tool: &str, texts: usize) -> usize {
    fixed + caller.len() + tool.len() + texts
}

/// The answer when `claim` reuses the key of a call to another tool or with other arguments
/// (`tool`, `digest`), if it does.
fn conflict(tool: &Arc<str>, digest: [u8; 16], claim: Claim<'_>) -> Option<Reservation> {
    let other = *tool != claim.fingerprint.tool || digest != short_digest(claim.fingerprint);
    other.then(|| Reservation::Conflict { tool: tool.clone() })
}

fn short_digest(fingerprint: &Fingerprint) -> [u8; 16] {
    let mut digest = [0; 16];
    digest.copy_from_slice(&fingerprint.digest[..16]);
    digest
}

impl KeyStore for MemoryStore {
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
        finish: Finish<'a>,
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
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use bytes::Bytes;

    use super::super::{MAX_SHARDS, MIN_SHARD_BYTES};
    use super::*;

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
        let finished = store.finish(&key, Finish::Response(&response), ttl);
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
            .map(|index| store.lock(index).index.len())
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

    impl Shard {
        /// Every slot finds its record and every record in the line has its slot; the bytes
        /// are the sum of the records' weights; gaps never outnumber records for long.
        fn check(&self, limits: Limits) {
            let mut bytes = 0;
            let mut ended = 0;
            for slot in &self.index {
                match &slot.place {
                    Place::Running(running) => bytes += running.bytes,
                    Place::Ended(number) => {
                        let record = self.line.get(*number).expect("a slot's record is in line");
                        assert_eq!(record.hash, slot.hash);
                        bytes += record.bytes;
                        ended += 1;
                    }
                }
            }
            assert_eq!(self.line.records.iter().flatten().count(), ended);
            assert_eq!(self.bytes, bytes);
            let held = self.index.iter().map(|slot| match &slot.place {
                Place::Running(running) => (&*running.key.caller, running.bytes, None),
                Place::Ended(number) => {
                    let record = self.line.get(*number).expect("checked above");
                    (&*record.caller, record.bytes, Some(*number))
                }
            });
            self.callers.check(&self.line, held);
            assert!(self.index.len() <= limits.records);
            assert!(self.line.records.len() <= 2 * self.index.len().max(16) + 1);
        }
    }

    impl Shard {
        /// The key of every record, as (caller, request id).
        fn keys(&self) -> HashSet<(String, Vec<u8>)> {
            self.index
                .iter()
                .map(|slot| match &slot.place {
                    Place::Running(running) => (
                        running.key.caller.to_string(),
                        running.key.request_id.as_bytes().to_vec(),
                    ),
                    Place::Ended(number) => {
                        let record = self.line.get(*number).expect("a slot's record is in line");
                        (record.caller.to_string(), record.request_id().to_vec())
                    }
                })
                .collect()
        }

        /// The keys of the ended records that have not expired.
        fn live_ended(&self, now: Instant) -> Vec<(String, Vec<u8>)> {
            self.line
                .records
                .iter()
                .flatten()
                .filter(|record| record.expires_at > now)
                .map(|record| (record.caller.to_string(), record.request_id().to_vec()))
                .collect()
        }

        /// What `caller` holds: records and bytes.
        fn holding(&self, caller: &str) -> (usize, usize) {
            self.callers
                .get(self.callers.who(caller))
                .map_or((0, 0), |held| (held.records, held.bytes))
        }
    }

    /// Reserves, finishes (with an answer or uncertain), releases, lets time pass and purges
    /// at random over a small shard, as three callers (one of them flooding), retries, crashes
    /// and expiry would: after each step the index, the line and every caller's account agree,
    /// no step panics, and a caller that loses a live record to another's call held more than
    /// its fair share of either bound.
    #[tokio::test(start_paused = true)]
    async fn the_index_and_the_line_agree_through_random_reservations_and_expiries() {
        const RECORDS: usize = 48;
        const BYTES: usize = 48 * 320;
        let store = MemoryStore::with_limits(RECORDS, BYTES);
        assert_eq!(store.shards.len(), 1);
        let fingerprint = Fingerprint {
            tool: Arc::from("tool"),
            digest: [7; 32],
        };
        let callers = ["flood", "steady", "rare"];
        let mut holders: Vec<Option<Arc<str>>> = vec![None; 3 * 64];
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |below: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % below
        };
        let (mut evicted_by_another, mut refused) = (0, 0);
        for step in 0..30_000 {
            let caller = [0, 0, 0, 0, 0, 1, 1, 2][next(8) as usize];
            let number = next(64) as usize;
            let held = caller * 64 + number;
            let key = IdempotencyKey::new(callers[caller], format!("req-{number}"));
            let seconds = |n| Duration::from_secs(n);
            // Now and then a record kept for an hour holds the front of the line while those
            // behind it expire: gaps build up behind it.
            let ttl = seconds(if next(16) == 0 { 3_600 } else { 1 + next(3) });
            let before = {
                let shard = store.lock(0);
                let holdings = callers.map(|caller| shard.holding(caller));
                (
                    shard.live_ended(Instant::now()),
                    holdings,
                    shard.callers.len(),
                )
            };
            match next(12) {
                0..=3 => {
                    let execution_id: Arc<str> = Arc::from(format!("exec_{number}_{step}"));
                    let reserved = futures_util::FutureExt::now_or_never(store.reserve(
                        &key,
                        &fingerprint,
                        &execution_id,
                        seconds(1 + next(4)),
                        ttl,
                    ));
                    match reserved {
                        Some(Ok(Reservation::Reserved)) => holders[held] = Some(execution_id),
                        Some(Ok(Reservation::Full)) => refused += 1,
                        _ => {}
                    }
                }
                4..=7 => {
                    if let Some(execution_id) = holders[held].take() {
                        let padding = "x".repeat(next(400) as usize);
                        let response = StoredResponse {
                            body: Bytes::from(format!("{{\"n\":{step},\"p\":\"{padding}\"}}")),
                            execution_id,
                            status: ExecutionStatus::Completed,
                            category: None,
                            code: None,
                        };
                        let finish = if next(3) == 0 {
                            Finish::Uncertain {
                                execution_id: &response.execution_id,
                            }
                        } else {
                            Finish::Response(&response)
                        };
                        let finished = store.finish(&key, finish, ttl);
                        assert!(futures_util::FutureExt::now_or_never(finished).is_some());
                    }
                }
                8 => {
                    if let Some(execution_id) = holders[held].take() {
                        let released = store.release(&key, &execution_id);
                        assert!(futures_util::FutureExt::now_or_never(released).is_some());
                    }
                }
                9 | 10 => tokio::time::advance(Duration::from_millis(next(800))).await,
                _ => {
                    let purged = store.purge_expired();
                    assert!(futures_util::FutureExt::now_or_never(purged).is_some());
                }
            }
            let shard = store.lock(0);
            shard.check(store.limits);
            let (live, holdings, count) = before;
            let after = shard.keys();
            let acting = usize::from(holdings[caller] == (0, 0));
            for (other, request_id) in live {
                if other == callers[caller] || after.contains(&(other.clone(), request_id)) {
                    continue;
                }
                evicted_by_another += 1;
                let index = callers.iter().position(|id| *id == other).unwrap();
                let (records, bytes) = holdings[index];
                let share = count + acting;
                assert!(
                    records > RECORDS / share || bytes > BYTES / share,
                    "step {step}: {other} lost a record to {} holding {records} records and \
                     {bytes} bytes, within its share of {share}",
                    callers[caller]
                );
            }
        }
        // The bounds were reached both ways.
        assert!(
            evicted_by_another > 0 && refused > 0,
            "{evicted_by_another} {refused}"
        );
    }

    /// Reserves `request_id` for `caller` and leaves it running.
    fn reserve(store: &MemoryStore, caller: &str, request_id: &str) -> Reservation {
        let key = IdempotencyKey::new(caller, request_id);
        let fingerprint = Fingerprint {
            tool: Arc::from("tool"),
            digest: [7; 32],
        };
        let execution_id: Arc<str> = Arc::from(format!("exec_{request_id}"));
        let ttl = Duration::from_secs(60);
        let reserved = store.reserve(&key, &fingerprint, &execution_id, ttl, ttl);
        futures_util::FutureExt::now_or_never(reserved)
            .expect("the memory store answers at once")
            .expect("the memory store does not fail")
    }

    #[tokio::test]
    async fn a_caller_within_its_share_keeps_its_records_through_anothers_flood() {
        let store = MemoryStore::with_limits(16, MIN_SHARD_BYTES);
        record(&store, "kim", "order-1");
        record(&store, "kim", "order-2");
        for number in 0..1_000 {
            record(&store, "ivan", &format!("flood-{number}"));
        }
        assert_eq!(store.len(), 16);
        for request_id in ["order-1", "order-2"] {
            let execution_id = format!("exec_{request_id}");
            assert_eq!(
                replayed(&store, "kim", request_id).as_deref(),
                Some(&*execution_id)
            );
        }
        // The flood made room with its own oldest records: its newest are kept.
        assert_eq!(
            replayed(&store, "ivan", "flood-999").as_deref(),
            Some("exec_flood-999")
        );
        assert_eq!(replayed(&store, "ivan", "flood-0"), None);
        store.lock(0).check(store.limits);
    }

    #[tokio::test]
    async fn a_newcomer_takes_room_from_the_caller_over_its_share() {
        let store = MemoryStore::with_limits(4, MIN_SHARD_BYTES);
        for request_id in ["a", "b", "c", "d"] {
            record(&store, "ivan", request_id);
        }
        record(&store, "kim", "order");
        assert_eq!(store.len(), 4);
        assert_eq!(
            replayed(&store, "ivan", "a"),
            None,
            "the oldest of the heaviest went"
        );
        assert_eq!(
            replayed(&store, "kim", "order").as_deref(),
            Some("exec_order")
        );
        store.lock(0).check(store.limits);
    }

    #[tokio::test]
    async fn running_records_never_go_and_a_caller_at_its_share_of_them_is_refused() {
        let store = MemoryStore::with_limits(4, MIN_SHARD_BYTES);
        for request_id in ["a", "b"] {
            assert!(matches!(
                reserve(&store, "ivan", request_id),
                Reservation::Reserved
            ));
        }
        record(&store, "kim", "order-1");
        record(&store, "kim", "order-2");
        // Ivan holds his half, all running: he waits for his own to end.
        assert!(matches!(reserve(&store, "ivan", "c"), Reservation::Full));
        // Kim, at her share, makes room with her own oldest.
        record(&store, "kim", "order-3");
        store.lock(0).check(store.limits);
        assert_eq!(
            replayed(&store, "kim", "order-2").as_deref(),
            Some("exec_order-2")
        );
        assert_eq!(replayed(&store, "kim", "order-1"), None);

        // Only running records: nobody gets in.
        let store = MemoryStore::with_limits(2, MIN_SHARD_BYTES);
        for request_id in ["a", "b"] {
            assert!(matches!(
                reserve(&store, "ivan", request_id),
                Reservation::Reserved
            ));
        }
        assert!(matches!(reserve(&store, "kim", "order"), Reservation::Full));
        store.lock(0).check(store.limits);
    }

    /// Records removed out of turn (expired, then recorded again) leave gaps in the line of
    /// ended records. The line closes them once they outnumber the records: it stays bounded,
    /// and every record is still found, evicted in its turn, and counted once.
    #[tokio::test(start_paused = true)]
    async fn gaps_left_out_of_turn_are_closed_and_no_record_is_lost() {
        let store = MemoryStore::with_limits(8, MIN_SHARD_BYTES);
        assert_eq!(store.shards.len(), 1);
        let keys = ["a", "b", "c", "d"];
        for round in 0..40 {
            if round > 0 {
                // Past the 60 s ttl: each key is recorded anew, leaving a gap.
                tokio::time::advance(Duration::from_secs(61)).await;
            }
            for key in keys {
                record(&store, "caller", key);
            }
        }
        assert!(
            store.lock(0).line.records.len() <= 32,
            "the line grew with its gaps"
        );
        assert_eq!(store.len(), 4);
        let fresh = MemoryStore::with_limits(8, MIN_SHARD_BYTES);
        for key in keys {
            record(&fresh, "caller", key);
        }
        assert_eq!(store.bytes(), fresh.bytes(), "each record counted once");

        // Five more over a capacity of eight: the oldest, `a`, goes.
        for key in ["e", "f", "g", "h", "i"] {
            record(&store, "caller", key);
        }
        assert_eq!(store.len(), 8);
        for key in ["b", "c", "d", "e", "f", "g", "h", "i"] {
            let execution_id = format!("exec_{key}");
            assert_eq!(
                replayed(&store, "caller", key).as_deref(),
                Some(&*execution_id)
            );
        }
        assert_eq!(replayed(&store, "caller", "a"), None, "a was evicted");

        // Past every ttl and lease, a purge leaves nothing behind: eight records, `a` reserved
        // by the lookup above in the place of `b`, the oldest then.
        tokio::time::advance(Duration::from_secs(61)).await;
        let purged = futures_util::FutureExt::now_or_never(store.purge_expired());
        assert!(matches!(purged, Some(Ok(8))), "{purged:?}");
        assert_eq!((store.len(), store.bytes()), (0, 0));
        assert!(store.lock(0).line.records.is_empty());
    }

    /// A key recorded again after its record expired leaves a gap where it stood in the line
    /// of ended records: the gap evicts nothing, and the key leaves at its new place.
    #[tokio::test(start_paused = true)]
    async fn a_key_recorded_again_is_evicted_at_its_new_place_in_line() {
        let store = MemoryStore::with_limits(2, MIN_SHARD_BYTES);
        assert_eq!(store.shards.len(), 1);
        record(&store, "caller", "a");
        // Past its 60 s ttl, `a` is recorded anew after `b`.
        tokio::time::advance(Duration::from_secs(61)).await;
        record(&store, "caller", "b");
        record(&store, "caller", "a");
        assert_eq!(store.lock(0).line.records.len(), 3);
        // Room for `c`: `b` is the oldest record, not the `a` of the stale entry.
        record(&store, "caller", "c");
        assert_eq!(store.len(), 2);
        assert_eq!(replayed(&store, "caller", "a").as_deref(), Some("exec_a"));
        assert_eq!(replayed(&store, "caller", "c").as_deref(), Some("exec_c"));
        assert_eq!(replayed(&store, "caller", "b"), None, "b was evicted");
    }
}
