//! Making room in a shard: expiry, eviction under each caller's fair share, and closing the
//! gaps evictions leave in the line.

use std::collections::VecDeque;

use tokio::time::Instant;

use super::callers::{Share, Who};
use super::line::Line;
use super::{Limits, Place, Shard, is_numbered};

impl Shard {
    /// Makes room for a new record of `who` of `incoming` bytes (none: room for what is held,
    /// its record numbered `keep` having grown), as `protocol.md` §4 and the README say:
    ///
    /// 1. the oldest ended record goes if it has expired;
    /// 2. a caller holding its fair share (the bounds divided among the callers holding
    ///    records here, `who` counted) makes room with its own oldest ended records;
    /// 3. otherwise the caller holding the most bytes among those over their share gives up
    ///    its oldest ended one: a caller within its share never loses a record to another's;
    /// 4. running records never go, nor the one numbered `keep`; when nothing else can, the
    ///    records past their lease and ttl are dropped, and `false` if there is still no room.
    pub(super) fn make_room(
        &mut self,
        limits: Limits,
        who: Who<'_>,
        incoming: usize,
        keep: Option<u64>,
        now: Instant,
    ) -> bool {
        let new_records = usize::from(incoming > 0);
        let fits = |shard: &Shard| {
            shard.index.len() + new_records <= limits.records
                && shard.bytes + incoming <= limits.bytes
        };
        while !fits(self) {
            let expired = self
                .line
                .front()
                .filter(|(number, record)| record.expires_at <= now && keep != Some(*number))
                .map(|(number, _)| number);
            let Some(number) = expired.or_else(|| self.victim(limits, who, incoming, keep)) else {
                break;
            };
            self.evict(number);
        }
        if !fits(self) {
            // Nothing else may go; drop what outlived its lease and ttl.
            self.purge_expired(now);
        }
        // Evictions out of turn left gaps; `keep` is no longer needed.
        self.compact_if_sparse();
        fits(self)
    }

    /// The number of the ended record to evict for a new record of `who` of `incoming` bytes
    /// (none: its record numbered `keep` grew), under the fair share; `None` if none may go.
    fn victim(
        &mut self,
        limits: Limits,
        who: Who<'_>,
        incoming: usize,
        keep: Option<u64>,
    ) -> Option<u64> {
        let held = self.callers.get(who);
        let callers = self.callers.len() + usize::from(held.is_none());
        let share = Share {
            records: limits.records / callers,
            bytes: limits.bytes / callers,
        };
        let (records, bytes, oldest) = held.map_or((0, 0, None), |caller| {
            (caller.records, caller.bytes, caller.ended.front().copied())
        });
        let new_records = usize::from(incoming > 0);
        if records + new_records > share.records || bytes + incoming > share.bytes {
            if let Some(oldest) = oldest.filter(|oldest| keep != Some(*oldest)) {
                return Some(oldest);
            }
            // A new record of a caller at its share waits for its own to end. A record that
            // grew on ending has nothing of its caller's to make room with: the callers over
            // their share may still.
            keep?;
        }
        self.callers.oldest_of_heaviest(share, who)
    }

    /// Evicts the ended record numbered `number`.
    fn evict(&mut self, number: u64) {
        let Shard {
            index,
            line,
            callers,
            bytes,
        } = self;
        let Some(record) = line.take(number) else {
            return;
        };
        if let Ok(slot) = index.find_entry(record.hash, |slot| is_numbered(slot, number)) {
            slot.remove();
        }
        *bytes -= record.bytes;
        callers.left(callers.who(&record.caller), record.bytes, line);
        line.trim_gaps();
    }

    pub(super) fn purge_expired(&mut self, now: Instant) -> usize {
        let before = self.index.len();
        let Shard {
            index,
            line,
            callers,
            bytes,
        } = self;
        index.retain(|slot| {
            let expired = match &slot.place {
                Place::Running(running) => running.expires_at <= now,
                Place::Ended(number) => line
                    .get(*number)
                    .is_none_or(|record| record.expires_at <= now),
            };
            if expired {
                match &slot.place {
                    Place::Running(running) => {
                        *bytes -= running.bytes;
                        callers.left(callers.who(&running.key.caller), running.bytes, line);
                    }
                    Place::Ended(number) => {
                        if let Some(record) = line.take(*number) {
                            *bytes -= record.bytes;
                            callers.left(callers.who(&record.caller), record.bytes, line);
                        }
                    }
                }
            }
            !expired
        });
        self.line.trim_gaps();
        self.compact_if_sparse();
        before - self.index.len()
    }

    /// Closes the gaps in the line once they outnumber the records, renumbering those that
    /// stay (their slots with them).
    pub(super) fn compact_if_sparse(&mut self) {
        if self.line.records.len() <= 2 * self.index.len().max(16) {
            return;
        }
        let sparse = std::mem::take(&mut self.line);
        let mut line = Line {
            records: VecDeque::with_capacity(self.index.len()),
            first: sparse.first,
        };
        self.callers.clear_places();
        for (number, record) in (sparse.first..).zip(sparse.records) {
            let Some(record) = record else { continue };
            if let Some(slot) = self
                .index
                .find_mut(record.hash, |slot| is_numbered(slot, number))
            {
                slot.place = Place::Ended(line.next());
                self.callers
                    .place(self.callers.who(&record.caller), line.next());
                line.push(record);
            }
        }
        self.line = line;
    }
}
