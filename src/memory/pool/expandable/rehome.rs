//! Re-homing, at a settle: the driver frees only whole physical handles,
//! so the free granules that share a handle with the edge of an
//! allocation stay held after the load fell, whatever a compaction
//! gathers (a stream left with one 260 MiB allocation kept 44 MiB mapped
//! that way). Such an allocation moves into the first run of unmapped
//! space above it that holds it, a granule clear of what it pins, mapped
//! for exactly its granules; the handles it leaves then go back whole at
//! the unmapping that follows. A move is made only where it pays in
//! handles: where the handles it lets go whole come to more than its new
//! home maps, or where moving every allocation of its mapped island (the
//! blocks between two void runs) would. What one move freed can leave a
//! neighbour pinning in its turn: the settle looks again (`compact.rs`,
//! `REHOME_PASSES`).
//!
//! The long form: `docs/memory.md`, "Re-homing at a settle".

use super::{ExpandablePool, VOID};
use crate::memory::error::MemoryError;
use crate::memory::pool::arena::NONE;
use crate::memory::pool::mover::Mover;
use crate::memory::pool::page::{align_down, align_up};
use crate::memory::relocation::RelocationReport;
use crate::storage::DeviceStorage;

/// An allocation re-homes at a settle where the granules it pins are at
/// least one byte in this many of its own (the slide planners' rate: a
/// settle comes once a load fell, and what it leaves mapped stays).
pub(super) const REHOME_PER_BYTE_SAVED: u64 = super::compact::SLIDE_PER_BYTE_SAVED;

impl ExpandablePool {
    /// Move every allocation that pins at least one byte in
    /// [`REHOME_PER_BYTE_SAVED`] of its own, in free granules that could
    /// not go back, into the first run of unmapped space above each that
    /// holds it, a granule clear:
    /// where that maps no more than the pool's high-water mark, and never
    /// on a device whose streams share a budget (whether a map succeeds
    /// would depend on timing there). What moved goes in `report`; the
    /// caller unmaps what it freed.
    pub(super) fn rehome_pinning(
        &mut self,
        mover: &mut Mover<'_>,
        report: &mut RelocationReport,
    ) -> Result<(), MemoryError> {
        if mover.storage.shares_a_budget() {
            return Ok(());
        }
        let pinning: Vec<(u32, u64)> = {
            let movable = mover.movable();
            (self.pinning().into_iter())
                .filter(|&(slot, _)| movable(slot))
                .collect()
        };
        if pinning.is_empty() {
            return Ok(());
        }
        // What the unmapping before gave back goes first, in stream
        // order: a home mapped over granules still on their way back
        // would take them back, in the handles they left.
        mover.storage.flush();
        for (slot, aligned) in pinning {
            let needed = align_up(aligned, self.granule);
            if self.mapped().saturating_add(needed) > self.stats.peak_reserved {
                continue;
            }
            let Some(node) = mover.slots.get(slot).map(|live| live.placement.node()) else {
                continue;
            };
            if !self.move_pays(&*mover.storage, node, needed, &mover.movable()) {
                continue;
            }
            let Some(void) = self.void_above(node, needed.saturating_add(self.granule)) else {
                continue;
            };
            // A granule of the void stays below, so the new home joins no
            // free block (and no handle) it pinned.
            let index = self.arena.page(void);
            let clear = self.arena.split(void, self.granule);
            self.voids.insert((index, self.arena.offset(clear)), clear);
            let Ok(home) = self.map_void(mover.storage, clear, needed) else {
                break;
            };
            if let Some(bytes) = self.move_into(mover, slot, home)? {
                report.moved += 1;
                report.bytes_moved += bytes;
            }
        }
        Ok(())
    }

    /// The allocations (slot, aligned bytes) that pin free granules worth
    /// their move: the whole free granules of the free blocks right below
    /// and above each, where the far side of such a block is unmapped
    /// space (so nothing else shares the handles they pin). Run after
    /// every granule that could go went: what is left free is pinned.
    fn pinning(&self) -> Vec<(u32, u64)> {
        let mut pinning = Vec::new();
        for range in (self.ranges.iter()).filter(|range| range.held && range.guards == 0) {
            let mut node = range.first;
            while node != NONE {
                let next = self.arena.next(node);
                if !self.arena.is_free(node) && self.arena.owner(node) != VOID {
                    let prev = self.arena.prev(node);
                    let pinned = self.pinned_beside(prev, false) + self.pinned_beside(next, true);
                    let aligned = self.arena.size(node);
                    if pinned > 0 && pinned.saturating_mul(REHOME_PER_BYTE_SAVED) >= aligned {
                        pinning.push((self.arena.owner(node), aligned));
                    }
                }
                node = next;
            }
        }
        pinning
    }

