//! Compaction before growth: when an expandable pool would map more for a
//! reservation but holds enough free room in total, move the live
//! allocations of the cheapest run of its address space elsewhere and serve
//! the reservation there, if the bytes moved pay for the bytes not mapped
//! and every one of them has a free block to go to (the plan of
//! `pool/expandable/window.rs`: nothing moves in vain).
//!
//! The cost model counts bytes only (no timings), so the same calls make the
//! same decisions on every machine: a window of `aligned` bytes is cleared
//! when the allocations on it come to at most [`MOVE_PER_BYTE_SAVED`] times
//! what the growth would map. Unmapping comes first
//! (`unmap_before_growth`): free granules go back before anything moves.
//! Pinned allocations, guarded ranges and whole-page pools never move; a
//! move claims its allocation with the pin-word CAS every relocation uses.

use super::error::MemoryError;
use super::manager::MemoryManager;
use super::pool::{Evacuation, Placement, Pool};
use super::relocation::Destination;
use super::relocation::RelocationReport;
use crate::storage::DeviceStorage;

/// Bytes a compaction before growth may copy for each byte of memory it
/// saves mapping. Four: a device-to-device copy runs at memory bandwidth
/// (microseconds a MiB), while a byte not mapped is a byte another stream
/// can use. Measured on the fragmentation family (`docs/performance.md`):
/// 1.113 peak ratio at one, 1.066 at four, no better at sixteen.
pub const MOVE_PER_BYTE_SAVED: u64 = 4;

/// A growth no window could spare evacuates first when at least one
/// mapped byte in this many lies free. Sixteen: on the fragmentation and
/// random families (seeds 1, 2, 4, manager alone) one in eight left
/// fragment at 1.053-1.080 and random at 1.131-1.135, sixteen gave
/// 1.037-1.061 and 1.108-1.119, thirty-two the same at twice the time.
pub const EVACUATE_WHEN_FREE_ONE_IN: u64 = 16;

impl<S: DeviceStorage> MemoryManager<S> {
    /// Serve `aligned` bytes of expandable pool `pool` by clearing a window
    /// of its mapped room, when that pays; `None` when it does not (or a
    /// move could not be made: what moved stays moved, nothing is lost).
    pub(crate) fn compact_before_growth(
        &mut self,
        pool: usize,
        size: u64,
        aligned: u64,
        slot: u32,
    ) -> Option<Placement> {
        let Pool::Expandable(expandable) = &self.pools[pool] else {
            return None;
        };
        if expandable.free_mapped() < aligned {
            return None;
        }
        let saved = expandable.new_page_size(aligned);
        let budget = saved.saturating_mul(MOVE_PER_BYTE_SAVED);
        let slots = &self.slots;
        let window = expandable.plan_window(aligned, budget, |owner| {
            slots
                .get(owner)
                .is_some_and(|live| !live.is_pinned() && !live.pinned_through_retired())
        })?;
        let Pool::Expandable(expandable) = &mut self.pools[pool] else {
            unreachable!("checked above");
        };
        expandable.fence(&window);
        let mut holes = window.holes.clone();
        for step in &window.moves {
            let hole = holes[step.hole];
            match self.move_slot(pool, step.slot, Destination::Into(hole)) {
                Ok(Some(bytes)) => {
                    self.moved_before_growth.0 += 1;
                    self.moved_before_growth.1 += bytes;
                }
                // Pinned since the plan (a client's pin needs no round
                // trip), or a failed copy (the allocation stays where it
                // was): the window stays short and the growth goes ahead.
                Ok(None) | Err(_) => break,
            }
            let Pool::Expandable(expandable) = &self.pools[pool] else {
                unreachable!("checked above");
            };
            // The move carved the start of the hole; the rest is where the
            // next move planned there lands.
            holes[step.hole] = expandable.rest_of_hole(hole);
        }
        let Pool::Expandable(expandable) = &mut self.pools[pool] else {
            unreachable!("checked above");
        };
        expandable.unfence_and_reserve(size, aligned, slot)
    }

