//! Planning a compaction before growth: which run of mapped address space
//! to clear for a reservation, and the free block each allocation on it
//! moves to.
//!
//! The long form: `docs/modules.md`, "`src/memory/pool/expandable/window.rs`".

use super::blocks::RangeView;
use super::holes::{Hole, Holes};
use super::{ExpandablePool, PlannedMove};
use crate::memory::pool::arena::NONE;
use crate::memory::pool::page::Placement;

/// Windows planned on paper before a compaction gives up (each costs a few
/// set operations per allocation on it).
pub(super) const WINDOWS_TRIED: usize = 8;

/// A run of blocks a compaction empties to serve one reservation: from the
/// free block `anchor` on, `end - start` bytes, of which `cost` are live
/// allocations, each with the free block it moves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Window {
    /// The range.
    pub(crate) range: u32,
    /// The free block it starts with (it survives the moves: everything
    /// freed after it merges into it).
    pub(crate) anchor: u32,
    /// First byte.
    pub(crate) start: u64,
    /// One past the last byte of its last block.
    pub(crate) end: u64,
    /// The moves, in the order planned (largest allocation first), each
    /// to a free block outside the window.
    pub(crate) moves: Vec<PlannedMove>,
    /// Bytes of the allocations on it.
    pub(crate) cost: u64,
}

/// A window before it is planned: where it is and what moving costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Candidate {
    pub(super) cost: u64,
    /// Bytes of the largest allocation on it (0 when none).
    pub(super) largest: u64,
    pub(super) range: u32,
    pub(super) start: u64,
    pub(super) anchor: u32,
    pub(super) end: u64,
}

impl Candidate {
    /// Take its place among `candidates`, the cheapest first (ties: the
    /// first found), keeping the [`WINDOWS_TRIED`] cheapest.
    pub(super) fn rank_among(self, candidates: &mut Vec<Candidate>) {
        let rank = candidates.partition_point(|c| c.cost <= self.cost);
        candidates.insert(rank, self);
        candidates.truncate(WINDOWS_TRIED);
    }
}

impl ExpandablePool {
    /// The cheapest window of at least `aligned` bytes of mapped address
    /// space whose allocations are all `movable`, cost at most `budget`
    /// bytes to move, and all fit in free blocks outside it; `None` when
    /// none of the [`WINDOWS_TRIED`] cheapest does. A walk of every block
    /// (run before a growth only, and only when the free room could serve).
    pub(crate) fn plan_window(
        &self,
        aligned: u64,
        budget: u64,
        movable: impl Fn(u32) -> bool,
    ) -> Option<Window> {
        // The cheapest windows found so far, by cost, then address.
        let mut candidates: Vec<Candidate> = Vec::with_capacity(WINDOWS_TRIED + 1);
        // Free blocks a move may land in: (size, range, offset, index), in
        // the last plan's buffer.
        let mut holes = self.planning.holes.take();
        holes.clear();
        self.each_range(|view| {
            windows_in(view, aligned, budget, &movable, &mut candidates, &mut holes);
        });
        let free = self.free_mapped();
        // The paper placement takes the largest allocation first and fails
        // when no hole holds it: a window whose largest allocation is
        // larger than every hole fails there, so it is not placed at all
        // (most windows fail this way on a ring of mixed sizes, and the
        // holes need no sort when all of them do). The same plans, fewer
        // steps.
        let largest_hole = holes.iter().map(|hole| hole.0).max().unwrap_or(0);
        // Only windows whose allocations could fit in the free room outside
        // them are planned; the holes are sorted for the first of those.
        let mut unsorted = Some(holes);
        let mut sorted = Holes::default();
        let mut planned = None;
        for candidate in candidates {
            let free_inside = (candidate.end - candidate.start) - candidate.cost;
            if free.saturating_sub(free_inside) < candidate.cost || candidate.largest > largest_hole
            {
                continue;
            }
            if let Some(holes) = unsorted.take() {
                sorted = Holes::sorted(holes);
            }
            if let Some(moves) = self.place_on_paper(&candidate, &mut sorted) {
                planned = Some(Window {
                    range: candidate.range,
                    anchor: candidate.anchor,
                    start: candidate.start,
                    end: candidate.end,
                    moves,
                    cost: candidate.cost,
                });
                break;
            }
        }
        *self.planning.holes.borrow_mut() = unsorted.unwrap_or_else(|| sorted.into_buffer());
        planned
    }

