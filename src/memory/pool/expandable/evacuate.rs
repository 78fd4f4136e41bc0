//! Evacuation: what a relocation does in an expandable arena. Holes cost
//! nothing once their granules are unmapped, but a granule that one small
//! allocation still touches stays mapped; after a load falls, such
//! granules are most of what a stream holds beyond its live bytes.
//!
//! The long form: `docs/modules.md`, "`src/memory/pool/expandable/evacuate.rs`".

use super::holes::{Hole, Holes};
use super::{ExpandablePool, PlannedMove, VOID};
use crate::memory::pool::arena::NONE;
use crate::memory::pool::page::{align_down, units_below};

/// An evacuation under way: the allocations still to look at, top down,
/// and the free blocks below them (tagged with their arena node).
#[derive(Debug)]
pub(crate) struct Evacuation {
    /// Allocation nodes, highest address last (popped first).
    allocations: Vec<u32>,
    /// Free blocks a move may land in.
    holes: Holes,
}

/// The allocations of one group and where each goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Group {
    /// The moves, in the order planned.
    pub(crate) moves: Vec<PlannedMove>,
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

    /// The next group worth moving down, planned; `None` when the walk is
    /// done.
    pub(crate) fn next_group(
        &self,
        evacuation: &mut Evacuation,
        move_per_byte_saved: u64,
        movable: impl Fn(u32) -> bool,
    ) -> Option<Group> {
        let granule = self.granule;
        while let Some(top) = evacuation.allocations.pop() {
            let range = self.arena.page(top);
            let top_granule = units_below(self.end(top).saturating_sub(1), granule);
            // Everything else touching the top granule, down to the first
            // allocation that ends below it.
            let mut members: smallvec::SmallVec<[u32; 8]> = smallvec::smallvec![top];
            while let Some(&next) = evacuation.allocations.last() {
                if self.arena.page(next) != range || self.end(next) <= top_granule * granule {
                    break;
                }
                members.push(next);
                evacuation.allocations.pop();
            }
            // The questions a group must answer, cheapest and most often
            // refused first (on a fragmented pool seven in ten groups find
            // no hole below for their largest; no pin is read for them).
            let lowest = *members.last().expect("the top is a member");
            // They land wholly below the granules they touch.
            let limit = align_down(self.arena.offset(lowest), granule);
            let below = |hole: &Hole, size: u64| {
                hole.0 >= size && (hole.1 < range || (hole.1 == range && hole.2 + size <= limit))
            };
            // The paper placement starts with the largest and fails where
            // no hole below holds it: asked first, without planning the
            // rest.
            let largest = (members.iter().map(|&node| self.arena.size(node)))
                .max()
                .expect("the top is a member");
            if !evacuation.holes.holds(largest, below) {
                continue;
            }
            let released = self.released_by(lowest, top);
            let cost: u64 = members.iter().map(|&node| self.arena.size(node)).sum();
            if released.saturating_mul(move_per_byte_saved) < cost
                || !members.iter().all(|&node| movable(self.arena.owner(node)))
            {
                continue;
            }
            let allocations = members
                .iter()
                .map(|&node| {
                    (
                        self.arena.size(node),
                        self.arena.offset(node),
                        self.arena.owner(node),
                    )
                })
                .collect();
            if let Some(placed) = evacuation.holes.place_all(allocations, below) {
                let moves = placed
                    .into_iter()
                    .map(|(slot, hole)| (slot, hole as u32))
                    .collect();
                return Some(Group { moves });
            }
        }
        None
    }

    /// A group moved (as far as `landed` says: for each free block it
    /// used, by its node when planned, the node of what is left of it, or
    /// `NONE`): the holes below are what the moves left. Blocks freed where
    /// the group was lie above everything still to look at: never a target.
    pub(crate) fn group_moved(&self, evacuation: &mut Evacuation, landed: &[(u32, u32)]) {
        // Free blocks at or above the next allocation down can take nothing
        // more (a move lands below what it leaves), and some were merged
        // into the room the group left: forget them.
        if let Some(&next) = evacuation.allocations.last() {
            let (range, offset) = (self.arena.page(next), self.arena.offset(next));
            evacuation
                .holes
                .retain(|hole| (hole.1, hole.2) < (range, offset));
        }
        for &(planned, rest) in landed {
            if let Some(listed) = evacuation.holes.by_tag(planned as usize) {
                evacuation.holes.remove(&listed);
            }
            if rest != NONE {
                let (range, offset) = (self.arena.page(rest), self.arena.offset(rest));
                evacuation
                    .holes
                    .insert((self.arena.size(rest), range, offset, rest as usize));
            }
        }
    }

    /// One past the last byte of the block `node`.
    pub(super) fn end(&self, node: u32) -> u64 {
        self.arena.offset(node) + self.arena.size(node)
    }

    /// Bytes of mapped granules that only the allocations from `lowest` to
    /// `top` (a contiguous run) touch: what taking them away would let the
    /// next unmapping release.
    fn released_by(&self, lowest: u32, top: u32) -> u64 {
        let granule = self.granule;
        let first = units_below(self.arena.offset(lowest), granule);
        let last = units_below(self.end(top).saturating_sub(1), granule);
        // The nearest allocations on either side (free and void blocks hold
        // nothing).
        let neighbour = |from: u32, step: fn(&Self, u32) -> u32| {
            let mut next = step(self, from);
            while next != NONE && (self.arena.is_free(next) || self.arena.owner(next) == VOID) {
                next = step(self, next);
            }
            next
        };
        let below = neighbour(lowest, |pool, n| pool.arena.prev(n));
        let above = neighbour(top, |pool, n| pool.arena.next(n));
        let shares_first = below != NONE && self.end(below) > first * granule;
        let shares_last = above != NONE && self.arena.offset(above) < (last + 1) * granule;
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
