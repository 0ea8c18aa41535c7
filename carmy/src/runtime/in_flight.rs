//! The in-flight slots: how many executions run at once, in all and per caller, so that one
//! caller cannot take every slot and leave the others `503 OVERLOADED`.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use hashbrown::HashTable;

use crate::principal::Principal;

/// The id every anonymous caller shares ([`Principal::anonymous`]): they are one caller.
const ANONYMOUS: &str = "anonymous";

/// Shards of the identified callers' counts: concurrent calls of different callers rarely take
/// the same lock.
const SHARDS: usize = 16;

/// Executions in flight, bounded in all and per caller. Counters, not a semaphore: nothing
/// waits for a slot, and a semaphore's release takes its waiters' lock on every call.
pub(crate) struct InFlight {
    /// Slots taken, by every caller.
    taken: AtomicUsize,
    max: usize,
    /// The most slots one caller may hold; at `max` or more, no caller's count is kept.
    per_caller: usize,
    /// Slots held by the anonymous caller: the common call counts here without a lock or a
    /// hash.
    anonymous: AtomicUsize,
    /// Slots held by each identified caller (its principal id), sharded by the id's hash.
    identified: Box<[Mutex<HashTable<Holder>>]>,
    /// foldhash, seeded per process: the ids come from the host's authentication.
    hasher: foldhash::quality::RandomState,
}

/// An identified caller holding slots.
struct Holder {
    caller: Arc<str>,
    hash: u64,
    slots: usize,
}

/// An in-flight slot, freed when dropped.
pub(crate) struct Slot {
    in_flight: Arc<InFlight>,
    holder: Held,
}

/// Whose count a slot is in.
enum Held {
    /// Nobody's: no share is kept.
    Untracked,
    Anonymous,
    Identified {
        caller: Arc<str>,
        hash: u64,
    },
}

impl InFlight {
    /// `max` slots in all, at most `per_caller` (at least one) for one caller.
    pub(crate) fn new(max: usize, per_caller: usize) -> Self {
        InFlight {
            taken: AtomicUsize::new(0),
            max,
            per_caller: per_caller.max(1),
            anonymous: AtomicUsize::new(0),
            identified: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
            hasher: foldhash::quality::RandomState::default(),
        }
    }

