//! The executions of the in-process engines (memory, file): kept in this process's memory,
//! bounded by bytes, each caller with a fair share of the bound.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;

use super::executions::RECHECK;
use super::{
    Cancellation, ExecutionQuery, ExecutionRecord, ExecutionState, ExecutionSummary, KEPT_PROGRESS,
    RecordedEvent, RecordedOutcome, StoreError,
};

/// The executions of an in-process store (memory, file): a map by id, an index per caller,
/// bounded by bytes (finished executions are evicted oldest first, running ones never), with a
/// fair share of the bound for each caller: a caller holding at least its share makes room with
/// its own executions, and one within its share never loses one to another's.
pub(crate) struct ProcessExecutions {
    inner: Mutex<Executions>,
    max_bytes: usize,
}

#[derive(Default)]
struct Executions {
    by_id: HashMap<Arc<str>, Kept>,
    /// What each caller holds.
    by_caller: HashMap<Arc<str>, Owned>,
    /// Ended executions, oldest end first: expiry order. One evicted out of turn stays until it
    /// comes to the front, or until they outnumber the others.
    ended: VecDeque<Arc<str>>,
    /// How many of `ended` are no longer kept.
    stale: usize,
    bytes: usize,
    /// The caller that held the most bytes when last compared, with them (exact for it): the
    /// first asked to make room for a caller under its share, without a scan. A hint, checked
    /// before it is used.
    heaviest: Option<(Arc<str>, usize)>,
}

/// One caller's executions.
#[derive(Default)]
struct Owned {
    /// Its execution ids in creation (id) order.
    ids: BTreeMap<Arc<str>, ()>,
    /// Its ended executions, oldest end first.
    ended: VecDeque<Arc<str>>,
    /// What its executions take, as the bound counts them.
    bytes: usize,
}

struct Kept {
    caller: Arc<str>,
    tool: Arc<str>,
    progress: VecDeque<RecordedEvent>,
    outcome: Option<RecordedOutcome>,
    cancel_requested: bool,
    /// Sent on every change (event, end, cancellation request).
    changed: watch::Sender<()>,
    expires_at: Instant,
    bytes: usize,
}

impl Kept {
    fn weight(&self, execution_id: &str) -> usize {
        const FIXED: usize = size_of::<Kept>() + 3 * 16 + 64;
        FIXED
            + 2 * execution_id.len()
            + self.caller.len()
            + self.tool.len()
            + self
                .progress
                .iter()
                .map(|event| event.data.len() + size_of::<RecordedEvent>())
                .sum::<usize>()
            + self.outcome.as_ref().map_or(0, |outcome| {
                outcome.response.body.len() + outcome.response.code.as_deref().map_or(0, str::len)
            })
    }
}

/// An answer the in-process store has at once.
fn ready<T: Send + 'static>(value: T) -> BoxFuture<'static, Result<T, StoreError>> {
    Box::pin(std::future::ready(Ok(value)))
}

