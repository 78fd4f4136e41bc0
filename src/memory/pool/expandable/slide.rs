//! Sliding compaction: allocations moved down over the free block right
//! below them, closing it, the way a mark-compact collector slides its heap.
//!
//! The long form: `docs/modules.md`, "`src/memory/pool/expandable/slide.rs`".

use super::blocks::{Block, RangeView, whole_granules};
use super::{ExpandablePool, VOID};
use crate::memory::pool::arena::NONE;
use crate::memory::pool::page::Placement;
use crate::storage::{DeviceStorage, StorageError};

/// A run of allocations to slide down, lowest first (each slides over the
/// room the ones before gathered below it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slide {
    /// Void runs to map first (arena nodes), lowest first.
    pub(crate) voids: Vec<u32>,
    /// Their slots, in address order.
    pub(crate) slots: Vec<u32>,
    /// Bytes of granules it releases beyond the free ones (0 for a slide
    /// planned to gather room for a growth).
    pub(crate) gained: u64,
}

impl Slide {
    /// The slide of the blocks `run` (the room below its first allocation
    /// included).
    pub(super) fn of(run: &[Block], gained: u64) -> Self {
        Self {
            voids: run
                .iter()
                .filter(|block| block.void)
                .map(|block| block.node)
                .collect(),
            slots: run.iter().filter_map(|block| block.owner).collect(),
            gained,
        }
    }
}

impl ExpandablePool {
    /// The slide worth making that releases the most granules, over every
    /// held range without a page guard: one whose released granules (beyond
    /// those released already) times `move_per_byte_saved` come to at least
    /// the bytes it moves. Planned again after each is made.
    pub(crate) fn plan_slide(
        &self,
        move_per_byte_saved: u64,
        shares_a_budget: bool,
        at_most: u64,
        movable: impl Fn(u32) -> bool,
    ) -> Option<Slide> {
        // Void runs a slide crosses are mapped before it unmaps what it
        // gathers: `at_most` bytes (`compaction::Voids`), never past the
        // pool's high-water mark, and not at all when the device's streams
        // share a budget (relocations of several streams may run at once,
        // and whether a mapping succeeded would depend on timing, a
        // replay's figures with it).
        let may_map = if shares_a_budget {
            0
        } else {
            self.stats
                .peak_reserved
                .saturating_sub(self.mapped())
                .min(at_most)
        };
        let mut best: Option<Slide> = None;
        self.each_range(|view| {
            let planned = best_run(view, self.granule, move_per_byte_saved, may_map, &movable);
            if let Some(slide) = planned
                && best.as_ref().is_none_or(|best| slide.gained > best.gained)
            {
                best = Some(slide);
            }
        });
        best
    }

    /// The cheapest slide (bytes moved, then void bytes mapped; ties to the
    /// lowest address) that gathers at least `aligned` bytes into one free
    /// block, mapping fewer than `growth` bytes of the void runs it crosses
    /// and moving at most `move_per_byte_saved` bytes for each byte of
    /// `growth` it spares: how a growth is spared when the free room lies
    /// in holes smaller than the reservation and no window's allocations
    /// fit elsewhere.
    ///
    /// From each start, the run ends at the first allocation whose room
    /// (below it, among it and the free block right above it) holds
    /// `aligned`: later ones only move more. That room grows with the run,
    /// and so do the bytes moved, the voids crossed and whether a pinned
    /// allocation lies in it, so the run is judged there alone; and that
    /// allocation only moves up as the start does, so one pass over the
    /// allocations finds it for every start.
    pub(crate) fn plan_room(
        &self,
        aligned: u64,
        growth: u64,
        move_per_byte_saved: u64,
        movable: impl Fn(u32) -> bool,
    ) -> Option<Slide> {
        let mut best: Option<(u64, u64, Slide)> = None;
        self.each_range(|view| {
            room_in(
                view,
                aligned,
                growth,
                move_per_byte_saved,
                &movable,
                &mut best,
            );
        });
        best.map(|(_, _, slide)| slide)
    }