    /// A slot for `principal`, if one is free and the caller holds less than its share.
    pub(crate) fn take(self: &Arc<Self>, principal: &Principal) -> Option<Slot> {
        let max = self.max;
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |taken| {
                (taken < max).then_some(taken + 1)
            })
            .ok()?;
        let holder = if self.per_caller >= self.max {
            Some(Held::Untracked)
        } else if principal.id() == ANONYMOUS {
            self.take_anonymous()
        } else {
            self.take_identified(principal)
        };
        let Some(holder) = holder else {
            self.taken.fetch_sub(1, Ordering::AcqRel);
            return None;
        };
        Some(Slot {
            in_flight: Arc::clone(self),
            holder,
        })
    }

    fn take_anonymous(&self) -> Option<Held> {
        let share = self.per_caller;
        self.anonymous
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < share).then_some(held + 1)
            })
            .ok()
            .map(|_| Held::Anonymous)
    }

    fn take_identified(&self, principal: &Principal) -> Option<Held> {
        let id = principal.id();
        let hash = self.hasher.hash_one(id);
        let mut holders = self.shard(hash);
        let is_it = |holder: &Holder| holder.hash == hash && *holder.caller == *id;
        match holders.find_mut(hash, is_it) {
            Some(holder) if holder.slots >= self.per_caller => return None,
            Some(holder) => holder.slots += 1,
            None => {
                let holder = Holder {
                    caller: principal.shared_id(),
                    hash,
                    slots: 1,
                };
                holders.insert_unique(hash, holder, |holder| holder.hash);
            }
        }
        Some(Held::Identified {
            caller: principal.shared_id(),
            hash,
        })
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, HashTable<Holder>> {
        // The hash's middle bits: the table takes its low and top bits.
        let index = ((hash >> 32) as usize) % self.identified.len();
        // Nothing panics while holding the lock; recover the counts if it ever happens.
        self.identified[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many slots are taken.
    #[cfg(test)]
    fn taken(&self) -> usize {
        self.taken.load(Ordering::Acquire)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let in_flight = &*self.in_flight;
        match &self.holder {
            Held::Untracked => {}
            Held::Anonymous => {
                in_flight.anonymous.fetch_sub(1, Ordering::AcqRel);
            }
            Held::Identified { caller, hash } => {
                let mut holders = in_flight.shard(*hash);
                let is_it = |holder: &Holder| holder.hash == *hash && holder.caller == *caller;
                if let Ok(mut entry) = holders.find_entry(*hash, is_it) {
                    entry.get_mut().slots -= 1;
                    if entry.get().slots == 0 {
                        entry.remove();
                    }
                }
            }
        }
        in_flight.taken.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::principal::TrustLevel;

    fn known(id: &str) -> Principal {
        Principal::new(id, TrustLevel::Known)
    }

    #[test]
    fn a_caller_at_its_share_is_refused_while_others_are_served() {
        let in_flight = Arc::new(InFlight::new(4, 2));
        let ivan = known("ivan");
        let held: Vec<Slot> = (0..2).filter_map(|_| in_flight.take(&ivan)).collect();
        assert_eq!(held.len(), 2);
        // The same id in another principal is the same caller.
        assert!(in_flight.take(&known("ivan")).is_none());
        let kim = in_flight.take(&known("kim")).expect("kim is served");
        let anonymous = in_flight.take(&Principal::anonymous()).expect("served");
        assert_eq!(in_flight.taken(), 4);
        // Every slot is taken: nobody else gets one, whatever their share.
        assert!(in_flight.take(&known("lee")).is_none());
        drop((kim, anonymous));
        assert!(in_flight.take(&known("ivan")).is_none());
        drop(held);
        let again: Vec<Slot> = (0..2).filter_map(|_| in_flight.take(&ivan)).collect();
        assert_eq!(again.len(), 2, "freed slots are his again");
        drop(again);
        assert_eq!(in_flight.taken(), 0);
        assert!(
            in_flight
                .identified
                .iter()
                .all(|shard| shard.lock().unwrap().is_empty())
        );
    }

    #[test]
    fn anonymous_callers_share_one_share() {
        let in_flight = Arc::new(InFlight::new(3, 1));
        let first = in_flight.take(&Principal::anonymous()).expect("served");
        assert!(in_flight.take(&Principal::anonymous()).is_none());
        // A caller is its id, as for idempotency records.
        assert!(in_flight.take(&known("anonymous")).is_none());
        let named = Principal::new("visitor-7", TrustLevel::Anonymous);
        let named = in_flight.take(&named).expect("served");
        drop((first, named));
        assert_eq!(in_flight.taken(), 0);
        assert_eq!(in_flight.anonymous.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_share_of_every_slot_keeps_no_count() {
        let in_flight = Arc::new(InFlight::new(2, 2));
        let held: Vec<Slot> = (0..3)
            .filter_map(|_| in_flight.take(&known("ivan")))
            .collect();
        assert_eq!(held.len(), 2);
        assert!(
            in_flight
                .identified
                .iter()
                .all(|shard| shard.lock().unwrap().is_empty())
        );
        drop(held);
        assert_eq!(in_flight.taken(), 0);
    }

    #[test]
    fn concurrent_callers_never_exceed_the_bounds() {
        let in_flight = Arc::new(InFlight::new(8, 3));
        // What each of two callers holds, counted while held; four threads, two per caller.
        let held = [AtomicUsize::new(0), AtomicUsize::new(0)];
        std::thread::scope(|scope| {
            for thread in 0..4 {
                let (in_flight, held) = (&in_flight, &held[thread % 2]);
                scope.spawn(move || {
                    let caller = known(&format!("caller-{}", thread % 2));
                    for _ in 0..2_000 {
                        let slots: Vec<Slot> =
                            (0..3).filter_map(|_| in_flight.take(&caller)).collect();
                        let now = held.fetch_add(slots.len(), Ordering::AcqRel) + slots.len();
                        assert!(now <= 3, "a caller held {now} slots");
                        assert!(in_flight.taken() <= 8);
                        held.fetch_sub(slots.len(), Ordering::AcqRel);
                    }
                });
            }
        });
        assert_eq!(in_flight.taken(), 0);
        assert!(
            in_flight
                .identified
                .iter()
                .all(|shard| shard.lock().unwrap().is_empty())
        );
    }
}
