//! Idle granules: when an allocation last let go of each mapped granule,
//! and what unmaps them by it: the sweeps that unmap the ones idle for the
//! pool's period, the trim after a reservation (the free room past the
//! pool's slack), and the unmapping before a growth or after a compaction
//! (`unmap_longest_idle`: as many bytes as asked, the longest idle first).
//!
//! The long form: `docs/modules.md`, "`src/memory/pool/expandable/idle.rs`".

use super::ExpandablePool;
use crate::storage::DeviceStorage;

impl ExpandablePool {
    /// Give back the free room past the pool's slack, if it keeps one
    /// (`MemoryConfig::free_slack_one_in`): when the free mapped bytes pass
    /// the slack and a granule, unmap whole free granules, the longest idle
    /// first, down to it. What is left free then lies in parts of granules
    /// (no trim can unmap those): the next trim waits until the free room
    /// passes that too, so a pool of many partly used granules does not
    /// walk its blocks at every reservation. Whether any went (the caller
    /// flushes).
    pub(crate) fn trim(&mut self, storage: &mut dyn DeviceStorage) -> bool {
        let Some(one_in) = self.free_slack_one_in else {
            return false;
        };
        let slack = self.used.checked_div(one_in).unwrap_or(0).max(self.granule);
        // Up to the most the pool has held at once, free granules stay
        // mapped: a stream that rises to its peak again maps nothing.
        let slack = slack.max(self.kept_mapped().saturating_sub(self.used));
        let free = self.free_mapped();
        self.untrimmable = self.untrimmable.min(free);
        if free <= slack.max(self.untrimmable) + self.granule {
            return false;
        }
        let unmapped = self.unmap_longest_idle(storage, free - slack);
        self.untrimmable = self.free_mapped();
        unmapped
    }

    /// Record that an allocation let go of `bytes` at `offset` of range
    /// `index` at `serial`: every granule it touched.
    pub(super) fn let_go(&mut self, index: u32, offset: u64, bytes: u64, serial: u64) {
        let first = (offset / self.granule) as usize;
        let last = (offset + bytes).div_ceil(self.granule) as usize;
        let times = &mut self.ranges[index as usize].let_go;
        if times.len() < last {
            times.resize(last, 0);
        }
        times[first..last].fill(serial);
    }

    /// The serial an allocation last let go of the granule at `offset` of
    /// range `index`.
    fn let_go_at(&self, index: u32, offset: u64) -> u64 {
        let times = &self.ranges[index as usize].let_go;
        times
            .get((offset / self.granule) as usize)
            .copied()
            .unwrap_or(0)
    }

    /// The listed free blocks of a granule or more, in the sweep's kept
    /// buffer (put it back in `self.sweep` when done).
    fn blocks_of_a_granule(&mut self) -> Vec<u32> {
        let mut nodes = std::mem::take(&mut self.sweep);
        nodes.clear();
        self.arena.listed_at_least(self.granule, &mut nodes);
        nodes
    }

    /// Whole free granules were let go at `serial`: a sweep is due once they
    /// have been idle a period.
    pub(super) fn idle_from(&mut self, serial: u64) {
        let due = serial.saturating_add(self.dealloc_period.unwrap_or(0));
        self.idle_due = Some(self.idle_due.map_or(due, |at| at.min(due)));
    }

    /// Unmap every run of whole free granules idle for `period` at `serial`,
    /// and set when the next sweep is due. Whether any went.
    pub(super) fn unmap_idle(
        &mut self,
        storage: &mut dyn DeviceStorage,
        serial: u64,
        period: u64,
    ) -> bool {
        let granule = self.granule;
        let nodes = self.blocks_of_a_granule();
        let mut next: Option<u64> = None;
        let mut unmapped = 0;
        for &node in &nodes {
            let Some((first, last)) = self.whole_granules(node) else {
                continue;
            };
            let index = self.arena.page(node);
            // From the top down, so that `node` stays the part below each
            // span unmapped.
            let (mut at, mut top) = (last, last);
            while at > first {
                let since = self.let_go_at(index, at - granule);
                let due = since.saturating_add(period);
                if due > serial {
                    if top > at {
                        unmapped += self.unmap_span(storage, node, at, top).0;
                    }
                    next = Some(next.map_or(due, |least| least.min(due)));
                    top = at - granule;
                }
                at -= granule;
            }
            if top > first {
                unmapped += self.unmap_span(storage, node, first, top).0;
            }
        }
        self.sweep = nodes;
        let spacing = (period / 4).max(1);
        // Free blocks a guard or a fence keeps off the lists are not seen:
        // look again while any is.
        if self.fence.is_some() || self.ranges.iter().any(|range| range.guards > 0) {
            next = Some(next.map_or(serial, |least| least.min(serial)));
        }
        self.idle_due = next.map(|due| due.max(serial.saturating_add(spacing)));
        unmapped > 0
    }

    /// Unmap `bytes` of free granules, the longest idle first (ties by
    /// block, then offset: the same on every run), or as many as there are:
    /// before a growth of `bytes` (it then takes no more memory than it
    /// must), after a compaction, and at a trim. Whether any went (the
    /// caller flushes).
    pub(crate) fn unmap_longest_idle(
        &mut self,
        storage: &mut dyn DeviceStorage,
        bytes: u64,
    ) -> bool {
        let granule = self.granule;
        let nodes = self.blocks_of_a_granule();
        // (since, node, offset) of every whole free granule.
        let mut granules = Vec::new();
        for &node in &nodes {
            if let Some((first, last)) = self.whole_granules(node) {
                let index = self.arena.page(node);
                for at in (first..last).step_by(granule as usize) {
                    granules.push((self.let_go_at(index, at), node, at));
                }
            }
        }
        self.sweep = nodes;
        let wanted = bytes.div_ceil(granule) as usize;
        if granules.len() > wanted {
            granules.select_nth_unstable(wanted);
            granules.truncate(wanted);
        }
        // Unmapped a run at a time, each block's from the top down.
        granules.sort_unstable_by_key(|&(_, node, at)| (node, std::cmp::Reverse(at)));
        let mut unmapped = 0;
        let mut chosen = granules.iter().map(|&(_, node, at)| (node, at)).peekable();
        while let Some((node, top)) = chosen.next() {
            let mut first = top;
            while chosen
                .next_if(|&(n, at)| n == node && at + granule == first)
                .is_some()
            {
                first -= granule;
            }
            unmapped += self.unmap_span(storage, node, first, top + granule).0;
        }
        unmapped > 0
    }
}
