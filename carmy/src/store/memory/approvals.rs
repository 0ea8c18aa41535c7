//! The memory engine's approvals and consents (`protocol.md` §12), in this process, each under
//! one lock: lost on restart, like everything the engine keeps.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use futures_util::future::BoxFuture;
use tokio::sync::watch;

use super::MemoryStore;
use crate::store::{
    Approval, ApprovalQuery, ApprovalStatus, ApprovalStep, ApprovalStore, Consent, ConsentStep,
    ConsentStore, Decided, StoreError, Verdict,
};

/// The most approvals kept at once: past it, holding another call is refused (a retryable
/// error), never an approval dropped before its time.
const MAX_APPROVALS: usize = 10_000;
/// The most consents kept at once, likewise.
const MAX_CONSENTS: usize = 100_000;

/// Approvals and consents in this process.
pub(super) struct MemoryApprovals {
    approvals: Mutex<Approvals>,
    consents: Mutex<HashMap<(String, String), Consent>>,
    /// Bumped on every change of an approval: waiting readers look again.
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct Approvals {
    /// By id; ids are UUID v7, so the map's order is the order they were held in.
    by_id: BTreeMap<String, Held>,
    /// Execution id → approval id.
    by_execution: HashMap<String, String>,
}

struct Held {
    approval: Approval,
    /// Until when its run is claimed by a replica, in milliseconds since the Unix epoch.
    claimed_until_ms: u64,
}

impl Default for MemoryApprovals {
    fn default() -> Self {
        MemoryApprovals {
            approvals: Mutex::default(),
            consents: Mutex::default(),
            changed: watch::channel(0).0,
        }
    }
}

impl MemoryApprovals {
    fn lock(&self) -> MutexGuard<'_, Approvals> {
        // No code panics while holding the lock; recover the data if it ever happens.
        self.approvals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn consents(&self) -> MutexGuard<'_, HashMap<(String, String), Consent>> {
        self.consents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn changed(&self) {
        self.changed.send_modify(|version| *version += 1);
    }
}

/// When a decided (or expired, or withdrawn) approval may be dropped.
fn kept_until(approval: &Approval) -> u64 {
    let decided = approval
        .decision()
        .map_or(approval.expires_at_ms, |step| step.at_ms);
    decided.saturating_add(approval.keep_ms)
}

fn matches(approval: &Approval, query: &ApprovalQuery) -> bool {
    query.status.is_none_or(|status| approval.status == status)
        && query
            .tool
            .as_deref()
            .is_none_or(|tool| approval.tool == tool)
        && query
            .caller
            .as_deref()
            .is_none_or(|caller| approval.caller.id == caller)
}

impl ApprovalStore for MemoryStore {
    fn create<'a>(&'a self, approval: &'a Approval) -> BoxFuture<'a, Result<(), StoreError>> {
        let created = {
            let mut held = self.approvals.lock();
            if held.by_id.len() >= MAX_APPROVALS {
                Err(StoreError::message(
                    "the memory store holds as many approvals as it may",
                ))
            } else if held.by_execution.contains_key(&approval.execution_id) {
                Err(StoreError::message(
                    "that execution already has an approval",
                ))
            } else {
                held.by_execution
                    .insert(approval.execution_id.clone(), approval.id.clone());
                held.by_id.insert(
                    approval.id.clone(),
                    Held {
                        approval: approval.clone(),
                        claimed_until_ms: 0,
                    },
                );
                Ok(())
            }
        };
        self.approvals.changed();
        Box::pin(std::future::ready(created))
    }

    fn approval<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Approval>, StoreError>> {
        let found = self
            .approvals
            .lock()
            .by_id
            .get(id)
            .map(|held| held.approval.clone());
        Box::pin(std::future::ready(Ok(found)))
    }

    fn approval_of<'a>(
        &'a self,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Approval>, StoreError>> {
        let held = self.approvals.lock();
        let found = held
            .by_execution
            .get(execution_id)
            .and_then(|id| held.by_id.get(id))
            .map(|held| held.approval.clone());
        Box::pin(std::future::ready(Ok(found)))
    }