impl ProcessExecutions {
    pub(crate) fn new(max_bytes: usize) -> Self {
        ProcessExecutions {
            inner: Mutex::new(Executions::default()),
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Executions> {
        // No code panics while holding the lock; recover the data if it ever happens.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many bytes the kept executions take, as the bound counts them.
    pub(crate) fn bytes(&self) -> usize {
        self.lock().bytes
    }

    pub(crate) fn begin(
        &self,
        caller: &str,
        execution_id: &Arc<str>,
        tool: &str,
        lease: Duration,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let now = Instant::now();
        let mut executions = self.lock();
        executions.expire_ended(now);
        let mut kept = Kept {
            caller: Arc::from(caller),
            tool: Arc::from(tool),
            progress: VecDeque::new(),
            outcome: None,
            cancel_requested: false,
            changed: watch::channel(()).0,
            // A running execution is never evicted; past its lease (its process died) it may.
            expires_at: now + lease,
            bytes: 0,
        };
        kept.bytes = kept.weight(execution_id);
        if !executions.make_room(&kept.caller, kept.bytes, None, self.max_bytes) {
            return Box::pin(std::future::ready(Err(StoreError::message(
                "the store is full of running executions, or the caller's share is",
            ))));
        }
        executions.bytes += kept.bytes;
        let owned = executions
            .by_caller
            .entry(Arc::clone(&kept.caller))
            .or_default();
        owned.ids.insert(Arc::clone(execution_id), ());
        owned.bytes += kept.bytes;
        let held = owned.bytes;
        executions.note(&kept.caller, held);
        executions.by_id.insert(Arc::clone(execution_id), kept);
        ready(())
    }

    pub(crate) fn progress(
        &self,
        execution_id: &str,
        event: RecordedEvent,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let mut executions = self.lock();
        let Some(kept) = executions
            .by_id
            .get_mut(execution_id)
            .filter(|kept| kept.outcome.is_none())
        else {
            return ready(());
        };
        kept.progress.push_back(event);
        if kept.progress.len() > KEPT_PROGRESS {
            kept.progress.pop_front();
        }
        let weight = kept.weight(execution_id);
        let previous = std::mem::replace(&mut kept.bytes, weight);
        kept.changed.send_replace(());
        let caller = Arc::clone(&kept.caller);
        executions.resize(&caller, previous, weight);
        ready(())
    }

    pub(crate) fn end(
        &self,
        execution_id: &str,
        outcome: RecordedOutcome,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let now = Instant::now();
        let mut executions = self.lock();
        let Some(id) = executions
            .by_id
            .get_key_value(execution_id)
            .map(|(id, _)| Arc::clone(id))
        else {
            return ready(());
        };
        let Some(kept) = executions
            .by_id
            .get_mut(execution_id)
            .filter(|kept| kept.outcome.is_none())
        else {
            return ready(());
        };
        kept.outcome = Some(outcome);
        kept.expires_at = now + ttl;
        let weight = kept.weight(execution_id);
        let previous = std::mem::replace(&mut kept.bytes, weight);
        kept.changed.send_replace(());
        let caller = Arc::clone(&kept.caller);
        executions.resize(&caller, previous, weight);
        executions.ended.push_back(Arc::clone(&id));
        if let Some(owned) = executions.by_caller.get_mut(&caller) {
            owned.ended.push_back(Arc::clone(&id));
        }
        // Beyond the bound, until other executions end, if none but this one may go: it is
        // being read back, or waited for.
        let max_bytes = self.max_bytes;
        executions.expire_ended(now);
        executions.make_room(&caller, 0, Some(&id), max_bytes);
        ready(())
    }

    pub(crate) fn get(
        &self,
        caller: &str,
        execution_id: &str,
    ) -> BoxFuture<'static, Result<Option<ExecutionRecord>, StoreError>> {
        ready(self.record(caller, execution_id))
    }

    fn record(&self, caller: &str, execution_id: &str) -> Option<ExecutionRecord> {
        let executions = self.lock();
        let (id, kept) = executions.by_id.get_key_value(execution_id)?;
        if *kept.caller != *caller || kept.expires_at <= Instant::now() && kept.outcome.is_some() {
            return None;
        }
        Some(ExecutionRecord {
            execution_id: Arc::clone(id),
            tool: Arc::clone(&kept.tool),
            progress: kept.progress.iter().cloned().collect(),
            outcome: kept.outcome.clone(),
            cancel_requested: kept.cancel_requested,
        })
    }

    pub(crate) fn list(
        &self,
        caller: &str,
        query: &ExecutionQuery,
    ) -> BoxFuture<'static, Result<Vec<ExecutionSummary>, StoreError>> {
        ready(self.summaries(caller, query))
    }

    fn summaries(&self, caller: &str, query: &ExecutionQuery) -> Vec<ExecutionSummary> {
        let now = Instant::now();
        let executions = self.lock();
        let Some(ids) = executions.by_caller.get(caller).map(|owned| &owned.ids) else {
            return Vec::new();
        };
        let upper = match &query.before {
            Some(before) => Bound::Excluded(before.as_str()),
            None => Bound::Unbounded,
        };
        ids.range::<str, _>((Bound::Unbounded, upper))
            .rev()
            .filter_map(|(id, ())| {
                let kept = executions.by_id.get(id)?;
                let live = kept.outcome.is_none() || kept.expires_at > now;
                let state = kept
                    .outcome
                    .as_ref()
                    .map_or(ExecutionState::Running, |outcome| {
                        ExecutionState::Ended(outcome.response.status)
                    });
                let wanted = live
                    && query.state.is_none_or(|wanted| wanted == state)
                    && query.tool.as_deref().is_none_or(|tool| tool == &*kept.tool);
                wanted.then(|| ExecutionSummary {
                    execution_id: Arc::clone(id),
                    tool: Arc::clone(&kept.tool),
                    state,
                })
            })
            .take(query.limit)
            .collect()
    }

    pub(crate) fn cancel(
        &self,
        caller: &str,
        execution_id: &str,
    ) -> BoxFuture<'static, Result<Cancellation, StoreError>> {
        let mut executions = self.lock();
        let found = match executions.by_id.get_mut(execution_id) {
            Some(kept) if *kept.caller == *caller => {
                if kept.outcome.is_some() {
                    Cancellation::Ended
                } else {
                    kept.cancel_requested = true;
                    kept.changed.send_replace(());
                    Cancellation::Requested
                }
            }
            _ => Cancellation::NotFound,
        };
        ready(found)
    }