    /// Map the whole void run `node` (a slide's plan crosses it), its
    /// granules counted idle from now: if the slide stops short, a
    /// periodic cleanup a period on gives them back.
    pub(crate) fn map_for_slide(
        &mut self,
        storage: &mut dyn DeviceStorage,
        node: u32,
        serial: u64,
    ) -> Result<(), StorageError> {
        if self.arena.is_free(node) || self.arena.owner(node) != VOID {
            return Ok(());
        }
        let (index, offset, size) = (
            self.arena.page(node),
            self.arena.offset(node),
            self.arena.size(node),
        );
        self.map_void(storage, node, size)?;
        self.let_go(index, offset, size, serial);
        self.idle_from(serial);
        Ok(())
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
    pub(crate) fn slid(&mut self, node: u32, slot: u32, serial: u64) -> Placement {
        let index = self.arena.page(node);
        let old_end = self.arena.offset(node) + self.arena.size(node);
        let merged = self.arena.shift_down(node);
        debug_assert_eq!(self.arena.owner(merged), slot);
        let rest = self.arena.next(merged);
        if rest != NONE && self.arena.is_free(rest) {
            // The granules it vacated were in use until now.
            let vacated = self.arena.offset(rest);
            self.let_go(index, vacated, old_end - vacated, serial);
            if self.whole_granules(rest).is_some() {
                self.idle_from(serial);
            }
        }
        Placement::new(index, merged, self.arena.offset(merged))
    }
}

/// [`ExpandablePool::plan_room`] in one range: `best` (bytes moved, void
/// bytes mapped, the slide) becomes this range's run where that is
/// cheaper.
pub(super) fn room_in(
    view: &RangeView,
    aligned: u64,
    growth: u64,
    move_per_byte_saved: u64,
    movable: &impl Fn(u32) -> bool,
    best: &mut Option<(u64, u64, Slide)>,
) {
    let blocks = view.blocks();
    let owners = view.owners();
    // The room a run ending at the allocation `last` gathers, from
    // the range's start: the free block right above it joins (a
    // void there is left for the growth's own mapping).
    let gathered = |last: usize| {
        let above = blocks.get(last + 1).filter(|above| above.is_free());
        view.room_before(last + 1) + above.map_or(0, |above| above.size)
    };
    // The cheapest run of this range so far: (bytes moved, void bytes,
    // its blocks), made a `Slide` once, at the end (a cheaper start is
    // found many times a plan).
    let mut cheapest = best.as_ref().map(|(cost, mapped, _)| (*cost, *mapped));
    let mut found: Option<(usize, usize)> = None;
    // Two cursors into the allocations, both only moving up: `from` at the
    // run's first, `at` at its last. The room a run ending at an allocation
    // gathers grows with the allocation, and the room a start needs grows
    // with the start, so the first allocation whose room is enough for
    // one start is at or above the one for the start before.
    let mut at = 0;
    for (from, &first) in owners.iter().enumerate() {
        // A run starts at an allocation right above free room, mapped or
        // not, and slides down to that room's start.
        let base = from.checked_sub(1).map_or(0, |below| owners[below] + 1);
        if base == first {
            continue;
        }
        let need = view.room_before(base).saturating_add(aligned);
        at = at.max(from);
        while at < owners.len() && gathered(owners[at]) < need {
            at += 1;
        }
        let Some(&last) = owners.get(at) else {
            // No later start finds enough either.
            break;
        };
        let voids = view.voids(base, last);
        if voids >= growth {
            continue;
        }
        let live = view.live(base, last + 1);
        let spared = growth - voids;
        let dearer = cheapest.is_some_and(|cheapest| (live, voids) >= cheapest);
        // Pins last: the only question that reads the allocations.
        if live > spared.saturating_mul(move_per_byte_saved)
            || dearer
            || view.any_pinned(first, last + 1, movable)
        {
            continue;
        }
        cheapest = Some((live, voids));
        found = Some((base, last));
    }
    if let (Some((base, last)), Some((live, voids))) = (found, cheapest) {
        *best = Some((live, voids, Slide::of(&blocks[base..=last], 0)));
    }
}

/// The best slide of one range, if any pays: the run of allocations,
/// from any one up to any one above it, whose slide releases the most
/// granules beyond those already released among the room it gathers
/// (the whole free granules of the free blocks below the run, among it
/// and right above it, and the void runs it crosses, mapped first: at
/// most `may_map` bytes of them); ties to the cheapest, then the
/// lowest.
pub(super) fn best_run(
    view: &RangeView,
    granule: u64,
    move_per_byte_saved: u64,
    may_map: u64,
    movable: &impl Fn(u32) -> bool,
) -> Option<Slide> {
    let blocks = view.blocks();
    // The best run so far: (released beyond the free, bytes, base, last).
    let mut best: Option<(u64, u64, usize, usize)> = None;
    // Whether a run of `live` bytes releasing at most `most` beyond the
    // free can beat the best (gains above it, or as much for fewer bytes).
    let can_win = |most: u64, live: u64, best: Option<(u64, u64, usize, usize)>| {
        best.is_none_or(|(gained, cost, _, _)| most > gained || (most == gained && live < cost))
    };
    // The first allocation a run from the current start may not take in
    // (pinned, or past more void bytes than it may map), or the end: it
    // only moves up as the start does (the voids between a start and an
    // allocation shrink as the start rises; a pin stays a pin).
    let owners = view.owners();
    let mut reach = 0;
    for (at, &first) in owners.iter().enumerate() {
        // A run starts at an allocation right above free room, mapped or
        // not, and slides down to that room's start.
        let base = at.checked_sub(1).map_or(0, |below| owners[below] + 1);
        if base == first {
            continue;
        }
        // No run from here releases more than the room above `base`
        // not released yet, and that shrinks as `base` rises: once it
        // cannot beat the best, no later start can.
        let unreleased = view.unreleased_from(base);
        if !can_win(unreleased, 0, best) {
            break;
        }
        reach = reach.max(first);
        while reach < blocks.len()
            && (blocks[reach].owner.is_none()
                || (view.voids(base, reach) <= may_map && view.is_movable(reach, movable)))
        {
            reach += 1;
        }
        // Nor more than the room below `reach` not released yet (the free
        // block right above a run's last allocation lies below it too).
        let most_possible = unreleased - view.unreleased_from(reach);
        if !can_win(most_possible, 0, best) {
            continue;
        }
        let base_offset = blocks[base].offset;
        let (live_below, released_below) = view.before(base);
        for (ordinal, &last) in owners
            .iter()
            .enumerate()
            .skip(at)
            .take_while(|&(_, &last)| last < reach)
        {
            // What `gain` works out, from the view's sums up to the run's
            // end (the free block right above `last` included).
            let run_end = view.run_end(ordinal);
            let live = run_end.live - live_below;
            if live > most_possible.saturating_mul(move_per_byte_saved)
                || !can_win(most_possible, live, best)
            {
                break;
            }
            let packed_end = base_offset + live;
            let released = whole_granules(packed_end, run_end.end - packed_end, granule);
            let gained = released.saturating_sub(run_end.released - released_below);
            if gained > 0
                && gained.saturating_mul(move_per_byte_saved) >= live
                && can_win(gained, live, best)
            {
                best = Some((gained, live, base, last));
            }
        }
    }
    let (gained, _, base, last) = best?;
    Some(Slide::of(&blocks[base..=last], gained))
}

/// Bytes of granules that sliding the run `blocks[base..=last]` (`live`
/// bytes of allocations) releases beyond the `already` released among the
/// room below and within it: the gathered room runs to the end of the free
/// block above the run, if there is one (a void there stays unmapped).
/// The definition: [`best_run`] works it out from the view's sums
/// (`RangeView::run_end`), and the tests' walk, which has no view,
/// checks it against this.
#[cfg(test)]
pub(super) fn gain(
    blocks: &[Block],
    base: usize,
    last: usize,
    live: u64,
    already: u64,
    granule: u64,
) -> u64 {
    let block = &blocks[last];
    let above = blocks.get(last + 1).filter(|above| above.is_free());
    let end = above.map_or(block.offset + block.size, |above| above.offset + above.size);
    let packed_end = blocks[base].offset + live;
    let released = whole_granules(packed_end, end - packed_end, granule);
    let above_already = above.map_or(0, |above| above.released(granule));
    released.saturating_sub(already + above_already)
}
