//! The expandable arena: address space reserved once per *range*, memory
//! mapped behind it a granule at a time as allocations need it, and
//! unmapped again where whole granules lie free.
//!
//! The long form: `docs/modules.md`, "`src/memory/pool/expandable/mod.rs`".

use super::page::{Backing, FreeRoom, Placement, Sweep, Wanted, align_down, align_up};
use crate::memory::config::{PoolConfig, PoolKind};
use crate::memory::pool::arena::{Arena, NONE};
use crate::memory::report::{PoolReport, PoolStats};
use crate::storage::{DeviceStorage, StorageError};
use compact::{EVACUATE_WHEN_FREE_ONE_IN, Evacuate, HIGH_WATER_SLACK_ONE_IN};
use std::cell::Cell;
use std::collections::BTreeMap;

mod blocks;
#[cfg(test)]
mod cleanup_tests;
mod compact;
mod evacuate;
mod grow;
mod holes;
mod idle;
mod moves;
#[cfg(test)]
mod plan_tests;
mod ranges;
mod rehome;
mod rehome_group;
mod slide;
#[cfg(test)]
mod view_tests;
mod window;

/// An allocation's slot and the free block it moves to, by the block's
/// node when planned: several moves may go to one block, each to the start
/// of what the ones before left of it (`compact.rs`, `move_as_planned`).
type PlannedMove = (u32, u32);
use slide::Slide;
use window::Window;

/// The owner of carved blocks that stand for unmapped address space (no
/// slot index reaches it).
pub(crate) const VOID: u32 = u32::MAX - 1;

/// One reserved range of address space.
#[derive(Debug, Clone)]
struct Range {
    /// The reservation and its address; `None` once given back.
    backing: Option<Backing>,
    /// Bytes of address space.
    size: u64,
    /// Its first arena node (stable for the range's life).
    first: u32,
    /// Live allocations in it.
    live: u32,
    /// Bytes carved from it by allocations (aligned sizes).
    used: u64,
    /// Bytes mapped in it.
    mapped: u64,
    /// Live page guards: nothing new is carved from it while any lives.
    guards: u32,
    /// Held (not yet given back).
    held: bool,
    /// By granule (offset / granule): the serial an allocation last let go
    /// of it, or it was mapped for a slide (see `idle.rs`). As long as the
    /// highest granule ever let go; a granule past it reads 0.
    let_go: Vec<u64>,
}

/// A pool of expandable ranges.
#[derive(Debug)]
pub(crate) struct ExpandablePool {
    /// Configured kind (for reports).
    kind: PoolKind,
    /// The largest reservation served.
    max_alloc_size: u64,
    /// Bytes of one granule (the storage's).
    granule: u64,
    /// Bytes of address space a range reserves (more for a larger allocation).
    range_size: u64,
    /// Reservations a free granule may stay mapped before a periodic
    /// cleanup unmaps it.
    pub(super) dealloc_period: Option<u64>,
    /// Ranges by index; given-back indices are reused.
    ranges: Vec<Range>,
    /// Given-back range indices.
    spare: Vec<u32>,
    /// Held ranges with nothing mapped: only these can be all void, so
    /// while there are none the periodic cleanup has no range to give
    /// back and skips the walk (it runs before every reservation).
    unmapped_ranges: u32,
    /// Blocks of every range: free (mapped), carved, and void.
    arena: Arena,
    /// Every void run, by (range, offset): its arena node.
    voids: BTreeMap<(u32, u64), u32>,
    /// The serial from which a periodic cleanup may find whole free granules
    /// idle for a period (`idle.rs`); `None`: none can be.
    idle_due: Option<u64>,
    /// The idle sweep's list of free blocks, kept to be reused.
    sweep: Vec<u32>,
    /// Free room kept mapped past a trim: one in this many of the bytes
    /// allocations hold (`MemoryConfig::free_slack_one_in`); `None`: no
    /// trim.
    free_slack_one_in: Option<u64>,
    /// Free granules stay mapped up to the pool's peak in use and its
    /// slack (`kept_mapped`) until memory is asked for back.
    keep_peak: bool,
    /// The peak in use [`kept_mapped`](Self::kept_mapped) last saw, and
    /// what it came to.
    kept_at_peak: Cell<(u64, u64)>,
    /// Free mapped bytes the last trim left (parts of granules), lowered as
    /// the free room falls: the next trim waits until the room passes them.
    untrimmable: u64,
    /// Usage and peaks (reserved = mapped).
    stats: PoolStats,
    /// Bytes carved by allocations, all ranges (aligned sizes).
    used: u64,
    /// Room a compaction is clearing: a free block that forms there is not
    /// listed, so nothing moved out lands back in it.
    fence: Option<Window>,
    /// What the planners keep between plans (boxed: a plan needs it, a
    /// pool's every other use does not).
    planning: Box<Planning>,
    /// Allocations moved, and their bytes, by compactions before growth.
    moved_before_growth: (u64, u64),
}