    pub(crate) fn changed(&self, execution_id: &str) -> BoxFuture<'static, ()> {
        let receiver = self
            .lock()
            .by_id
            .get(execution_id)
            .map(|kept| kept.changed.subscribe());
        match receiver {
            Some(mut receiver) => Box::pin(async move {
                // An error means the execution was evicted: a change too.
                let _ = receiver.changed().await;
            }),
            None => Box::pin(tokio::time::sleep(RECHECK)),
        }
    }

    pub(crate) fn purge_expired(&self) -> usize {
        self.lock().expire(Instant::now())
    }
}

impl Executions {
    /// Makes room for `incoming` more bytes of `caller`'s (none: room for what is held, its
    /// execution `keep` having grown on ending), evicting ended executions: those of `caller`,
    /// oldest first, when it holds its fair share (the bound divided among the callers holding
    /// executions, `caller` counted); otherwise those of the caller holding the most among the
    /// callers over their share. Never a running one, nor `keep`. `false` if it cannot.
    fn make_room(
        &mut self,
        caller: &Arc<str>,
        incoming: usize,
        keep: Option<&str>,
        max_bytes: usize,
    ) -> bool {
        while self.bytes + incoming > max_bytes {
            let held = self.by_caller.get(caller);
            let callers = self.by_caller.len() + usize::from(held.is_none());
            let share = max_bytes / callers;
            let own = held
                .filter(|owned| owned.bytes + incoming > share)
                .map(|owned| {
                    owned
                        .ended
                        .front()
                        .filter(|oldest| Some(&***oldest) != keep)
                });
            let victim = match own {
                Some(Some(oldest)) => Some(Arc::clone(oldest)),
                // A new execution of a caller at its share waits for its own to end.
                Some(None) if keep.is_none() => None,
                _ => self.oldest_of_heaviest(share, caller),
            };
            let Some(victim) = victim else {
                return false;
            };
            self.remove(&victim);
            // Still in the line of ended executions, until it comes to the front.
            self.stale += 1;
        }
        if self.stale > self.ended.len() / 2 {
            let by_id = &self.by_id;
            self.ended.retain(|id| by_id.contains_key(id));
            self.stale = 0;
        }
        true
    }

    /// The oldest ended execution of the caller holding the most bytes among those over
    /// `share` that have one, other than `except`.
    fn oldest_of_heaviest(&mut self, share: usize, except: &str) -> Option<Arc<str>> {
        let candidate = |caller: &str, owned: &Owned| caller != except && owned.bytes > share;
        if let Some((heaviest, _)) = &self.heaviest
            && let Some(owned) = self.by_caller.get(heaviest)
            && candidate(heaviest, owned)
            && let Some(oldest) = owned.ended.front()
        {
            return Some(Arc::clone(oldest));
        }
        let (caller, owned) = self
            .by_caller
            .iter()
            .filter(|(caller, owned)| candidate(caller, owned) && !owned.ended.is_empty())
            .max_by_key(|(_, owned)| owned.bytes)?;
        self.heaviest = Some((Arc::clone(caller), owned.bytes));
        owned.ended.front().cloned()
    }

    /// Notes that `caller` now holds `bytes`.
    fn note(&mut self, caller: &Arc<str>, bytes: usize) {
        match &mut self.heaviest {
            Some((heaviest, most)) if heaviest == caller => *most = bytes,
            Some((_, most)) if *most >= bytes => {}
            _ => self.heaviest = Some((Arc::clone(caller), bytes)),
        }
    }

    /// One of `caller`'s executions went from `previous` bytes to `weight`.
    fn resize(&mut self, caller: &Arc<str>, previous: usize, weight: usize) {
        self.bytes = self.bytes - previous + weight;
        if let Some(owned) = self.by_caller.get_mut(caller) {
            owned.bytes = owned.bytes - previous + weight;
            let held = owned.bytes;
            self.note(caller, held);
        }
    }