    /// Serve `aligned` bytes of expandable pool `pool` after an evacuation
    /// (below) gave back the granules it could, when enough of the mapped
    /// room lies free ([`EVACUATE_WHEN_FREE_ONE_IN`]); `None` when it does
    /// not or the room freed does not hold them (the growth then maps).
    pub(crate) fn evacuate_before_growth(
        &mut self,
        pool: usize,
        size: u64,
        aligned: u64,
        slot: u32,
    ) -> Option<Placement> {
        let Pool::Expandable(expandable) = &self.pools[pool] else {
            return None;
        };
        let mapped = expandable.stats().usage.bytes_reserved;
        if expandable
            .free_mapped()
            .saturating_mul(EVACUATE_WHEN_FREE_ONE_IN)
            < mapped
        {
            return None;
        }
        let mut report = RelocationReport::default();
        // A failed copy leaves its allocation in place: the growth goes on.
        let _ = self.evacuate_granules(pool, &mut report);
        if report.moved == 0 {
            return None;
        }
        self.moved_before_growth.0 += report.moved;
        self.moved_before_growth.1 += report.bytes_moved;
        if let Some(placement) = self.pools[pool].try_reserve(size, aligned, slot) {
            return Some(placement);
        }
        // What the evacuation emptied goes back before the growth maps.
        self.unmap_before_growth(pool, aligned);
        None
    }

    /// Move allocations of expandable pool `pool` down into free blocks
    /// below them where that releases granules worth the bytes moved
    /// (`pool/expandable/evacuate.rs`); what moved goes in `report`. The
    /// granules go back at the unmapping that follows.
    pub(crate) fn evacuate_granules(
        &mut self,
        pool: usize,
        report: &mut RelocationReport,
    ) -> Result<(), MemoryError> {
        let Pool::Expandable(expandable) = &self.pools[pool] else {
            return Ok(());
        };
        let mut evacuation = expandable.evacuation();
        loop {
            let Pool::Expandable(expandable) = &self.pools[pool] else {
                unreachable!("checked above");
            };
            let slots = &self.slots;
            let next = expandable.next_group(&mut evacuation, MOVE_PER_BYTE_SAVED, |owner| {
                slots
                    .get(owner)
                    .is_some_and(|live| !live.is_pinned() && !live.pinned_through_retired())
            });
            let Some(group) = next else {
                return Ok(());
            };
            // (block as planned, what is left of it now) for each one used.
            let mut landed: Vec<(u32, u32)> = Vec::new();
            for &(slot, planned) in &group.moves {
                let at = match landed.iter().position(|&(p, _)| p == planned) {
                    Some(at) => at,
                    None => {
                        landed.push((planned, planned));
                        landed.len() - 1
                    }
                };
                let into = landed[at].1;
                let moved = match self.move_slot(pool, slot, Destination::Into(into)) {
                    Ok(moved) => moved,
                    Err(error) => {
                        self.note_group(pool, &mut evacuation, &landed);
                        return Err(error);
                    }
                };
                match moved {
                    Some(bytes) => {
                        report.moved += 1;
                        report.bytes_moved += bytes;
                        let Pool::Expandable(expandable) = &self.pools[pool] else {
                            unreachable!("checked above");
                        };
                        // The move carved the start of the block; the rest
                        // is where the next one planned there lands.
                        landed[at].1 = expandable.rest_of_hole(into);
                    }
                    // Pinned by a client since it was planned: the rest of
                    // the group stays too.
                    None => {
                        report.skipped_pinned += 1;
                        break;
                    }
                }
            }
            self.note_group(pool, &mut evacuation, &landed);
        }
    }

    fn note_group(&self, pool: usize, evacuation: &mut Evacuation, landed: &[(u32, u32)]) {
        if let Pool::Expandable(expandable) = &self.pools[pool] {
            expandable.group_moved(evacuation, landed);
        }
    }

    /// Allocations moved, and their bytes, by compactions before growth.
    pub fn moved_before_growth(&self) -> (u64, u64) {
        self.moved_before_growth
    }
}