/// The planners' buffers, kept so that they are reused (a plan runs
/// before most growths; allocating them each time was a page fault per
/// plan on a large pool).
#[derive(Debug, Default)]
struct Planning {
    /// The last range's view (`blocks.rs`).
    view: std::cell::RefCell<blocks::RangeView>,
    /// The window planner's free blocks.
    holes: std::cell::RefCell<Vec<holes::Hole>>,
}

impl ExpandablePool {
    pub(crate) fn new(
        kind: PoolKind,
        range_size: u64,
        granule: u64,
        config: &PoolConfig,
        free_room: FreeRoom,
    ) -> Self {
        let granule = granule.max(1);
        Self {
            kind,
            max_alloc_size: config.max_alloc_size,
            granule,
            range_size: align_up(range_size.max(granule), granule),
            dealloc_period: config.dealloc_period,
            ranges: Vec::new(),
            spare: Vec::new(),
            unmapped_ranges: 0,
            arena: Arena::default(),
            voids: BTreeMap::new(),
            idle_due: None,
            sweep: Vec::new(),
            free_slack_one_in: free_room.slack_one_in,
            keep_peak: free_room.keep_peak,
            // No peak yet: the slack alone, at least a granule.
            kept_at_peak: Cell::new((0, granule)),
            untrimmable: 0,
            stats: PoolStats::default(),
            used: 0,
            fence: None,
            planning: Box::default(),
            moved_before_growth: (0, 0),
        }
    }

    /// Whether the mapped bytes exceed the allocations' by `threshold`
    /// times and by a granule at least: worth a relocation's evacuation.
    pub(crate) fn wants_compaction(&self, threshold: f64) -> bool {
        let mapped = self.mapped();
        self.free_mapped() >= self.granule
            && mapped as f64 > self.used as f64 * threshold
            && mapped > self.kept_mapped()
    }

    /// Whether a growth for `aligned` bytes evacuates this pool first,
    /// `when` (see [`Evacuate`]).
    pub(crate) fn evacuates_before(&self, when: Evacuate, aligned: u64) -> bool {
        let mapped = self.mapped();
        match when {
            Evacuate::PastHighWater => {
                let peak = self.stats.peak_in_use;
                let line = peak.saturating_add(peak / HIGH_WATER_SLACK_ONE_IN);
                self.free_mapped() >= self.granule
                    && mapped.saturating_add(self.new_page_size(aligned)) > line
            }
            // A pool that trims keeps its free room at its slack already;
            // what the trim leaves lies in parts of granules, which every
            // growth would evacuate again (the mixed ring: 1.21 bytes moved
            // per byte reserved with it, 0.76 without; random traces'
            // managers alone 0.006-0.019 higher, `git show d502a2e:docs/performance.md`).
            Evacuate::MostlyFree => {
                self.free_slack_one_in.is_none()
                    && self.free_mapped().saturating_mul(EVACUATE_WHEN_FREE_ONE_IN) >= mapped
            }
        }
    }

    /// Whether the pool keeps the room its peak needed mapped.
    pub(crate) fn keeps_peak_mapped(&self) -> bool {
        self.keep_peak
    }

    /// What the pool keeps mapped while nothing asks for memory back: the
    /// most its allocations have held at once, and its slack.
    #[inline]
    pub(crate) fn kept_mapped(&self) -> u64 {
        if !self.keep_peak {
            return 0;
        }
        let peak = self.stats.peak_in_use;
        // The peak rarely moves, and this is asked at every reservation
        // (the cleanup and the trim before it): the division once a peak.
        let (at, kept) = self.kept_at_peak.get();
        if at == peak {
            return kept;
        }
        let slack = self
            .free_slack_one_in
            .map_or(0, |one_in| peak.checked_div(one_in).unwrap_or(0));
        let kept = peak.saturating_add(slack.max(self.granule));
        self.kept_at_peak.set((peak, kept));
        kept
    }

