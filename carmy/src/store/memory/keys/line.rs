//! A shard's ended records, in the order they ended.

use std::collections::VecDeque;

use super::Ended;

/// Ended records in the order they ended. A record removed out of turn leaves a gap that the
/// front passes over.
#[derive(Default)]
pub(super) struct Line {
    pub(super) records: VecDeque<Option<Ended>>,
    /// The number of the front: a record keeps its number while it stays.
    pub(super) first: u64,
}

impl Line {
    pub(super) fn get(&self, number: u64) -> Option<&Ended> {
        self.records.get(self.at(number)?)?.as_ref()
    }

    /// Takes the record numbered `number` out, leaving a gap.
    pub(super) fn take(&mut self, number: u64) -> Option<Ended> {
        let at = self.at(number)?;
        self.records.get_mut(at)?.take()
    }

    fn at(&self, number: u64) -> Option<usize> {
        usize::try_from(number.checked_sub(self.first)?).ok()
    }

    /// The number the next record will take.
    pub(super) fn next(&self) -> u64 {
        self.first + self.records.len() as u64
    }

    pub(super) fn push(&mut self, record: Ended) {
        self.records.push_back(Some(record));
    }

    /// The front, with its number: a record, or a gap.
    pub(super) fn pop_front(&mut self) -> Option<(u64, Option<Ended>)> {
        let front = self.records.pop_front()?;
        self.first += 1;
        Some((self.first - 1, front))
    }

    /// The front record, with its number, once the gaps before it are passed over.
    pub(super) fn front(&mut self) -> Option<(u64, &Ended)> {
        self.trim_gaps();
        let first = self.first;
        self.records
            .front()
            .and_then(Option::as_ref)
            .map(|record| (first, record))
    }

    pub(super) fn trim_gaps(&mut self) {
        while let Some(None) = self.records.front() {
            self.pop_front();
        }
    }
}
