//! A held range's blocks as the compaction planners see them: in address
//! order, each allocation's movability looked up at most once (and only
//! when a plan would move it), and running sums over them, so that a
//! planner asks "what lies between block `i` and block `j`" in constant
//! time instead of walking it.
//!
//! The long form: `docs/modules.md`, "`src/memory/pool/expandable/blocks.rs`".

use super::{ExpandablePool, VOID};
use crate::memory::pool::page::{align_down, align_up};
use std::cell::Cell;

/// A block of a range as a plan sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Block {
    /// Its arena node.
    pub(super) node: u32,
    pub(super) offset: u64,
    pub(super) size: u64,
    /// The slot of an allocation; `None` for a free block or a void run.
    pub(super) owner: Option<u32>,
    /// Whether it is a void run (unmapped address space).
    pub(super) void: bool,
}

impl Block {
    pub(super) fn is_free(&self) -> bool {
        self.owner.is_none() && !self.void
    }

    /// Its bytes if it is a void run (a slide across it maps them first).
    /// The tests' walks ask this block by block, where the view's sums
    /// (`RangeView::sum`) answer for a span at once.
    #[cfg(test)]
    pub(super) fn void_bytes(&self) -> u64 {
        if self.void { self.size } else { 0 }
    }

    /// Bytes of it that lie released already: the whole free granules of a
    /// free block, all of a void run, none of an allocation (as the
    /// void bytes, for the tests' walks).
    #[cfg(test)]
    pub(super) fn released(&self, granule: u64) -> u64 {
        match (self.owner, self.void) {
            (None, false) => whole_granules(self.offset, self.size, granule),
            (None, true) => self.size,
            (Some(_), _) => 0,
        }
    }
}

/// What a slide's run that ends at an allocation reads there, each from
/// the range's start: the bytes of allocations up to and with it, the
/// bytes released already up to and with the free block right above it
/// (if one is there), and where the room such a run gathers ends (that
/// free block's end, else the allocation's).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RunEnd {
    pub(super) live: u64,
    pub(super) released: u64,
    pub(super) end: u64,
}

/// Sums over the blocks before one index.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    /// Bytes of every block.
    all: u64,
    /// Bytes of allocations.
    live: u64,
    /// Bytes of free blocks and void runs.
    room: u64,
    /// Bytes of void runs.
    voids: u64,
    /// Bytes released already (`Block::released`).
    released: u64,
    /// Void runs.
    void_runs: u32,
}

/// The blocks of one held range without a page guard, in address order,
/// with their running sums: the range's last void run (the unmapped rest,
/// which nothing lies above) left out.
#[derive(Debug, Default)]
pub(super) struct RangeView {
    /// The range's index.
    pub(super) range: u32,
    blocks: Vec<Block>,
    /// `sums[i]`: over `blocks[..i]`.
    sums: Vec<Sums>,
    /// Indices of the allocations in `blocks`.
    owners: Vec<usize>,
    /// For each allocation, in `owners`' order: what a slide's run that
    /// ends at it reads (`RunEnd`). The slide planner weighs many runs
    /// ending at each allocation, so it is worked out once a view.
    run_ends: Vec<RunEnd>,
    /// Whether each block's allocation may move, once asked: unknown,
    /// movable or pinned. Asked only of allocations a plan would move (a
    /// pin is a load from the allocation's cell, a cache miss apiece on a
    /// large pool: a third of the planning time when every one was asked).
    movable: Vec<Cell<Movable>>,
    /// The arena's change count when the blocks were copied (`None`: not
    /// from the arena): a plan at the same count uses them as they are.
    copied_at: Option<u64>,
}

/// What a view knows of an allocation's pins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Movable {
    #[default]
    Unknown,
    Yes,
    No,
}

impl RangeView {
    pub(super) fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// Indices of the allocations, in address order.
    pub(super) fn owners(&self) -> &[usize] {
        &self.owners
    }

    /// What a run ending at the allocation `owners()[ordinal]` reads.
    #[inline]
    pub(super) fn run_end(&self, ordinal: usize) -> RunEnd {
        self.run_ends[ordinal]
    }

    /// The sums over the blocks before block `at`: bytes of allocations
    /// and bytes released already, what a run from `at` subtracts from a
    /// [`RunEnd`]'s.
    #[inline]
    pub(super) fn before(&self, at: usize) -> (u64, u64) {
        let sums = &self.sums[at];
        (sums.live, sums.released)
    }

    /// Bytes of all blocks in `from..to`.
    pub(super) fn bytes(&self, from: usize, to: usize) -> u64 {
        self.sums[to].all - self.sums[from].all
    }

    /// Bytes of allocations in `from..to`.
    pub(super) fn live(&self, from: usize, to: usize) -> u64 {
        self.sums[to].live - self.sums[from].live
    }

    /// Bytes of free room (mapped or not) in `..to`.
    pub(super) fn room_before(&self, to: usize) -> u64 {
        self.sums[to].room
    }

    /// Bytes of void runs in `from..to`.
    pub(super) fn voids(&self, from: usize, to: usize) -> u64 {
        self.sums[to].voids - self.sums[from].voids
    }

