//! What each caller holds in a shard: the accounts that give every caller a fair share of the
//! shard's bounds, so that one caller's flood makes room with its own records.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;

use super::line::Line;

/// The callers holding records in one shard, and what each holds.
pub(super) struct Callers {
    table: HashTable<Caller>,
    /// Hashes a caller's id: foldhash, seeded per shard, a lookup per operation cheaper than the
    /// keys' SipHash (the ids come from the host's authentication, not from the request).
    hasher: foldhash::quality::RandomState,
    /// The caller that held the most bytes when last compared, with its bytes (kept exact for
    /// it): the first asked to make room for a caller under its share, without a scan. A hint,
    /// checked before it is used.
    heaviest: Option<(u64, usize)>,
}

/// What one caller holds in a shard.
pub(super) struct Caller {
    id: Arc<str>,
    hash: u64,
    /// The weights of its records, running and ended.
    pub(super) bytes: usize,
    /// How many records it holds, running and ended.
    pub(super) records: usize,
    /// The numbers of its ended records in the shard's line, oldest first. The front is always
    /// one of its records; a number behind it may be a gap (a record that left out of turn),
    /// passed over when it comes to the front.
    pub(super) ended: VecDeque<u64>,
}

/// A caller's fair share of a shard's bounds: the bounds divided among the callers holding
/// records there.
#[derive(Debug, Clone, Copy)]
pub(super) struct Share {
    pub(super) records: usize,
    pub(super) bytes: usize,
}

/// A caller, by its id and the hash of it.
#[derive(Clone, Copy)]
pub(super) struct Who<'a> {
    pub(super) hash: u64,
    pub(super) id: &'a str,
}

impl Caller {
    fn is(&self, who: Who<'_>) -> bool {
        self.hash == who.hash && *self.id == *who.id
    }

    /// Whether it holds more than `share` of either bound.
    fn over(&self, share: Share) -> bool {
        self.bytes > share.bytes || self.records > share.records
    }
}

impl Callers {
    pub(super) fn new() -> Self {
        Callers {
            table: HashTable::new(),
            hasher: foldhash::quality::RandomState::default(),
            heaviest: None,
        }
    }