    fn same_call<'a>(
        &'a self,
        caller: &'a str,
        tool: &'a str,
        arguments_digest: &'a str,
    ) -> BoxFuture<'a, Result<Option<Approval>, StoreError>> {
        let found = self
            .approvals
            .lock()
            .by_id
            .values()
            .rev()
            .map(|held| &held.approval)
            .find(|approval| {
                approval.caller.id == caller
                    && approval.tool == tool
                    && approval.arguments_digest == arguments_digest
            })
            .cloned();
        Box::pin(std::future::ready(Ok(found)))
    }

    fn approvals<'a>(
        &'a self,
        query: &'a ApprovalQuery,
    ) -> BoxFuture<'a, Result<Vec<Approval>, StoreError>> {
        let held = self.approvals.lock();
        let older = match &query.before {
            Some(before) => held.by_id.range(..before.clone()),
            None => held.by_id.range::<String, _>(..),
        };
        let found = older
            .rev()
            .map(|(_, held)| &held.approval)
            .filter(|approval| matches(approval, query))
            .take(query.limit)
            .cloned()
            .collect();
        Box::pin(std::future::ready(Ok(found)))
    }

    fn decide<'a>(
        &'a self,
        id: &'a str,
        verdict: Verdict,
        step: &'a ApprovalStep,
        now_ms: u64,
        lease_ms: u64,
    ) -> BoxFuture<'a, Result<Decided, StoreError>> {
        let decided = {
            let mut approvals = self.approvals.lock();
            match approvals.by_id.get_mut(id) {
                None => Decided::NotFound,
                Some(held) if held.approval.status != ApprovalStatus::Pending => {
                    Decided::AlreadyDecided(held.approval.clone())
                }
                Some(held) if held.approval.expires_at_ms <= now_ms => {
                    expire(&mut held.approval, now_ms);
                    Decided::Expired(held.approval.clone())
                }
                Some(held) => {
                    held.approval.status = verdict.status();
                    held.approval.history.push(step.clone());
                    if verdict == Verdict::Approve {
                        held.claimed_until_ms = now_ms.saturating_add(lease_ms);
                    }
                    Decided::Done(held.approval.clone())
                }
            }
        };
        self.approvals.changed();
        Box::pin(std::future::ready(Ok(decided)))
    }

    fn expire<'a>(
        &'a self,
        now_ms: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Approval>, StoreError>> {
        let expired: Vec<Approval> = self
            .approvals
            .lock()
            .by_id
            .values_mut()
            .filter(|held| {
                held.approval.status == ApprovalStatus::Pending
                    && held.approval.expires_at_ms <= now_ms
            })
            .take(limit)
            .map(|held| {
                expire(&mut held.approval, now_ms);
                held.approval.clone()
            })
            .collect();
        if !expired.is_empty() {
            self.approvals.changed();
        }
        Box::pin(std::future::ready(Ok(expired)))
    }

    fn claim_approved<'a>(
        &'a self,
        now_ms: u64,
        lease_ms: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Approval>, StoreError>> {
        let claimed = self
            .approvals
            .lock()
            .by_id
            .values_mut()
            .filter(|held| {
                held.approval.status == ApprovalStatus::Approved
                    && !held.approval.started
                    && held.claimed_until_ms <= now_ms
            })
            .take(limit)
            .map(|held| {
                held.claimed_until_ms = now_ms.saturating_add(lease_ms);
                held.approval.clone()
            })
            .collect();
        Box::pin(std::future::ready(Ok(claimed)))
    }

    fn start<'a>(
        &'a self,
        id: &'a str,
        step: &'a ApprovalStep,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let started = match self.approvals.lock().by_id.get_mut(id) {
            Some(held)
                if held.approval.status == ApprovalStatus::Approved && !held.approval.started =>
            {
                held.approval.started = true;
                held.approval.history.push(step.clone());
                true
            }
            _ => false,
        };
        if started {
            self.approvals.changed();
        }
        Box::pin(std::future::ready(Ok(started)))
    }

    fn purge_approvals(&self, now_ms: u64) -> BoxFuture<'_, Result<usize, StoreError>> {
        let purged = {
            let mut approvals = self.approvals.lock();
            let Approvals {
                by_id,
                by_execution,
            } = &mut *approvals;
            let before = by_id.len();
            by_id.retain(|_, held| {
                let keep = held.approval.status == ApprovalStatus::Pending
                    || kept_until(&held.approval) > now_ms;
                if !keep {
                    by_execution.remove(&held.approval.execution_id);
                }
                keep
            });
            before - by_id.len()
        };
        Box::pin(std::future::ready(Ok(purged)))
    }

    fn approval_changed(&self, id: &str) -> BoxFuture<'static, ()> {
        let _ = id;
        let mut changed = self.approvals.changed.subscribe();
        Box::pin(async move {
            // Any change wakes every reader, who looks again; a short wait bounds a missed one.
            let _ =
                tokio::time::timeout(std::time::Duration::from_secs(1), changed.changed()).await;
        })
    }
}