    /// Drops the ended executions past their ttl, oldest first (one ttl for all: the queue is
    /// in expiry order).
    fn expire_ended(&mut self, now: Instant) {
        while let Some(oldest) = self.ended.front() {
            match self.by_id.get(oldest) {
                Some(kept) if kept.expires_at > now => break,
                Some(_) => {
                    let oldest = Arc::clone(oldest);
                    self.ended.pop_front();
                    self.remove(&oldest);
                }
                None => {
                    self.ended.pop_front();
                    self.stale = self.stale.saturating_sub(1);
                }
            }
        }
    }

    /// Drops the ended executions past their ttl, and the running ones past their lease.
    fn expire(&mut self, now: Instant) -> usize {
        let expired: Vec<Arc<str>> = self
            .by_id
            .iter()
            .filter(|(_, kept)| kept.expires_at <= now)
            .map(|(id, _)| Arc::clone(id))
            .collect();
        for id in &expired {
            self.remove(id);
        }
        if !expired.is_empty() {
            let by_id = &self.by_id;
            self.ended.retain(|id| by_id.contains_key(id));
            self.stale = 0;
            for owned in self.by_caller.values_mut() {
                owned.ended.retain(|id| by_id.contains_key(id));
            }
        }
        expired.len()
    }

    /// Drops the execution `execution_id`; one that ended must be the oldest of its caller's
    /// (or be followed by a retain of their line).
    fn remove(&mut self, execution_id: &str) {
        let Some(kept) = self.by_id.remove(execution_id) else {
            return;
        };
        self.bytes -= kept.bytes;
        let Some(owned) = self.by_caller.get_mut(&kept.caller) else {
            return;
        };
        owned.ids.remove(execution_id);
        owned.bytes -= kept.bytes;
        if owned
            .ended
            .front()
            .is_some_and(|oldest| **oldest == *execution_id)
        {
            owned.ended.pop_front();
        }
        if owned.ids.is_empty() {
            self.by_caller.remove(&kept.caller);
            if self
                .heaviest
                .as_ref()
                .is_some_and(|(heaviest, _)| *heaviest == kept.caller)
            {
                self.heaviest = None;
            }
        } else {
            let held = owned.bytes;
            self.note(&kept.caller, held);
        }
    }
}

/// `ExecutionStore` for an engine whose executions live in this process, in its
/// `ProcessExecutions` field `executions` (the memory and file engines).
macro_rules! kept_in_process {
    ($engine:ty) => {
        impl $crate::store::ExecutionStore for $engine {
            fn begin_execution<'a>(
                &'a self,
                caller: &'a str,
                execution_id: &'a std::sync::Arc<str>,
                tool: &'a str,
                lease: std::time::Duration,
            ) -> futures_util::future::BoxFuture<'a, Result<(), $crate::store::StoreError>> {
                self.executions.begin(caller, execution_id, tool, lease)
            }

            fn record_progress<'a>(
                &'a self,
                execution_id: &'a str,
                event: $crate::store::RecordedEvent,
            ) -> futures_util::future::BoxFuture<'a, Result<(), $crate::store::StoreError>> {
                self.executions.progress(execution_id, event)
            }

            fn end_execution<'a>(
                &'a self,
                execution_id: &'a str,
                outcome: $crate::store::RecordedOutcome,
                ttl: std::time::Duration,
            ) -> futures_util::future::BoxFuture<'a, Result<(), $crate::store::StoreError>> {
                self.executions.end(execution_id, outcome, ttl)
            }

            fn execution<'a>(
                &'a self,
                caller: &'a str,
                execution_id: &'a str,
            ) -> futures_util::future::BoxFuture<
                'a,
                Result<Option<$crate::store::ExecutionRecord>, $crate::store::StoreError>,
            > {
                self.executions.get(caller, execution_id)
            }

            fn executions<'a>(
                &'a self,
                caller: &'a str,
                query: &'a $crate::store::ExecutionQuery,
            ) -> futures_util::future::BoxFuture<
                'a,
                Result<Vec<$crate::store::ExecutionSummary>, $crate::store::StoreError>,
            > {
                self.executions.list(caller, query)
            }

            fn cancel_execution<'a>(
                &'a self,
                caller: &'a str,
                execution_id: &'a str,
            ) -> futures_util::future::BoxFuture<
                'a,
                Result<$crate::store::Cancellation, $crate::store::StoreError>,
            > {
                self.executions.cancel(caller, execution_id)
            }

            fn execution_changed(
                &self,
                execution_id: &str,
            ) -> futures_util::future::BoxFuture<'static, ()> {
                self.executions.changed(execution_id)
            }
        }
    };
}