    /// Whether moving the allocation at `node` into `needed` bytes of
    /// fresh granules lets go more: the whole handles its granules and the
    /// free blocks beside it make, or else those of its whole mapped
    /// island, against what homes for each of the island's allocations
    /// map (where all of them may move). Without it a small allocation
    /// moved into a granule of its own while the handle it left stayed
    /// held by a neighbour: a lone stream held up to 1.072 of live after
    /// its load fell, against 1.027 not moving it (`random_geo-h101`).
    fn move_pays(
        &self,
        storage: &dyn DeviceStorage,
        node: u32,
        needed: u64,
        movable: &impl Fn(u32) -> bool,
    ) -> bool {
        let (prev, next) = (self.arena.prev(node), self.arena.next(node));
        let free = |block: u32| block != NONE && self.arena.is_free(block);
        let low = if free(prev) { prev } else { node };
        let high = if free(next) { next } else { node };
        if self.whole_handles_over(storage, low, high) > needed {
            return true;
        }
        // The island: every block between the void runs around `node`.
        let inside = |block: u32| block != NONE && !self.arena.is_carved_by(block, VOID);
        let mut low = node;
        while inside(self.arena.prev(low)) {
            low = self.arena.prev(low);
        }
        let (mut high, mut homes, mut at) = (low, 0u64, low);
        while inside(at) {
            if !self.arena.is_free(at) {
                if !movable(self.arena.owner(at)) {
                    return false;
                }
                homes = homes.saturating_add(align_up(self.arena.size(at), self.granule));
            }
            high = at;
            at = self.arena.next(at);
        }
        self.whole_handles_over(storage, low, high) > homes
    }

    /// Bytes of the whole physical handles among the granules that lie
    /// wholly within the blocks `low` to `high` (one run of blocks), were
    /// all of them free.
    fn whole_handles_over(&self, storage: &dyn DeviceStorage, low: u32, high: u32) -> u64 {
        let first = align_up(self.arena.offset(low), self.granule);
        let end = self.arena.offset(high) + self.arena.size(high);
        let last = align_down(end, self.granule);
        if first >= last {
            return 0;
        }
        let range = self.range_handle(self.arena.page(low), first, last - first);
        storage.whole_handles(&range).size
    }

    /// The first run of unmapped space above the block `node`, in its
    /// range, of at least `bytes`: where an allocation there can move
    /// without sharing a granule (nor a handle) with what it leaves.
    pub(super) fn void_above(&self, node: u32, bytes: u64) -> Option<u32> {
        let mut at = self.arena.next(node);
        while at != NONE {
            if self.arena.is_carved_by(at, VOID) && self.arena.size(at) >= bytes {
                return Some(at);
            }
            at = self.arena.next(at);
        }
        None
    }

    /// Bytes of whole free granules in `block`, when it is free and lies
    /// against unmapped space (or the range's end) on its far side, above
    /// it where `above`: 0 otherwise.
    fn pinned_beside(&self, block: u32, above: bool) -> u64 {
        if block == NONE || !self.arena.is_free(block) {
            return 0;
        }
        let beyond = if above {
            self.arena.next(block)
        } else {
            self.arena.prev(block)
        };
        if beyond != NONE && !self.arena.is_carved_by(beyond, VOID) {
            return 0;
        }
        self.whole_granules(block)
            .map_or(0, |(first, last)| last - first)
    }
}

#[cfg(test)]
mod tests {
    use crate::memory::{MemoryConfig, MemoryManager, PageUpdate, RelocationReason};
    use crate::storage::{DEFAULT_GRANULE, DeviceStorage, VirtualStorage};

    const G: u64 = DEFAULT_GRANULE;

