//! Re-homing a group, at a settle, after the one-at-a-time re-homing
//! (`rehome.rs`) found nothing more to move: free granules still held
//! because the physical handle they lie in is partly live, where no one
//! allocation's move frees the handle. The group is either every
//! allocation that overlaps one such handle, or every allocation of one
//! mapped island (the blocks between two void runs). All of it moves into
//! one home above, packed, a granule clear, mapped for exactly the
//! granules its bytes need; the handles it leaves go back whole at the
//! unmapping that follows. A group moves only where what goes back comes
//! to more than the home maps, by at least one byte in
//! [`REHOME_PER_BYTE_SAVED`] of the bytes it moves, and the best such
//! group goes first; the settle looks again after each (`compact.rs`,
//! `REHOME_GROUP_PASSES`).
//!
//! The long form: `docs/memory.md`, "Re-homing at a settle".

use super::rehome::REHOME_PER_BYTE_SAVED;
use super::{ExpandablePool, VOID};
use crate::memory::error::MemoryError;
use crate::memory::pool::arena::NONE;
use crate::memory::pool::mover::Mover;
use crate::memory::pool::page::align_up;
use crate::memory::relocation::RelocationReport;

/// Allocations that move together, and what their move gives back.
#[derive(Debug)]
struct Group {
    /// Bytes the handles it leaves give back, less what its home maps.
    gain: u64,
    /// Their slots, in address order.
    slots: Vec<u32>,
    /// Bytes their home maps: their aligned sizes, packed, in whole granules.
    home: u64,
    /// The highest of their blocks: the home goes above it.
    top: u32,
}

impl Group {
    /// The group of the blocks `blocks` (a run of one island, in address
    /// order: no void among them) whose move frees `freed` bytes of whole
    /// handles, unless one of them stays put or the move would not pay.
    fn of(
        pool: &ExpandablePool,
        blocks: &[u32],
        freed: u64,
        movable: &impl Fn(u32) -> bool,
    ) -> Option<Self> {
        let mut slots = Vec::new();
        let (mut moved, mut top) = (0u64, NONE);
        for &block in blocks {
            if pool.arena.is_free(block) {
                continue;
            }
            let slot = pool.arena.owner(block);
            if !movable(slot) {
                return None;
            }
            slots.push(slot);
            moved = moved.saturating_add(pool.arena.size(block));
            top = block;
        }
        let home = align_up(moved, pool.granule);
        let gain = freed.checked_sub(home).filter(|&gain| gain > 0)?;
        (!slots.is_empty() && gain.saturating_mul(REHOME_PER_BYTE_SAVED) >= moved).then_some(Self {
            gain,
            slots,
            home,
            top,
        })
    }
}

impl ExpandablePool {
    /// Move the group whose move gives back the most (see the module
    /// docs) into one home above it, where that maps no more than the
    /// pool's high-water mark, and never on a device whose streams share
    /// a budget (a map's success would depend on timing there). Whether
    /// anything moved (in `report`); the caller unmaps what it freed.
    pub(super) fn rehome_group(
        &mut self,
        mover: &mut Mover<'_>,
        report: &mut RelocationReport,
    ) -> Result<bool, MemoryError> {
        if mover.storage.shares_a_budget() {
            return Ok(false);
        }
        let Some(group) = self.best_group(mover) else {
            return Ok(false);
        };
        if self.mapped().saturating_add(group.home) > self.stats.peak_reserved {
            return Ok(false);
        }
        let Some(void) = self.void_above(group.top, group.home.saturating_add(self.granule)) else {
            return Ok(false);
        };
        // What the unmapping before gave back goes first, in stream order
        // (as `rehome_pinning` does).
        mover.storage.flush();
        // A granule of the void stays below, so the home joins no block
        // (and no handle) the group leaves.
        let index = self.arena.page(void);
        let clear = self.arena.split(void, self.granule);
        self.voids.insert((index, self.arena.offset(clear)), clear);
        let Ok(mut home) = self.map_void(mover.storage, clear, group.home) else {
            return Ok(false);
        };
        let mut moved = false;
        for slot in group.slots {
            if home == NONE {
                break;
            }
            if let Some(bytes) = self.move_into(mover, slot, home)? {
                report.moved += 1;
                report.bytes_moved += bytes;
                moved = true;
                // The move carved the home's start; the rest takes the next.
                home = self.rest_of_hole(home);
            }
        }
        Ok(moved)
    }

    /// The group whose move gives back the most, of every island of the
    /// held ranges and every handle in it that holds free granules (the
    /// first found where two tie).
    fn best_group(&self, mover: &Mover<'_>) -> Option<Group> {
        let movable = mover.movable();
        let mut best: Option<Group> = None;
        let mut consider = |group: Option<Group>| {
            if let Some(group) = group
                && best.as_ref().is_none_or(|best| group.gain > best.gain)
            {
                best = Some(group);
            }
        };
        for (index, range) in self.ranges.iter().enumerate() {
            if !range.held || range.guards != 0 {
                continue;
            }
            let blocks: Vec<u32> = self
                .arena
                .chain(range.first)
                .map(|(node, ..)| node)
                .collect();
            // Islands: runs of blocks between void runs. Handles are given
            // back whole, so every handle an island touches lies in it:
            // all of its bytes go back once everything in it moved.
            for island in blocks.split(|&block| self.arena.is_carved_by(block, VOID)) {
                let (Some(&low), Some(&high)) = (island.first(), island.last()) else {
                    continue;
                };
                let (start, end) = (self.arena.offset(low), self.end(high));
                consider(Group::of(self, island, end - start, &movable));
                self.each_handle_holding_free(mover, index as u32, island, |touched, bytes| {
                    consider(Group::of(self, touched, bytes, &movable))
                });
            }
        }
        best
    }

    /// Call `visit(blocks, bytes)` for every physical handle of the
    /// island `island` (blocks of range `index` in address order, between
    /// void runs) that holds whole free granules: the blocks that overlap
    /// it, and its bytes.
    fn each_handle_holding_free(
        &self,
        mover: &Mover<'_>,
        index: u32,
        island: &[u32],
        mut visit: impl FnMut(&[u32], u64),
    ) {
        let (Some(&low), Some(&high)) = (island.first(), island.last()) else {
            return;
        };
        let end = self.end(high);
        let (mut start, mut first) = (self.arena.offset(low), 0);
        while start < end {
            let handle_end = mover
                .storage
                .first_handle_end(&self.range_handle(index, start, end - start))
                .max(start + self.granule);
            while first < island.len() && self.end(island[first]) <= start {
                first += 1;
            }
            let overlapping = island[first..]
                .iter()
                .take_while(|&&block| self.arena.offset(block) < handle_end)
                .count();
            let touched = &island[first..first + overlapping];
            let holds_free = touched.iter().any(|&block| {
                self.arena.is_free(block)
                    && self
                        .whole_granules(block)
                        .is_some_and(|(low, high)| low.max(start) < high.min(handle_end))
            });
            if holds_free {
                visit(touched, handle_end - start);
            }
            start = handle_end;
        }
    }
}
