//! Idle granules: when an allocation last let go of each mapped granule,
//! and what unmaps them by it: the sweeps that unmap the ones idle for the
//! pool's period, the trim after a reservation (the free room past the
//! pool's slack), and the unmapping before a growth or after a compaction
//! (`unmap_longest_idle`: as many bytes as asked, the longest idle first),
//! and the give-back for a round (`unmap_idle_handles`: whole physical
//! handles, the longest idle first).
//!
//! The long form: `docs/modules.md`, "`src/memory/pool/expandable/idle.rs`".

use super::ExpandablePool;
use crate::memory::pool::page::{units_below, units_over};
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
    #[inline]
    pub(crate) fn trim(&mut self, storage: &mut dyn DeviceStorage) -> bool {
        let Some(one_in) = self.free_slack_one_in else {
            return false;
        };
        let free = self.free_mapped();
        self.untrimmable = self.untrimmable.min(free);
        // Up to the most the pool has held at once, free granules stay
        // mapped: a stream that rises to its peak again maps nothing. That
        // part of the slack settles most trims (a pool within its peak)
        // here, before the division the rest needs.
        let kept_free = self.kept_mapped().saturating_sub(self.used);
        if free <= kept_free.max(self.granule).max(self.untrimmable) + self.granule {
            return false;
        }
        self.trim_past(storage, one_in, free, kept_free)
    }

    /// [`trim`](Self::trim) of `free` mapped bytes past the free room the
    /// peak keeps (`kept_free`), with the rest of the slack (one in
    /// `one_in` of the bytes in use).
    fn trim_past(
        &mut self,
        storage: &mut dyn DeviceStorage,
        one_in: u64,
        free: u64,
        kept_free: u64,
    ) -> bool {
        let slack = (self.used.checked_div(one_in).unwrap_or(0))
            .max(self.granule)
            .max(kept_free);
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
        let first = units_below(offset, self.granule) as usize;
        let last = units_over(offset + bytes, self.granule) as usize;
        let times = &mut self.ranges[index as usize].let_go;
        if times.len() < last {
            times.resize(last, 0);
        }
        times[first..last].fill(serial);
    }

    /// The serial an allocation last let go of the granule at `offset` of
    /// range `index`.
    fn let_go_at(&self, index: u32, offset: u64) -> u64 {
        self.let_go_from(index, offset).next().unwrap_or(0)
    }

    /// The serials allocations last let go of the granules of range
    /// `index` from the one at `offset` up (0 for one never let go), read
    /// in order: the run's first index worked out once, not one a granule.
    fn let_go_from(&self, index: u32, offset: u64) -> impl Iterator<Item = u64> + '_ {
        let times = &self.ranges[index as usize].let_go;
        let from = (units_below(offset, self.granule) as usize).min(times.len());
        times[from..].iter().copied().chain(std::iter::repeat(0))
    }

    /// Call `visit(pool, range, node, first, last)` for every listed free
    /// block that holds whole granules (`first..last`, offsets in range
    /// `range`), in the order the arena lists them as the walk begins
    /// (the blocks are gathered first, in the sweep's kept buffer, so a
    /// visit may unmap what it is shown).
    fn each_whole_free_run(&mut self, mut visit: impl FnMut(&mut Self, u32, u32, u64, u64)) {
        let mut nodes = std::mem::take(&mut self.sweep);
        nodes.clear();
        self.arena.listed_at_least(self.granule, &mut nodes);
        for &node in &nodes {
            if let Some((first, last)) = self.whole_granules(node) {
                let index = self.arena.page(node);
                visit(self, index, node, first, last);
            }
        }
        self.sweep = nodes;
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
        let mut next: Option<u64> = None;
        let mut unmapped = 0;
        self.each_whole_free_run(|pool, index, node, first, last| {
            // From the top down, so that `node` stays the part below each
            // span unmapped.
            let (mut at, mut top) = (last, last);
            while at > first {
                let since = pool.let_go_at(index, at - granule);
                let due = since.saturating_add(period);
                if due > serial {
                    if top > at {
                        unmapped += pool.unmap_span(storage, node, at, top).0;
                    }
                    next = Some(next.map_or(due, |least| least.min(due)));
                    top = at - granule;
                }
                at -= granule;
            }
            if top > first {
                unmapped += pool.unmap_span(storage, node, first, top).0;
            }
        });
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
    /// must), after a compaction, and at a trim. A granule picked in a
    /// physical handle partly in use frees nothing (`unmap_span` keeps to
    /// whole handles); picking whole handles here instead, as a round does
    /// ([`unmap_idle_handles`](Self::unmap_idle_handles)), left lone
    /// streams' later placements worse (`random_geo` held 1.016-1.032 of
    /// live at the peak where it held 1.020-1.029, and up to 1.046 after
    /// its fall: `docs/performance.md`, "What each decision costs").
    /// Whether any went (the caller flushes).
    pub(crate) fn unmap_longest_idle(
        &mut self,
        storage: &mut dyn DeviceStorage,
        bytes: u64,
    ) -> bool {
        let granule = self.granule;
        // (since, node, offset) of every whole free granule.
        let mut granules = Vec::new();
        self.each_whole_free_run(|pool, index, node, first, last| {
            let offsets = (first..last).step_by(granule as usize);
            for (at, since) in offsets.zip(pool.let_go_from(index, first)) {
                granules.push((since, node, at));
            }
        });
        let wanted = units_over(bytes, granule) as usize;
        if granules.len() > wanted {
            granules.select_nth_unstable(wanted);
            granules.truncate(wanted);
        }
        let chosen = (granules.into_iter())
            .map(|(_, node, at)| (node, at, at + granule))
            .collect();
        self.unmap_chosen(storage, chosen)
    }

    /// Give back at least `bytes` of free memory in whole physical handles,
    /// the longest idle first (each as idle as its most recently used
    /// granule; ties by block, then offset: the same on every run), or as
    /// many as there are: what a round for another stream past the
    /// headroom asks. The driver frees no part of a handle, so a granule
    /// picked in one partly in use would free nothing while a whole handle
    /// idle a little less stayed mapped: picked a granule at a time, half
    /// the rounds of `serving_contig-h811` gave back less than asked and
    /// fell back to giving everything. The last handle may take it past
    /// `bytes`, by less than a handle. Whether any went (the caller
    /// flushes).
    pub(crate) fn unmap_idle_handles(
        &mut self,
        storage: &mut dyn DeviceStorage,
        bytes: u64,
    ) -> bool {
        let granule = self.granule;
        // (since, node, start, end) of every physical handle wholly free.
        let mut handles = Vec::new();
        let looking: &dyn DeviceStorage = storage;
        self.each_whole_free_run(|pool, index, node, first, last| {
            let whole = looking.whole_handles(&pool.range_handle(index, first, last - first));
            let (mut at, end) = (whole.offset, whole.offset + whole.size);
            while at < end {
                let cut = looking.first_handle_end(&pool.range_handle(index, at, end - at));
                let cut = cut.clamp(at + granule, end);
                let granules = units_over(cut - at, granule) as usize;
                let since = (pool.let_go_from(index, at).take(granules))
                    .max()
                    .unwrap_or(0);
                handles.push((since, node, at, cut));
                at = cut;
            }
        });
        handles.sort_unstable();
        let mut taken = 0;
        let mut chosen: Vec<(u32, u64, u64)> = Vec::new();
        for &(_, node, start, end) in &handles {
            if taken >= bytes {
                break;
            }
            taken += end - start;
            chosen.push((node, start, end));
        }
        self.unmap_chosen(storage, chosen)
    }

    /// Unmap the spans `chosen` (free block, start, end) picked: a run at
    /// a time, each block's from the top down (so the block stays the part
    /// below each span unmapped). Whether any went.
    fn unmap_chosen(
        &mut self,
        storage: &mut dyn DeviceStorage,
        mut chosen: Vec<(u32, u64, u64)>,
    ) -> bool {
        chosen.sort_unstable_by_key(|&(node, start, _)| (node, std::cmp::Reverse(start)));
        let mut unmapped = 0;
        let mut chosen = chosen.into_iter().peekable();
        while let Some((node, mut first, top)) = chosen.next() {
            while let Some((_, start, _)) = chosen.next_if(|&(n, _, end)| n == node && end == first)
            {
                first = start;
            }
            unmapped += self.unmap_span(storage, node, first, top).0;
        }
        unmapped > 0
    }
}