    /// Bytes mapped, all ranges.
    pub(crate) fn mapped(&self) -> u64 {
        self.stats.usage.bytes_reserved
    }

    /// Mapped bytes no allocation holds.
    pub(crate) fn free_mapped(&self) -> u64 {
        self.mapped().saturating_sub(self.used)
    }

    pub(crate) fn try_reserve(&mut self, size: u64, aligned: u64, slot: u32) -> Option<Placement> {
        let node = self.arena.carve(aligned)?;
        Some(self.carved(node, size, aligned, slot))
    }

    fn carved(&mut self, node: u32, size: u64, aligned: u64, slot: u32) -> Placement {
        let placement = self.arena.hand_to(node, slot);
        let range = &mut self.ranges[placement.page() as usize];
        range.live += 1;
        range.used += aligned;
        self.used += aligned;
        self.stats.allocated(size, aligned);
        placement
    }

    /// Serve `aligned` bytes by mapping more: the fewest granules, placed
    /// after the free block that can use the most of them (ties: the lowest
    /// address, so placement is the same on every run); a new range when no
    /// void run is long enough.
    fn reserve_new_page(
        &mut self,
        storage: &mut dyn DeviceStorage,
        wanted: Wanted,
    ) -> Result<Placement, StorageError> {
        let (size, aligned, slot) = (wanted.size, wanted.aligned, wanted.slot);
        let (void, needed) = match self.best_void(aligned) {
            Some(found) => found,
            None => {
                let index = self.add_range(storage, aligned)?;
                let first = self.ranges[index as usize].first;
                (first, align_up(aligned, self.granule))
            }
        };
        let free = self.map_void(storage, void, needed)?;
        self.arena.carve_at(free, aligned);
        Ok(self.carved(free, size, aligned, slot))
    }

    /// The void run to map for `aligned` bytes and how many bytes to map
    /// there: the free block just before a void run can hold the start.
    fn best_void(&self, aligned: u64) -> Option<(u32, u64)> {
        let mut best: Option<(u32, u64)> = None;
        for &node in self.voids.values() {
            let range = &self.ranges[self.arena.page(node) as usize];
            if range.guards > 0 {
                continue;
            }
            let prev = self.arena.prev(node);
            let before = if prev != NONE && self.arena.is_free(prev) {
                self.arena.size(prev)
            } else {
                0
            };
            let size = self.arena.size(node);
            let mut needed = align_up(aligned.saturating_sub(before), self.granule);
            // Mapped whole, a void also joins the free block after it: a
            // gap between two segments filled closes both their edges.
            let next = self.arena.next(node);
            let after = if next != NONE && self.arena.is_free(next) {
                self.arena.size(next)
            } else {
                0
            };
            if before + size + after >= aligned && size <= needed {
                needed = size;
            }
            if needed <= size && best.is_none_or(|(_, least)| needed < least) {
                best = Some((node, needed));
            }
        }
        best
    }

    /// The most a growth for `aligned` bytes could map, without looking
    /// at the voids: a void is only chosen for needing fewer granules.
    pub(crate) fn new_page_size_at_most(&self, aligned: u64) -> u64 {
        align_up(aligned, self.granule)
    }

    /// What a growth for `aligned` bytes would map now.
    pub(crate) fn new_page_size(&self, aligned: u64) -> u64 {
        self.best_void(aligned)
            .map_or_else(|| align_up(aligned, self.granule), |(_, needed)| needed)
    }

    pub(crate) fn free(&mut self, placement: Placement, size: u64, aligned: u64, serial: u64) {
        let range = &mut self.ranges[placement.page() as usize];
        range.live -= 1;
        range.used -= aligned;
        self.used -= aligned;
        let fenced = self.fence.as_ref().is_some_and(|fence| {
            fence.range == placement.page()
                && placement.offset < fence.end
                && placement.offset + aligned > fence.start
        });
        let listed = range.guards == 0 && !fenced;
        let merged = self.arena.free(placement.node(), listed);
        if fenced {
            // It may have merged with a listed neighbour outside the window.
            self.arena.set_listed(merged, false);
        }
        self.stats.freed(size, aligned);
        self.let_go(placement.page(), placement.offset, aligned, serial);
        if self.whole_granules(merged).is_some() {
            self.idle_from(serial);
        }
    }

    /// The whole granules of the free block `node`, if it holds any.
    fn whole_granules(&self, node: u32) -> Option<(u64, u64)> {
        let start = self.arena.offset(node);
        let end = start + self.arena.size(node);
        let (first, last) = (align_up(start, self.granule), align_down(end, self.granule));
        (first < last).then_some((first, last))
    }