    /// Whether block `at` is an allocation that may move, as `movable`
    /// says (asked once a view).
    #[inline]
    pub(super) fn is_movable(&self, at: usize, movable: &impl Fn(u32) -> bool) -> bool {
        let Some(slot) = self.blocks[at].owner else {
            return false;
        };
        match self.movable[at].get() {
            Movable::Yes => true,
            Movable::No => false,
            Movable::Unknown => {
                let answer = movable(slot);
                self.movable[at].set(if answer { Movable::Yes } else { Movable::No });
                answer
            }
        }
    }

    /// Whether an allocation in `from..to` may not move.
    pub(super) fn any_pinned(
        &self,
        from: usize,
        to: usize,
        movable: &impl Fn(u32) -> bool,
    ) -> bool {
        (from..to).any(|at| self.blocks[at].owner.is_some() && !self.is_movable(at, movable))
    }

    /// Whether a void run or an allocation that may not move lies in
    /// `from..to`.
    pub(super) fn any_blocked(
        &self,
        from: usize,
        to: usize,
        movable: &impl Fn(u32) -> bool,
    ) -> bool {
        self.sums[to].void_runs > self.sums[from].void_runs || self.any_pinned(from, to, movable)
    }

    /// Bytes of free room from block `from` on that are not released
    /// already: no slide starting at `from` releases more than that.
    pub(super) fn unreleased_from(&self, from: usize) -> u64 {
        let unreleased = |sums: &Sums| sums.room - sums.released;
        let all = self.sums.last().map_or(0, unreleased);
        all - self.sums.get(from).map_or(0, unreleased)
    }
}

impl ExpandablePool {
    /// Call `visit` with the view of every held range without a page
    /// guard, in index order.
    pub(super) fn each_range(&self, mut visit: impl FnMut(&RangeView)) {
        let mut view = self.planning.view.borrow_mut();
        for (index, range) in self.ranges.iter().enumerate() {
            if !range.held || range.guards > 0 {
                continue;
            }
            // Nothing changed since the last plan copied this range (the
            // window planner's, before a slide's): the same blocks. Pins
            // may have, so they are asked again.
            if view.range == index as u32 && view.copied_at == Some(self.arena.changes()) {
                view.forget_pins();
                visit(&view);
                continue;
            }
            // The last view's buffer, reused.
            let mut blocks = std::mem::take(&mut view.blocks);
            blocks.clear();
            blocks.extend(
                self.arena
                    .chain(range.first)
                    .map(|(node, offset, size, owner)| Block {
                        node,
                        offset,
                        size,
                        owner: owner.filter(|&owner| owner != VOID),
                        void: owner == Some(VOID),
                    }),
            );
            view.rebuild(index as u32, blocks, self.granule);
            view.copied_at = Some(self.arena.changes());
            visit(&view);
        }
    }
}

impl RangeView {
    /// The view of range `range` whose blocks, in address order, are
    /// `blocks` (its last void run, if any, is left out).
    pub(super) fn rebuild(&mut self, range: u32, mut blocks: Vec<Block>, granule: u64) {
        if blocks.last().is_some_and(|block| block.void) {
            blocks.pop();
        }
        self.range = range;
        self.blocks = blocks;
        self.copied_at = None;
        self.sum(granule);
    }

    /// Ask every allocation's pins again.
    fn forget_pins(&mut self) {
        self.movable.fill(Cell::default());
    }

    /// One pass over the blocks: the running sums, the allocations and
    /// what a run ending at each reads (the free block right above an
    /// allocation comes next, and extends what the allocation alone
    /// would gather).
    fn sum(&mut self, granule: u64) {
        self.sums.clear();
        self.owners.clear();
        self.run_ends.clear();
        self.sums.reserve(self.blocks.len() + 1);
        let mut sums = Sums::default();
        self.sums.push(sums);
        let mut below_is_owner = false;
        for (index, block) in self.blocks.iter().enumerate() {
            sums.all += block.size;
            match (block.owner, block.void) {
                (Some(_), _) => {
                    sums.live += block.size;
                    self.owners.push(index);
                    self.run_ends.push(RunEnd {
                        live: sums.live,
                        released: sums.released,
                        end: block.offset + block.size,
                    });
                }
                (None, false) => {
                    let released = whole_granules(block.offset, block.size, granule);
                    sums.room += block.size;
                    sums.released += released;
                    if below_is_owner && let Some(run_end) = self.run_ends.last_mut() {
                        run_end.released = sums.released;
                        run_end.end = block.offset + block.size;
                    }
                }
                (None, true) => {
                    sums.room += block.size;
                    sums.voids += block.size;
                    sums.released += block.size;
                    sums.void_runs += 1;
                }
            }
            below_is_owner = block.owner.is_some();
            self.sums.push(sums);
        }
        self.movable.clear();
        self.movable.resize(self.blocks.len(), Cell::default());
    }
}

/// Bytes of whole granules in `size` bytes from `offset`.
#[inline]
pub(super) fn whole_granules(offset: u64, size: u64, granule: u64) -> u64 {
    let first = align_up(offset, granule);
    let last = align_down(offset + size, granule);
    last.saturating_sub(first)
}