    /// Place the allocations of `candidate` in `holes` outside it, largest
    /// first, best fit; the moves if all of them fit. `holes` is as it was
    /// when this returns.
    fn place_on_paper(&self, candidate: &Candidate, holes: &mut Holes) -> Option<Vec<PlannedMove>> {
        // What lies on the window: its allocations, and its free blocks
        // (no landing place: they are what the window frees). The free
        // block right after it is none either: a block freed at the
        // window's end merges into it.
        let mut allocations = Vec::new();
        let mut taken_out = Vec::new();
        let mut node = candidate.anchor;
        while node != NONE && self.arena.offset(node) <= candidate.end {
            let (offset, size) = (self.arena.offset(node), self.arena.size(node));
            if self.arena.is_free(node) {
                if let Some(hole) = holes.find(size, candidate.range, offset) {
                    holes.remove(&hole);
                    taken_out.push(hole);
                }
            } else if offset < candidate.end {
                allocations.push((size, offset, self.arena.owner(node)));
            }
            node = self.arena.next(node);
        }
        let placed = holes.place_all(allocations, |hole, size| hole.0 >= size);
        for hole in taken_out {
            holes.insert(hole);
        }
        placed.map(|moves| {
            moves
                .into_iter()
                .map(|(slot, hole)| (slot, hole as u32))
                .collect()
        })
    }

    /// Keep `window`'s free room off the lists while its allocations move.
    pub(crate) fn fence(&mut self, window: &Window) {
        let mut node = window.anchor;
        while node != NONE && self.arena.offset(node) < window.end {
            self.arena.set_listed(node, false);
            node = self.arena.next(node);
        }
        self.fence = Some(window.clone());
    }

    /// Serve `aligned` bytes for `slot` at the start of the free block
    /// `hole` (a move's planned landing place), if it still holds them.
    pub(crate) fn reserve_into(
        &mut self,
        hole: u32,
        size: u64,
        aligned: u64,
        slot: u32,
    ) -> Option<Placement> {
        if !self.arena.is_free(hole) || self.arena.size(hole) < aligned {
            return None;
        }
        self.arena.carve_at(hole, aligned);
        Some(self.carved(hole, size, aligned, slot))
    }

    /// What is left free of a hole after a move carved its start at
    /// `carved`: the free block right after it, or `NONE`.
    pub(crate) fn rest_of_hole(&self, carved: u32) -> u32 {
        let next = self.arena.next(carved);
        if next != NONE && self.arena.is_free(next) {
            next
        } else {
            NONE
        }
    }

    /// Lift the fence; serve `aligned` bytes at the window's start if the
    /// moves cleared enough of it.
    pub(crate) fn unfence_and_reserve(
        &mut self,
        size: u64,
        aligned: u64,
        slot: u32,
    ) -> Option<Placement> {
        let window = self.fence.take()?;
        let anchor = window.anchor;
        let cleared = self.arena.is_free(anchor)
            && self.arena.offset(anchor) == window.start
            && self.arena.size(anchor) >= aligned;
        let listed = self.ranges[window.range as usize].guards == 0;
        let mut node = anchor;
        while listed && node != NONE && self.arena.offset(node) < window.end {
            self.arena.set_listed(node, true);
            node = self.arena.next(node);
        }
        if !cleared {
            return None;
        }
        self.arena.set_listed(anchor, false);
        self.arena.carve_at(anchor, aligned);
        Some(self.carved(anchor, size, aligned, slot))
    }
}

/// The windows of one range, into `candidates` (the
/// [`WINDOWS_TRIED`] cheapest so far, by cost, then address) and its free
/// blocks into `holes` (where a move may land).
pub(super) fn windows_in(
    view: &RangeView,
    aligned: u64,
    budget: u64,
    movable: &impl Fn(u32) -> bool,
    candidates: &mut Vec<Candidate>,
    holes: &mut Vec<Hole>,
) {
    let blocks = view.blocks();
    // The end of the shortest run covering `aligned` bytes only
    // moves up as its start does.
    let mut to = 0;
    for (at, block) in blocks.iter().enumerate() {
        if !block.is_free() {
            continue;
        }
        holes.push((block.size, view.range, block.offset, block.node as usize));
        // Only the cheapest few are tried: once that many are
        // known, a window must be cheaper than the dearest (blocks
        // are walked in address order, so an equal cost loses the
        // tie).
        let limit = match candidates.last() {
            Some(dearest) if candidates.len() == WINDOWS_TRIED => dearest.cost.saturating_sub(1),
            _ => budget,
        };
        // The shortest run of blocks from this one that covers
        // `aligned` bytes, with no void run or pinned allocation.
        to = to.max(at);
        while to < blocks.len() && view.bytes(at, to) < aligned {
            to += 1;
        }
        if view.bytes(at, to) < aligned {
            continue;
        }
        let cost = view.live(at, to);
        if cost > limit || view.any_blocked(at, to, movable) {
            continue;
        }
        let end = block.offset + view.bytes(at, to);
        let largest = blocks[at..to]
            .iter()
            .filter(|block| block.owner.is_some())
            .map(|block| block.size)
            .max()
            .unwrap_or(0);
        let candidate = Candidate {
            cost,
            largest,
            range: view.range,
            start: block.offset,
            anchor: block.node,
            end,
        };
        candidate.rank_among(candidates);
    }
}