    /// Unmap the whole granules of the free block `node`, if it still is
    /// one: the bytes unmapped, and the last block it touched (the walk of
    /// `unmap_all_free` goes on after it).
    fn unmap_free(&mut self, storage: &mut dyn DeviceStorage, node: u32) -> (u64, u32) {
        if !self.arena.is_free(node) {
            return (0, node);
        }
        let Some((first, last)) = self.whole_granules(node) else {
            return (0, node);
        };
        self.unmap_span(storage, node, first, last)
    }

    #[inline]
    pub(crate) fn cleanup(&mut self, storage: &mut dyn DeviceStorage, sweep: Sweep) -> bool {
        debug_assert_eq!(
            self.unmapped_ranges as usize,
            self.ranges
                .iter()
                .filter(|r| r.held && r.mapped == 0)
                .count(),
            "the count of unmapped ranges follows every map, unmap and give-back"
        );
        if let Sweep::Idle { serial, quiet } = sweep
            && self.nothing_to_sweep(serial, quiet)
        {
            return false;
        }
        self.sweep(storage, sweep)
    }

    /// Whether a periodic cleanup at `serial` would find nothing to do: what
    /// most reservations find, answered without a walk (the cleanup runs
    /// before each). Nothing unmaps when nothing is idle long enough, or
    /// when the pool keeps its peak mapped and is within it; and only a
    /// range with nothing mapped can be all void.
    #[inline]
    fn nothing_to_sweep(&self, serial: u64, quiet: bool) -> bool {
        if self.dealloc_period.is_none() {
            return true;
        }
        self.unmapped_ranges == 0
            && (self.idle_due.is_none_or(|due| serial < due) || self.keeps_what_it_maps(quiet))
    }

    /// Whether a periodic cleanup leaves every free granule mapped: the
    /// pool keeps its peak mapped and is within it, and the stream is not
    /// idle (`quiet`).
    #[inline]
    fn keeps_what_it_maps(&self, quiet: bool) -> bool {
        self.keep_peak && !quiet && self.mapped() <= self.kept_mapped()
    }

    fn sweep(&mut self, storage: &mut dyn DeviceStorage, sweep: Sweep) -> bool {
        let mut released = false;
        match sweep {
            Sweep::All => {
                self.idle_due = None;
                released |= self.unmap_all_free(storage);
            }
            Sweep::Idle { serial, quiet } => {
                let Some(period) = self.dealloc_period else {
                    return false;
                };
                if self.keeps_what_it_maps(quiet) {
                    return self.give_back_void_ranges(storage);
                }
                if self.idle_due.is_some_and(|due| serial >= due) {
                    released |= self.unmap_idle(storage, serial, period);
                }
            }
        }
        released |= self.give_back_void_ranges(storage);
        released
    }

    /// Unmap every whole free granule of every range (explicit cleanup,
    /// relocation, give-back): a walk of the blocks.
    pub(crate) fn unmap_all_free(&mut self, storage: &mut dyn DeviceStorage) -> bool {
        let mut unmapped = 0;
        for index in 0..self.ranges.len() {
            if !self.ranges[index].held {
                continue;
            }
            let mut node = self.ranges[index].first;
            while node != NONE {
                let (bytes, last) = self.unmap_free(storage, node);
                unmapped += bytes;
                node = self.arena.next(last);
            }
        }
        unmapped > 0
    }

    pub(crate) fn guard(&mut self, index: u32) {
        let range = &mut self.ranges[index as usize];
        self.arena.add_guard(range.first, &mut range.guards);
    }

    pub(crate) fn unguard(&mut self, index: u32, _serial: u64) {
        let range = &mut self.ranges[index as usize];
        range.guards -= 1;
        if range.guards == 0 {
            self.arena.relist_page(range.first);
        }
    }

    /// Bytes of address space held.
    pub(crate) fn address_space(&self) -> u64 {
        self.ranges
            .iter()
            .filter(|range| range.held)
            .map(|range| range.size)
            .sum()
    }

    pub(crate) fn max_alloc_size(&self) -> u64 {
        self.max_alloc_size
    }

    pub(crate) fn stats(&self) -> &PoolStats {
        &self.stats
    }

    pub(crate) fn report(&self) -> PoolReport {
        PoolReport {
            address_space: self.address_space(),
            ..self.stats.report(self.kind, self.max_alloc_size)
        }
    }
}