    /// A manager whose pool grew to 2 GiB (physical handles of 8 granules
    /// at its start, then 16), then emptied: all of it free and mapped.
    fn grown_and_emptied() -> MemoryManager<VirtualStorage> {
        let mut memory = MemoryManager::new(VirtualStorage::new(), MemoryConfig::default());
        let grown = [(); 2].map(|()| memory.reserve(512 * G, PageUpdate::Allow).unwrap());
        drop(grown);
        memory
    }

    /// Settle `memory` (re-homing or not) and flush what went: the
    /// allocations moved.
    fn settle(memory: &mut MemoryManager<VirtualStorage>, rehome: bool) -> u64 {
        let moved = memory
            .relocate_rehoming(RelocationReason::Settle, rehome)
            .unwrap()
            .moved;
        memory.flush();
        moved
    }

    /// A pool grown to 2 GiB (physical handles of 8 granules at its
    /// start), emptied, then holding one allocation of 10 granules at its
    /// start (the second handle 2 granules used, 6 free), settled:
    /// the bytes its storage holds after, and the handles it created.
    fn settled(rehome: bool) -> (u64, u64) {
        let mut memory = grown_and_emptied();
        let kept = memory.reserve(10 * G, PageUpdate::Allow).unwrap();
        assert_eq!(settle(&mut memory, rehome), u64::from(rehome));
        drop(kept);
        (
            memory.bytes_allocated(),
            memory.storage().driver_ops().handles_created,
        )
    }

    #[test]
    fn a_settle_rehomes_an_allocation_whose_handle_pins_free_granules() {
        let (held, created) = settled(false);
        assert_eq!(
            held,
            16 * G,
            "the free rest of its second handle stays held"
        );
        let (held, rehomed) = settled(true);
        assert_eq!(held, 10 * G, "moved into handles of exactly its size");
        assert!(rehomed > created, "new handles for its new home");
    }

    /// The same pool holding one allocation of granules 10..24, which
    /// ends with its third handle (granules 16..24), so nothing free lies
    /// above it: what it pins is granules 8 and 9, below it.
    #[test]
    fn a_settle_rehomes_an_allocation_that_pins_free_granules_below_it_only() {
        let mut memory = grown_and_emptied();
        let below = memory.reserve(10 * G, PageUpdate::Allow).unwrap();
        let kept = memory.reserve(14 * G, PageUpdate::Allow).unwrap();
        drop(below);
        assert_eq!(settle(&mut memory, false), 0);
        assert_eq!(
            memory.bytes_allocated(),
            16 * G,
            "granules 8 and 9 share a handle with it"
        );
        assert_eq!(settle(&mut memory, true), 1);
        assert_eq!(memory.bytes_allocated(), 14 * G, "moved above, no pin left");
        drop(kept);
    }

    /// The same pool holding 9 granules at its start, pinned by a client,
    /// and a quarter granule right after them: the small one pins granules
    /// 10 to 15, but the second handle (granules 8..16) stays held by the
    /// large one whatever it does, so moving it into a granule of its own
    /// would only add one.
    #[test]
    fn a_settle_leaves_an_allocation_whose_move_lets_no_handle_go() {
        let mut memory = grown_and_emptied();
        let large = memory.reserve(9 * G, PageUpdate::Allow).unwrap();
        let small = memory.reserve(G / 4, PageUpdate::Allow).unwrap();
        let pin = memory.pin(&large).unwrap();
        assert_eq!(settle(&mut memory, true), 0);
        assert_eq!(memory.bytes_allocated(), 16 * G, "no granule added");
        drop((pin, small, large));
    }

    /// The same pool holding 14 granules at its start and a quarter
    /// granule right after them, in the second handle (granules 8..16):
    /// the small one pins granule 15, and once it moved away the large one
    /// pins granules 14 and 15. A settle looks again after its moves.
    #[test]
    fn a_settle_rehomes_what_a_move_left_pinning() {
        let mut memory = grown_and_emptied();
        let large = memory.reserve(14 * G, PageUpdate::Allow).unwrap();
        let small = memory.reserve(G / 4, PageUpdate::Allow).unwrap();
        assert_eq!(
            settle(&mut memory, true),
            2,
            "the small one, then the large one"
        );
        assert_eq!(
            memory.bytes_allocated(),
            15 * G,
            "each in granules of its own"
        );
        drop((large, small));
    }
}
