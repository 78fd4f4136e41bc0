//! Sliding compaction: allocations moved down over the free block right
//! below them, closing it, the way a mark-compact collector slides its heap.
//!
//! An evacuation (`evacuate.rs`) needs, for each allocation it moves, a free
//! block elsewhere that holds all of it. On a heap of many sizes the holes
//! left are mostly smaller than the allocations above them (random sizes up
//! to 8 MiB leave holes of under 1 MiB), so no group finds room and the
//! granules the holes touch stay mapped. A slide needs no room elsewhere:
//! the allocation moves down by the hole's size, overlapping itself (the
//! storage's [`slide`](crate::storage::DeviceStorage::slide)), and the hole
//! moves up above it, merging with the next. Sliding every allocation of a
//! run in address order gathers all the run's free bytes into one block at
//! its top, whose whole granules the unmapping that follows gives back.
//!
//! What to slide is decided per *segment*, a run of mapped blocks between
//! void runs (or a range's ends): sliding its top allocations, from some
//! allocation up, packs them onto the end of the allocation below that one.
//! Of those starting points the one that releases the most granules is
//! taken, when the granules it releases beyond what lies free whole already,
//! times the bytes-moved-per-byte-saved rule, come to at least the bytes it
//! moves. Top allocations only: the allocations below the starting point
//! stay where they are, so a pinned allocation ends the choice there.

use super::{ExpandablePool, VOID, align_up};
use crate::memory::arena::NONE;
use crate::memory::pool::Placement;

/// The allocations of one segment to slide down, lowest first (each slides
/// over the room the ones before gathered below it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slide {
    /// Their slots, in address order.
    pub(crate) slots: Vec<u32>,
    /// Their bytes.
    pub(crate) cost: u64,
    /// Bytes of granules it releases beyond the free ones.
    pub(crate) gained: u64,
}

/// A block of a segment as the plan sees it.
#[derive(Debug, Clone, Copy)]
struct Block {
    offset: u64,
    size: u64,
    /// The slot of an allocation; `None` for a free block.
    owner: Option<u32>,
}

impl ExpandablePool {
    /// The slide worth making that releases the most granules, over every
    /// segment of every held range without a page guard: one whose released
    /// granules (beyond the free ones) times `move_per_byte_saved` come to
    /// at least the bytes it moves. Planned again after each is made.
    pub(crate) fn plan_slide(
        &self,
        move_per_byte_saved: u64,
        movable: impl Fn(u32) -> bool,
    ) -> Option<Slide> {
        let mut best: Option<Slide> = None;
        self.each_segment(|segment| {
            let planned = self.plan_segment(segment, move_per_byte_saved, &movable);
            if let Some(slide) = planned
                && best.as_ref().is_none_or(|best| slide.gained > best.gained)
            {
                best = Some(slide);
            }
        });
        best
    }

    /// The cheapest slide that gathers at least `aligned` bytes of free room
    /// into one block, moving at most `budget` bytes (ties to the lowest
    /// address): how a growth is spared when the free room is all in holes
    /// smaller than the reservation and no window's allocations fit
    /// elsewhere.
    pub(crate) fn plan_room(
        &self,
        aligned: u64,
        budget: u64,
        movable: impl Fn(u32) -> bool,
    ) -> Option<Slide> {
        let mut best: Option<Slide> = None;
        self.each_segment(|blocks| {
            for (first, block) in blocks.iter().enumerate() {
                let Some(below) = first.checked_sub(1).map(|at| &blocks[at]) else {
                    continue;
                };
                if block.owner.is_none() || below.owner.is_some() {
                    continue;
                }
                let limit = best
                    .as_ref()
                    .map_or(budget, |best| best.cost.saturating_sub(1));
                let (mut live, mut room) = (0u64, below.size);
                for (last, block) in blocks.iter().enumerate().skip(first) {
                    let Some(slot) = block.owner else {
                        room += block.size;
                        continue;
                    };
                    live += block.size;
                    if !movable(slot) || live > limit {
                        break;
                    }
                    let above = blocks.get(last + 1).filter(|above| above.owner.is_none());
                    if room + above.map_or(0, |above| above.size) >= aligned {
                        let slots = blocks[first..=last]
                            .iter()
                            .filter_map(|block| block.owner)
                            .collect();
                        best = Some(Slide {
                            slots,
                            cost: live,
                            gained: 0,
                        });
                        break;
                    }
                }
            }
        });
        best
    }

