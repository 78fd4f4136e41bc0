//! Evacuation: what a relocation does in an expandable arena. Holes cost
//! nothing once their granules are unmapped, but a granule that one small
//! allocation still touches stays mapped; after a load falls, such
//! granules are most of what a stream holds beyond its live bytes.
//!
//! So a relocation walks the allocations from the top of the address space
//! down and moves each into the best-fitting free block *below* the
//! granules it touches, when
//! taking it away releases granules worth its bytes: at least one byte of
//! granule no other allocation touches for every
//! [`MOVE_PER_BYTE_SAVED`](crate::memory::MOVE_PER_BYTE_SAVED) bytes moved.
//! Moving down only, in one pass, ends; and because the walk goes top
//! down, an allocation whose neighbour above has just left counts the
//! granule they shared as its own to release. The granules go back at the
//! unmapping that follows (`unmap_all_free`).

use super::holes::{Hole, Holes};
use super::{ExpandablePool, VOID};
use crate::memory::arena::NONE;

/// An evacuation under way: the allocations still to look at, top down,
/// and the free blocks below them (tagged with their arena node).
#[derive(Debug)]
pub(crate) struct Evacuation {
    /// Allocation nodes, highest address last (popped first).
    allocations: Vec<u32>,
    /// Free blocks a move may land in.
    holes: Holes,
}

/// One move of an evacuation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Evacuee {
    /// The allocation's slot.
    pub(crate) slot: u32,
    /// The free block it moves to the start of.
    pub(crate) hole: u32,
    /// That block as the plan listed it.
    listed: Hole,
    /// The allocation's bytes (aligned).
    size: u64,
}

impl ExpandablePool {
    /// Start an evacuation of every held range without a page guard.
    pub(crate) fn evacuation(&self) -> Evacuation {
        let mut allocations = Vec::new();
        let mut holes = Vec::new();
        for (index, range) in self.ranges.iter().enumerate() {
            if !range.held || range.guards > 0 {
                continue;
            }
            let mut node = range.first;
            while node != NONE {
                if self.arena.is_free(node) {
                    let hole = (
                        self.arena.size(node),
                        index as u32,
                        self.arena.offset(node),
                        node as usize,
                    );
                    holes.push(hole);
                } else if self.arena.owner(node) != VOID {
                    allocations.push(node);
                }
                node = self.arena.next(node);
            }
        }
        Evacuation {
            allocations,
            holes: Holes::sorted(holes),
        }
    }

    /// The next allocation worth moving down, and where to; `None` when
    /// the walk is done.
    pub(crate) fn next_evacuee(
        &self,
        evacuation: &mut Evacuation,
        move_per_byte_saved: u64,
        movable: impl Fn(u32) -> bool,
    ) -> Option<Evacuee> {
        while let Some(node) = evacuation.allocations.pop() {
            let slot = self.arena.owner(node);
            let size = self.arena.size(node);
            if !movable(slot) {
                continue;
            }
            let released = self.released_by(node);
            if released.saturating_mul(move_per_byte_saved) < size {
                continue;
            }
            // It lands wholly below the granules it releases.
            let range = self.arena.page(node);
            let limit = self.arena.offset(node) / self.granule * self.granule;
            if let Some(listed) = evacuation.holes.best_fit_below(size, range, limit) {
                return Some(Evacuee {
                    slot,
                    hole: listed.3 as u32,
                    listed,
                    size,
                });
            }
        }
        None
    }

    /// `evacuee` moved: its hole now starts after it. (Blocks freed where it
    /// was lie above every allocation still to look at: never a target.)
    pub(crate) fn evacuated(&self, evacuation: &mut Evacuation, evacuee: Evacuee) {
        evacuation.holes.remove(&evacuee.listed);
        let (size, range, offset, _) = evacuee.listed;
        let rest = self.rest_of_hole(evacuee.hole);
        if size > evacuee.size && rest != NONE {
            let rest = (
                size - evacuee.size,
                range,
                offset + evacuee.size,
                rest as usize,
            );
            evacuation.holes.insert(rest);
        }
    }

    /// Bytes of mapped granules that only the allocation at `node` touches:
    /// what taking it away would let the next unmapping release.
    fn released_by(&self, node: u32) -> u64 {
        let granule = self.granule;
        let start = self.arena.offset(node);
        let end = start + self.arena.size(node);
        let first = start / granule;
        let last = (end - 1) / granule;
        // The nearest allocations on either side (free and void blocks hold
        // nothing).
        let neighbour = |step: fn(&Self, u32) -> u32| {
            let mut next = step(self, node);
            while next != NONE && (self.arena.is_free(next) || self.arena.owner(next) == VOID) {
                next = step(self, next);
            }
            next
        };
        let below = neighbour(|pool, n| pool.arena.prev(n));
        let above = neighbour(|pool, n| pool.arena.next(n));
        let shares_first = below != NONE
            && self.arena.page(below) == self.arena.page(node)
            && self.arena.offset(below) + self.arena.size(below) > first * granule;
        let shares_last = above != NONE
            && self.arena.page(above) == self.arena.page(node)
            && self.arena.offset(above) < (last + 1) * granule;
        let mut granules = last - first + 1;
        if first == last {
            if shares_first || shares_last {
                granules = 0;
            }
        } else {
            granules -= u64::from(shares_first) + u64::from(shares_last);
        }
        granules * granule
    }
}