    /// The caller `id`, hashed.
    pub(super) fn who<'a>(&self, id: &'a str) -> Who<'a> {
        Who {
            hash: self.hasher.hash_one(id),
            id,
        }
    }

    /// How many callers hold records.
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    pub(super) fn get(&self, who: Who<'_>) -> Option<&Caller> {
        self.table.find(who.hash, |caller| caller.is(who))
    }

    /// A new record of `weight` bytes, held by `id`.
    pub(super) fn add(&mut self, who: Who<'_>, id: &Arc<str>, weight: usize) {
        let caller = match self.table.find_mut(who.hash, |caller| caller.is(who)) {
            Some(caller) => caller,
            None => self
                .table
                .insert_unique(
                    who.hash,
                    Caller {
                        id: Arc::clone(id),
                        hash: who.hash,
                        bytes: 0,
                        records: 0,
                        ended: VecDeque::new(),
                    },
                    |caller| caller.hash,
                )
                .into_mut(),
        };
        caller.records += 1;
        caller.bytes += weight;
        let bytes = caller.bytes;
        self.note(who.hash, bytes);
    }

    /// A record of `who` left the shard, taking `weight` bytes with it; the line no longer holds
    /// it.
    pub(super) fn left(&mut self, who: Who<'_>, weight: usize, line: &Line) {
        self.change(who, line, |caller| {
            caller.records -= 1;
            caller.bytes -= weight;
        });
    }

    /// Applies `change` to what `who` holds; then the front of its ended records is one of its
    /// records again, and a caller that holds nothing is forgotten.
    pub(super) fn change(&mut self, who: Who<'_>, line: &Line, change: impl FnOnce(&mut Caller)) {
        let Ok(mut entry) = self.table.find_entry(who.hash, |caller| caller.is(who)) else {
            debug_assert!(false, "a record's caller is accounted for");
            return;
        };
        let caller = entry.get_mut();
        change(caller);
        while caller
            .ended
            .front()
            .is_some_and(|number| line.get(*number).is_none())
        {
            caller.ended.pop_front();
        }
        let (records, bytes) = (caller.records, caller.bytes);
        if records == 0 {
            entry.remove();
            if self.heaviest.is_some_and(|(hash, _)| hash == who.hash) {
                self.heaviest = None;
            }
        } else {
            self.note(who.hash, bytes);
        }
    }

    /// Notes that the caller of hash `hash` now holds `bytes`.
    fn note(&mut self, hash: u64, bytes: usize) {
        match self.heaviest {
            Some((heaviest, most)) if heaviest != hash && most >= bytes => {}
            _ => self.heaviest = Some((hash, bytes)),
        }
    }

    /// The number of the oldest ended record of the caller holding the most bytes among those
    /// over `share` that have one, other than `except`.
    pub(super) fn oldest_of_heaviest(&mut self, share: Share, except: Who<'_>) -> Option<u64> {
        let candidate = |caller: &Caller| !caller.is(except) && caller.over(share);
        if let Some((hash, _)) = self.heaviest
            && let Some(caller) = self.table.find(hash, |caller| caller.hash == hash)
            && candidate(caller)
            && let Some(oldest) = caller.ended.front()
        {
            return Some(*oldest);
        }
        let heaviest = self
            .table
            .iter()
            .filter(|caller| candidate(caller) && !caller.ended.is_empty())
            .max_by_key(|caller| caller.bytes)?;
        self.heaviest = Some((heaviest.hash, heaviest.bytes));
        heaviest.ended.front().copied()
    }

    /// Forgets the places of every ended record, before the line is numbered anew.
    pub(super) fn clear_places(&mut self) {
        for caller in &mut self.table {
            caller.ended.clear();
        }
    }

    /// The ended record of `who` numbered `number`, at the back of its records in line.
    pub(super) fn place(&mut self, who: Who<'_>, number: u64) {
        if let Some(caller) = self.table.find_mut(who.hash, |caller| caller.is(who)) {
            caller.ended.push_back(number);
        }
    }

    /// Every account matches the records: `held` lists each record's caller, weight and place in
    /// line (`None`: running). The places of a caller rise, the first is one of its records, and
    /// every place is in line.
    #[cfg(test)]
    pub(super) fn check<'a>(
        &self,
        line: &Line,
        held: impl Iterator<Item = (&'a str, usize, Option<u64>)>,
    ) {
        use std::collections::{BTreeSet, HashMap};
        let mut expected: HashMap<&str, (usize, usize, BTreeSet<u64>)> = HashMap::new();
        for (id, weight, place) in held {
            let account = expected.entry(id).or_default();
            account.0 += weight;
            account.1 += 1;
            account.2.extend(place);
        }
        assert_eq!(self.table.len(), expected.len(), "one account per caller");
        let mut places = 0;
        for caller in &self.table {
            assert_eq!(caller.hash, self.hasher.hash_one(&*caller.id));
            let (bytes, records, ended) = &expected[&*caller.id];
            assert_eq!(
                (caller.bytes, caller.records),
                (*bytes, *records),
                "{}",
                caller.id
            );
            assert!(
                caller
                    .ended
                    .iter()
                    .zip(caller.ended.iter().skip(1))
                    .all(|(a, b)| a < b)
            );
            if let Some(front) = caller.ended.front() {
                assert!(line.get(*front).is_some(), "the first place is a record");
            }
            let live: BTreeSet<u64> = caller
                .ended
                .iter()
                .copied()
                .filter(|number| line.get(*number).is_some())
                .collect();
            assert_eq!(&live, ended, "{}", caller.id);
            assert!(caller.ended.iter().all(|number| *number >= line.first));
            places += caller.ended.len();
        }
        assert!(places <= line.records.len(), "places are in line");
    }
}