    /// Call `visit` with the blocks of each segment (a run of mapped blocks
    /// between void runs or a range's ends) of every held range without a
    /// page guard, in address order.
    fn each_segment(&self, mut visit: impl FnMut(&[Block])) {
        let mut segment: Vec<Block> = Vec::new();
        for range in self
            .ranges
            .iter()
            .filter(|range| range.held && range.guards == 0)
        {
            let mut node = range.first;
            loop {
                let void =
                    node == NONE || (!self.arena.is_free(node) && self.arena.owner(node) == VOID);
                if void {
                    if !segment.is_empty() {
                        visit(&segment);
                    }
                    segment.clear();
                } else {
                    let free = self.arena.is_free(node);
                    segment.push(Block {
                        offset: self.arena.offset(node),
                        size: self.arena.size(node),
                        owner: (!free).then(|| self.arena.owner(node)),
                    });
                }
                if node == NONE {
                    break;
                }
                node = self.arena.next(node);
            }
        }
    }

    /// The best slide of one segment (its blocks in address order), if any
    /// pays: the run of allocations, from any one up to any one above it,
    /// whose slide releases the most granules beyond the whole free ones
    /// among the free blocks it gathers (the one below the run, those in
    /// it, the one right above it), ties to the cheapest, then the lowest.
    fn plan_segment(
        &self,
        blocks: &[Block],
        move_per_byte_saved: u64,
        movable: &impl Fn(u32) -> bool,
    ) -> Option<Slide> {
        let granule = self.granule;
        let free_whole = |block: &Block| match block.owner {
            None => whole_granules(block.offset, block.size, granule),
            Some(_) => 0,
        };
        // The best run so far: (released beyond the free, bytes, first, last).
        let mut best: Option<(u64, u64, usize, usize)> = None;
        for (first, block) in blocks.iter().enumerate() {
            // Only a run with a free block below it moves at all.
            let Some(below) = first.checked_sub(1).map(|at| &blocks[at]) else {
                continue;
            };
            if block.owner.is_none() || below.owner.is_some() {
                continue;
            }
            let base = below.offset;
            // Bytes of the run's allocations, and the whole free granules
            // of the free blocks it gathers, below its last allocation.
            let (mut live, mut whole) = (0u64, free_whole(below));
            for (last, block) in blocks.iter().enumerate().skip(first) {
                let Some(slot) = block.owner else {
                    whole += free_whole(block);
                    continue;
                };
                if !movable(slot) {
                    break;
                }
                live += block.size;
                // The gathered room runs to the end of the free block above
                // the run, if there is one.
                let above = blocks.get(last + 1).filter(|above| above.owner.is_none());
                let end =
                    above.map_or(block.offset + block.size, |above| above.offset + above.size);
                let packed_end = base + live;
                let released = whole_granules(packed_end, end - packed_end, granule);
                let gained = released.saturating_sub(whole + above.map_or(0, free_whole));
                let better = best.is_none_or(|(most, cost, _, _)| {
                    gained > most || (gained == most && live < cost)
                });
                if gained > 0 && gained.saturating_mul(move_per_byte_saved) >= live && better {
                    best = Some((gained, live, first, last));
                }
            }
        }
        let (gained, cost, first, last) = best?;
        let slots = blocks[first..=last]
            .iter()
            .filter_map(|block| block.owner)
            .collect();
        Some(Slide {
            slots,
            cost,
            gained,
        })
    }

    /// Where the allocation at `node` lands when it slides over the free
    /// block right below it: that block's offset; `None` when the block
    /// below is not free or the range has a page guard.
    pub(crate) fn slide_target(&self, node: u32) -> Option<u64> {
        let below = self.arena.prev(node);
        let range = &self.ranges[self.arena.page(node) as usize];
        (below != NONE && self.arena.is_free(below) && range.guards == 0 && self.fence.is_none())
            .then(|| self.arena.offset(below))
    }

    /// Record that the allocation of `slot` at `node` slid over the free
    /// block below it (its bytes are already there): its new placement.
    /// The free room now lies above it, merged with any free block there.
    pub(crate) fn slid(&mut self, node: u32, slot: u32, tick: u64) -> Placement {
        let size = self.arena.size(node);
        let index = self.arena.page(node);
        let merged = self.arena.free(node, true);
        self.arena.carve_at(merged, size);
        self.arena.set_owner(merged, slot);
        let rest = self.arena.next(merged);
        if rest != NONE && self.arena.is_free(rest) && self.whole_granules(rest).is_some() {
            self.empties.push_back((rest, tick));
        }
        Placement {
            page: index,
            node: merged,
            offset: self.arena.offset(merged),
        }
    }
}

/// Bytes of whole granules in `size` bytes from `offset`.
fn whole_granules(offset: u64, size: u64, granule: u64) -> u64 {
    let first = align_up(offset, granule);
    let last = (offset + size) / granule * granule;
    last.saturating_sub(first)
}