pub(super) use kept_in_process;

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use bytes::Bytes;
    use futures_util::FutureExt;

    use super::*;
    use crate::status::ExecutionStatus;
    use crate::store::StoredResponse;
    use crate::tool_error::Category;

    const MAX_BYTES: usize = 16 * 1024;

    fn outcome(execution_id: &str, body: usize) -> RecordedOutcome {
        RecordedOutcome {
            response: StoredResponse {
                execution_id: Arc::from(execution_id),
                status: ExecutionStatus::Completed,
                category: None::<Category>,
                code: None,
                body: Bytes::from(vec![b' '; body]),
            },
            event_id: 2,
        }
    }

    fn id(caller: &str, number: usize) -> Arc<str> {
        Arc::from(format!("exec_{caller}_{number}"))
    }

    /// Begins and ends `caller`'s execution `number`; `false` if it was refused.
    fn run(executions: &ProcessExecutions, caller: &str, number: usize, body: usize) -> bool {
        let id = id(caller, number);
        let lease = Duration::from_secs(60);
        let begun = executions.begin(caller, &id, "tool", lease).now_or_never();
        if !matches!(begun, Some(Ok(()))) {
            return false;
        }
        let ended = executions
            .end(&id, outcome(&id, body), lease)
            .now_or_never();
        assert!(matches!(ended, Some(Ok(()))));
        true
    }

    fn kept(executions: &ProcessExecutions, caller: &str, number: usize) -> bool {
        let record = executions.get(caller, &id(caller, number)).now_or_never();
        matches!(record, Some(Ok(Some(_))))
    }

    impl Executions {
        /// Every account matches the executions, and every line its ended executions.
        fn check(&self) {
            let mut bytes = HashMap::<&str, usize>::new();
            for (id, kept) in &self.by_id {
                *bytes.entry(&kept.caller).or_default() += kept.bytes;
                let owned = &self.by_caller[&kept.caller];
                assert!(owned.ids.contains_key(id));
            }
            assert_eq!(self.bytes, bytes.values().sum::<usize>());
            assert_eq!(self.by_caller.len(), bytes.len(), "one account per caller");
            for (caller, owned) in &self.by_caller {
                assert_eq!(owned.bytes, bytes[&**caller], "{caller}");
                let ended: Vec<&Arc<str>> = self
                    .ended
                    .iter()
                    .filter(|id| {
                        self.by_id
                            .get(*id)
                            .is_some_and(|kept| kept.caller == *caller)
                    })
                    .collect();
                assert_eq!(owned.ended.iter().collect::<Vec<_>>(), ended, "{caller}");
            }
            let stale = self.ended.iter().filter(|id| !self.by_id.contains_key(*id));
            assert_eq!(stale.count(), self.stale);
            let ended: HashSet<&Arc<str>> = self.ended.iter().collect();
            for (id, kept) in &self.by_id {
                assert_eq!(kept.outcome.is_some(), ended.contains(id), "{id}");
            }
        }
    }

    #[tokio::test]
    async fn a_flood_by_one_caller_keeps_another_callers_finished_executions() {
        let executions = ProcessExecutions::new(MAX_BYTES);
        assert!(run(&executions, "kim", 0, 100));
        assert!(run(&executions, "kim", 1, 100));
        for number in 0..1_000 {
            assert!(run(&executions, "ivan", number, 100), "{number}");
        }
        assert!(executions.bytes() <= MAX_BYTES);
        assert!(kept(&executions, "kim", 0) && kept(&executions, "kim", 1));
        assert!(
            kept(&executions, "ivan", 999),
            "the flood's newest are kept"
        );
        assert!(!kept(&executions, "ivan", 0), "its oldest made room");
        executions.lock().check();
    }

    #[tokio::test]
    async fn a_caller_at_its_share_of_running_executions_is_refused_while_others_are_not() {
        let executions = ProcessExecutions::new(MAX_BYTES);
        let lease = Duration::from_secs(60);
        let mut running = 0;
        while executions
            .begin("ivan", &id("ivan", running), "tool", lease)
            .now_or_never()
            .is_some_and(|begun| begun.is_ok())
        {
            running += 1;
        }
        assert!(running > 10, "{running}");
        // Nothing of Ivan's may go, nor room be taken from him: Kim is refused too.
        assert!(!run(&executions, "kim", 0, 100));
        // Once his executions end, Kim gets her share from his.
        for number in 0..running {
            let id = id("ivan", number);
            let ended = executions.end(&id, outcome(&id, 0), lease).now_or_never();
            assert!(matches!(ended, Some(Ok(()))));
        }
        for number in 0..10 {
            assert!(run(&executions, "kim", number, 100), "{number}");
        }
        assert!(!run(&executions, "ivan", running, 100) || kept(&executions, "kim", 0));
        assert!((0..10).all(|number| kept(&executions, "kim", number)));
        executions.lock().check();
    }

    /// Begins, reports progress, ends, lets time pass and purges at random as three callers
    /// (one flooding): after each step the accounts agree with the executions, and a caller
    /// that loses a finished execution to another's step held more than its fair share.
    #[tokio::test(start_paused = true)]
    async fn the_accounts_agree_through_random_executions_and_expiries() {
        let executions = ProcessExecutions::new(MAX_BYTES);
        let callers = ["flood", "steady", "rare"];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |below: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % below
        };
        let mut running: Vec<(usize, Arc<str>)> = Vec::new();
        let (mut evicted_by_another, mut refused) = (0, 0);
        for step in 0..20_000 {
            let caller = [0, 0, 0, 0, 0, 1, 1, 2][next(8) as usize];
            let before: Vec<(Arc<str>, Arc<str>, usize, usize)> = {
                let inner = executions.lock();
                let now = Instant::now();
                inner
                    .by_id
                    .iter()
                    .filter(|(_, kept)| kept.outcome.is_some() && kept.expires_at > now)
                    .map(|(id, kept)| {
                        let owned = &inner.by_caller[&kept.caller];
                        (
                            Arc::clone(id),
                            Arc::clone(&kept.caller),
                            owned.bytes,
                            inner.by_caller.len(),
                        )
                    })
                    .collect()
            };
            let acting_new = !executions.lock().by_caller.contains_key(callers[caller]);
            // The caller whose step may make room: nobody's but a beginning or ending one's.
            let mut acting = None;
            match next(10) {
                0..=3 => {
                    let id: Arc<str> = Arc::from(format!("exec_{step}"));
                    let lease = Duration::from_secs(1 + next(3));
                    let begun = executions.begin(callers[caller], &id, "tool", lease);
                    acting = Some(callers[caller]);
                    match begun.now_or_never() {
                        Some(Ok(())) => running.push((caller, id)),
                        _ => refused += 1,
                    }
                }
                4 => {
                    if let Some((_, id)) = running.get(next(running.len().max(1) as u64) as usize) {
                        let data = Bytes::from(vec![b'p'; next(200) as usize]);
                        let event = RecordedEvent { id: step, data };
                        assert!(executions.progress(id, event).now_or_never().is_some());
                    }
                }
                5..=7 => {
                    if !running.is_empty() {
                        let (owner, id) = running.swap_remove(next(running.len() as u64) as usize);
                        acting = Some(callers[owner]);
                        let ttl = Duration::from_secs(1 + next(3));
                        let body = next(600) as usize;
                        let ended = executions.end(&id, outcome(&id, body), ttl);
                        assert!(ended.now_or_never().is_some());
                    }
                }
                8 => tokio::time::advance(Duration::from_millis(next(800))).await,
                _ => {
                    executions.purge_expired();
                }
            }
            let inner = executions.lock();
            inner.check();
            for (id, owner, bytes, count) in before {
                if acting.is_some_and(|acting| *owner == *acting) || inner.by_id.contains_key(&id) {
                    continue;
                }
                let acting = acting.expect("only a beginning or ending execution makes room");
                evicted_by_another += 1;
                let newcomer = acting_new && acting == callers[caller];
                let share = MAX_BYTES / (count + usize::from(newcomer));
                assert!(
                    bytes > share,
                    "step {step}: {owner} lost {id} to {acting} holding {bytes} bytes, within \
                     its share of {share}"
                );
            }
        }
        assert!(
            evicted_by_another > 0 && refused > 0,
            "{evicted_by_another} {refused}"
        );
    }
}