/// Marks a pending approval expired at `now_ms`.
fn expire(approval: &mut Approval, now_ms: u64) {
    approval.status = ApprovalStatus::Expired;
    approval
        .history
        .push(ApprovalStep::new("expired", None, now_ms, None));
}

impl ConsentStore for MemoryStore {
    fn grant<'a>(
        &'a self,
        caller: &'a str,
        purpose: &'a str,
        now_ms: u64,
        expires_at_ms: Option<u64>,
    ) -> BoxFuture<'a, Result<Consent, StoreError>> {
        let mut consents = self.approvals.consents();
        let key = (caller.to_owned(), purpose.to_owned());
        let full = consents.len() >= MAX_CONSENTS;
        let granted = match consents.get_mut(&key) {
            Some(consent) => {
                consent.granted_at_ms = now_ms;
                consent.expires_at_ms = expires_at_ms;
                consent.revoked = false;
                consent
                    .history
                    .push(ConsentStep::new("granted", now_ms, expires_at_ms));
                Ok(consent.clone())
            }
            None if full => Err(StoreError::message(
                "the memory store holds as many consents as it may",
            )),
            None => {
                let consent = Consent::new(caller, purpose, now_ms, expires_at_ms);
                consents.insert(key, consent.clone());
                Ok(consent)
            }
        };
        Box::pin(std::future::ready(granted))
    }

    fn revoke<'a>(
        &'a self,
        caller: &'a str,
        purpose: &'a str,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let mut consents = self.approvals.consents();
        let key = (caller.to_owned(), purpose.to_owned());
        let stood = match consents.get_mut(&key) {
            Some(consent) => {
                let stood = consent.stands(now_ms);
                consent.revoked = true;
                consent
                    .history
                    .push(ConsentStep::new("revoked", now_ms, None));
                stood
            }
            None => false,
        };
        Box::pin(std::future::ready(Ok(stood)))
    }

    fn consent<'a>(
        &'a self,
        caller: &'a str,
        purpose: &'a str,
    ) -> BoxFuture<'a, Result<Option<Consent>, StoreError>> {
        let key = (caller.to_owned(), purpose.to_owned());
        let found = self.approvals.consents().get(&key).cloned();
        Box::pin(std::future::ready(Ok(found)))
    }

    fn consents<'a>(&'a self, caller: &'a str) -> BoxFuture<'a, Result<Vec<Consent>, StoreError>> {
        let mut found: Vec<Consent> = self
            .approvals
            .consents()
            .values()
            .filter(|consent| consent.caller == caller)
            .cloned()
            .collect();
        found.sort_by(|one, other| one.purpose.cmp(&other.purpose));
        Box::pin(std::future::ready(Ok(found)))
    }
}