#[cfg(test)]
mod tests {
    use crate::memory::{MemoryConfig, MemoryManager, PageUpdate};
    use crate::storage::{DEFAULT_GRANULE, DeviceStorage, VirtualStorage};

    const G: u64 = DEFAULT_GRANULE;

    /// A pool grown to 2 GiB in two reservations (physical handles of 8
    /// granules, then 16), emptied oldest first, then holding one
    /// granule at its start: the longest idle free granule is the next
    /// one, in the first handle with it. A round asking for a granule
    /// gets a whole handle, so the device holds less.
    #[test]
    fn a_round_gives_back_whole_handles_even_where_a_partly_used_one_is_idler() {
        let mut memory = MemoryManager::new(VirtualStorage::new(), MemoryConfig::default());
        let grown = [(); 2].map(|()| memory.reserve(512 * G, PageUpdate::Allow).unwrap());
        drop(grown);
        let kept = memory.reserve(G, PageUpdate::Allow).unwrap();
        let held = memory.bytes_allocated();
        let given = memory.give_back_up_to(G);
        memory.flush();
        assert!(given >= G, "gave back {given} bytes");
        assert_eq!(memory.bytes_allocated(), held - given, "all of it freed");
        assert_eq!(memory.storage().bytes_stranded(), 0);
        drop(kept);
    }
}
