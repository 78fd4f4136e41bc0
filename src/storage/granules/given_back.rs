//! The granules of a range given back but still backed by the driver, by
//! granule index: one word a granule, up to the highest given back.
//!
//! A give-back, a reclaim and a map ask it about every granule they
//! cover, so it answers in O(1) (it was a `BTreeMap`, whose searches,
//! inserts and removals were a tenth of a replay with many growths,
//! `serving_contig`'s). The table grows to the highest granule given back
//! and no further: 4 KiB of host memory for each GiB of address space
//! below it in 2 MiB granules, and since an arena maps its voids lowest
//! first, that follows the most the range held (564 KiB for all of an
//! H200's 141 GB), as the memory layer's per-granule let-go times do.

// Indices are granules of a range whose per-granule bitmap the host
// already holds (`GranuleMap::new`), so they fit a `usize`.
#![allow(clippy::arithmetic_side_effects)]

use super::GivenBack;

/// A word of the table: no entry.
const ABSENT: u64 = 0;
/// A word of the table: `GivenBack::Stranded`. Any other word is
/// `GivenBack::Waiting(word - 1)`.
const STRANDED: u64 = u64::MAX;

/// Granules given back, as a map from granule index to where each stands,
/// with how many stand each way.
#[derive(Debug, Clone, Default)]
pub(super) struct GivenBackTable {
    /// One word per granule from 0 to the highest given back.
    words: Vec<u64>,
    /// Entries waiting for a fence.
    waiting: u64,
    /// Entries stranded.
    stranded: u64,
}

impl GivenBackTable {
    /// Granules waiting for a fence.
    pub(super) fn waiting(&self) -> u64 {
        self.waiting
    }

    /// Granules whose fence passed, held for the rest of their handle.
    pub(super) fn stranded(&self) -> u64 {
        self.stranded
    }

    /// Where granule `index` stands, if it was given back.
    #[inline]
    pub(super) fn get(&self, index: u64) -> Option<GivenBack> {
        let word = self.words.get(index as usize).copied().unwrap_or(ABSENT);
        decode(word)
    }

    /// Whether granule `index` was given back.
    #[inline]
    pub(super) fn contains(&self, index: u64) -> bool {
        self.get(index).is_some()
    }

    /// Record where granule `index` stands; what it stood at before.
    pub(super) fn insert(&mut self, index: u64, state: GivenBack) -> Option<GivenBack> {
        let at = index as usize;
        if self.words.len() <= at {
            self.words.resize(at + 1, ABSENT);
        }
        let was = decode(std::mem::replace(&mut self.words[at], encode(state)));
        self.count(was, false);
        self.count(Some(state), true);
        was
    }

    /// Forget granule `index`; where it stood, if it was given back.
    pub(super) fn remove(&mut self, index: u64) -> Option<GivenBack> {
        let word = self.words.get_mut(index as usize)?;
        let was = decode(std::mem::replace(word, ABSENT));
        self.count(was, false);
        was
    }

    /// Count `state` in (`added`) or out.
    fn count(&mut self, state: Option<GivenBack>, added: bool) {
        let count = match state {
            None => return,
            Some(GivenBack::Waiting(_)) => &mut self.waiting,
            Some(GivenBack::Stranded) => &mut self.stranded,
        };
        if added {
            *count += 1;
        } else {
            *count -= 1;
        }
    }
}

fn encode(state: GivenBack) -> u64 {
    match state {
        GivenBack::Stranded => STRANDED,
        // Batches count up from 0 once per flush: they stay far below the
        // one value the encoding cannot hold.
        GivenBack::Waiting(batch) => {
            debug_assert!(batch < STRANDED - 1, "batch {batch} out of range");
            batch + 1
        }
    }
}

fn decode(word: u64) -> Option<GivenBack> {
    match word {
        ABSENT => None,
        STRANDED => Some(GivenBack::Stranded),
        waiting => Some(GivenBack::Waiting(waiting - 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table answers as a map would, its counts included, far from
    /// and at its end.
    #[test]
    fn the_table_answers_as_a_map() {
        let mut table = GivenBackTable::default();
        assert_eq!(table.get(5), None);
        assert_eq!(table.remove(1 << 20), None, "past the end: nothing");
        assert_eq!(table.insert(5, GivenBack::Waiting(0)), None);
        assert_eq!(table.insert(9, GivenBack::Waiting(7)), None);
        assert_eq!((table.waiting(), table.stranded()), (2, 0));
        assert_eq!(table.get(5), Some(GivenBack::Waiting(0)));
        assert!(table.contains(9) && !table.contains(6));
        assert_eq!(
            table.insert(9, GivenBack::Stranded),
            Some(GivenBack::Waiting(7))
        );
        assert_eq!(
            (table.waiting(), table.stranded()),
            (1, 1),
            "a change of state moves its count, adds none"
        );
        assert_eq!(table.remove(9), Some(GivenBack::Stranded));
        assert_eq!(table.remove(9), None);
        assert_eq!((table.waiting(), table.stranded()), (1, 0));
        assert_eq!(table.remove(5), Some(GivenBack::Waiting(0)));
        assert_eq!((table.waiting(), table.stranded()), (0, 0));
    }
}
