//! Compaction before growth: when an expandable pool would map more for a
//! reservation but holds enough free room in total, move the live
//! allocations of the cheapest run of its address space elsewhere and serve
//! the reservation there, if the bytes moved pay for the bytes not mapped
//! and every one of them has a free block to go to (the plan of
//! `pool/expandable/window.rs`: nothing moves in vain).
//!
//! The long form: `docs/modules.md`, "`src/memory/pool/expandable/compact.rs`".

use super::moves::Step;
use super::{ExpandablePool, PlannedMove, Slide};
use crate::memory::error::MemoryError;
use crate::memory::pool::mover::Mover;
use crate::memory::pool::page::{Placement, Wanted};
use crate::memory::relocation::{RelocationReason, RelocationReport};

/// Bytes a compaction before growth may copy for each byte of memory it
/// saves mapping. Four: a device-to-device copy runs at memory bandwidth
/// (microseconds a MiB), while a byte not mapped is a byte another stream
/// can use. Measured on the fragmentation family (`git show d502a2e:docs/performance.md`):
/// 1.113 peak ratio at one, 1.066 at four, no better at sixteen.
pub(crate) const MOVE_PER_BYTE_SAVED: u64 = 4;

/// Bytes a slide (`pool/expandable/slide.rs`) may copy for each byte of
/// memory it saves mapping or releases. More than [`MOVE_PER_BYTE_SAVED`]:
/// the holes a slide gathers are the small ones nothing else can use, so
/// it moves many bytes for each it saves, and a copy at memory bandwidth
/// still costs far less than the memory. On the random-allocations family
/// (seeds 1, 2, 4, through the service) 4 left 1.081-1.089 peak reserved
/// over live, 16 gave 1.050-1.066, 24 gave 1.050-1.058, 32 no better
/// (`git show d502a2e:docs/performance.md`).
pub(crate) const SLIDE_PER_BYTE_SAVED: u64 = 24;

/// A growth that no window or slide could spare evacuates first when at
/// least one mapped byte in this many lies free. Thirty-two: with slides,
/// one in sixteen left random at 1.054-1.066 (seeds 1, 2, 4, through the
/// service) and one in thirty-two at 1.050-1.058; sixty-four no better at
/// a third more time. (Before slides, sixteen beat eight and thirty-two
/// only cost time.)
pub(crate) const EVACUATE_WHEN_FREE_ONE_IN: u64 = 32;

/// A growth that would take an expandable pool's mapped bytes past its
/// high-water mark of bytes in use by more than one byte in this many
/// evacuates the pool first (before a window, a slide or the growth), as
/// the service's headroom policy has its stream compact before it takes
/// a page past the device's. Thirty-two, as [`EVACUATE_WHEN_FREE_ONE_IN`]
/// (not swept): on the random-allocations family (seeds 1, 2, 3, 7) the
/// manager alone went from 1.042-1.050 peak reserved / peak live to
/// 1.027-1.031, and through the service from 1.035 to 1.027-1.031
/// (`git show d502a2e:docs/performance.md`).
pub(crate) const HIGH_WATER_SLACK_ONE_IN: u64 = 32;

/// When a growth evacuates its expandable pool before it maps
/// (`ExpandablePool::evacuates_before`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Evacuate {
    /// First of all, when the growth would pass the pool's high-water mark
    /// of bytes in use by more than one byte in [`HIGH_WATER_SLACK_ONE_IN`]
    /// and a granule or more of its mapped room lies free.
    PastHighWater,
    /// Last, when no window or slide spared the growth and one mapped byte
    /// in [`EVACUATE_WHEN_FREE_ONE_IN`] lies free, in a pool that does not
    /// trim (`MemoryConfig::free_slack_one_in`).
    MostlyFree,
}

/// Passes a settle's re-homing makes at most (`rehome.rs`): each looks
/// again at what the last one's moves left pinning.
const REHOME_PASSES: usize = 4;

/// Groups a settle re-homes at most after that (`rehome_group.rs`), the
/// best first, each chosen again once the last moved.
const REHOME_GROUP_PASSES: usize = 16;

/// Slides one relocation or growth plans and makes at most, one after
/// another (each plan walks the pool's blocks).
const SLIDES_PLANNED: usize = 16;

/// What a run of planned moves did.
#[derive(Default)]
struct Run {
    /// Allocations moved.
    moved: u64,
    /// Their bytes.
    bytes: u64,
    /// Why it stopped.
    ended: Ended,
}

/// How a run of planned moves ended.
#[derive(Default)]
enum Ended {
    /// Every move was made.
    #[default]
    Done,
    /// An allocation was pinned since the plan (it stays; so do the rest).
    Pinned,
    /// A copy failed (the allocation stays where it was).
    Failed(MemoryError),
}

/// What a compaction's slides may map of the void runs they cross (a
/// slide maps them before it unmaps the granules it gathers, so the pool
/// holds them on top of what it held for a moment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Voids {
    /// Up to the pool's high-water mark (a relocation).
    BelowHighWater,
    /// Less than this many bytes, what the growth the compaction comes
    /// before would map: it never takes the pool higher than growing
    /// would; `Below(0)` maps none (a stream asked to give back). A
    /// stream's own high-water mark says nothing of the device's, whose
    /// other streams may be at theirs: voids of 178 and 418 MiB mapped
    /// for a moment (a headroom trim; a growth of 12 MiB) made a held-out
    /// 8-stream serving trace's device peak 1.048-1.080 times its peak
    /// live, 1.040 without them (`git show d502a2e:docs/performance.md`).
    Below(u64),
}

impl Run {
    /// Take what one move did; whether the run goes on.
    fn take(&mut self, step: Result<Step, MemoryError>) -> bool {
        match step {
            Ok(Step::Moved { allocations, bytes }) => {
                self.moved += allocations;
                self.bytes += bytes;
                true
            }
            Ok(Step::InPlace) => true,
            Ok(Step::Pinned) => {
                self.ended = Ended::Pinned;
                false
            }
            Err(error) => {
                self.ended = Ended::Failed(error);
                false
            }
        }
    }
}

impl ExpandablePool {
    /// Serve `aligned` bytes by clearing a window of the mapped room, when
    /// that pays; `None` when it does not (or a move could not be made:
    /// what moved stays moved, nothing is lost).
    pub(super) fn compact_before_growth(
        &mut self,
        mover: &mut Mover<'_>,
        wanted: Wanted,
    ) -> Option<Placement> {
        if self.free_mapped() < wanted.aligned {
            return None;
        }
        let saved = self.new_page_size(wanted.aligned);
        let budget = saved.saturating_mul(MOVE_PER_BYTE_SAVED);
        let window = self.plan_window(wanted.aligned, budget, mover.movable())?;
        self.fence(&window);
        // A move that cannot be made (pinned since the plan: a client's pin
        // needs no round trip; a failed copy, the allocation staying where
        // it was) leaves the window short, and the growth goes ahead.
        let (run, _) = self.move_as_planned(mover, &window.moves);
        self.count_moved_before_growth(run.moved, run.bytes);
        self.unfence_and_reserve(wanted.size, wanted.aligned, wanted.slot)
    }

    /// Serve `aligned` bytes by sliding the allocations of the cheapest run
    /// down until its holes gather into one block that holds them
    /// (`slide.rs`), when the bytes moved pay for the bytes not mapped;
    /// `None` when none does or a slide could not be made (what slid stays
    /// slid).
    pub(super) fn slide_before_growth(
        &mut self,
        mover: &mut Mover<'_>,
        wanted: Wanted,
    ) -> Option<Placement> {
        let aligned = wanted.aligned;
        let growth = self.new_page_size(aligned);
        // The room must come from free blocks for all but less than the
        // growth (the voids a run may map).
        if self.free_mapped() + growth <= aligned {
            return None;
        }
        let slide = self.plan_room(aligned, growth, SLIDE_PER_BYTE_SAVED, mover.movable())?;
        // Refused a mapping (a budget: the growth meets the same refusal),
        // pinned since the plan, or a failed copy (its bytes stay where they
        // were): the growth goes ahead.
        let run = self.make_slide(mover, slide)?;
        self.count_moved_before_growth(run.moved, run.bytes);
        if !matches!(run.ended, Ended::Done) {
            return None;
        }
        self.try_reserve(wanted.size, aligned, wanted.slot)
    }

    /// Serve `aligned` bytes after an evacuation (below) gave back the
    /// granules it could, when `when` says a growth for them should
    /// evacuate first ([`evacuates_before`](Self::evacuates_before));
    /// `None` when it should not, or the room freed does not hold them
    /// (what the evacuation emptied goes back before the growth maps).
    pub(super) fn evacuate_before_growth(
        &mut self,
        mover: &mut Mover<'_>,
        when: Evacuate,
        wanted: Wanted,
    ) -> Option<Placement> {
        let (size, aligned, slot) = (wanted.size, wanted.aligned, wanted.slot);
        if !self.evacuates_before(when, wanted.aligned) {
            return None;
        }
        let growth = self.new_page_size(aligned);
        let before = self.mapped();
        let mut report = RelocationReport::default();
        // A failed copy leaves its allocation in place: the growth goes on.
        let _ = self.evacuate_granules(mover, &mut report, Voids::Below(growth));
        if report.moved == 0 {
            return None;
        }
        self.count_moved_before_growth(report.moved, report.bytes_moved);
        let placed = self.try_reserve(size, aligned, slot);
        // What the evacuation emptied goes back: what its slides mapped
        // beyond what the pool held before and, before a growth, as much
        // again as the growth maps. The pool ends no higher than growing
        // alone would have taken it.
        let still_to_map = match placed {
            Some(_) => 0,
            None => self.new_page_size(aligned),
        };
        self.unmap_past(mover.storage, before.saturating_sub(still_to_map));
        placed
    }

    /// A relocation: compacting reasons move allocations down out of
    /// granules they alone keep mapped; every reason then gives back the
    /// free granules (the holes cost nothing once unmapped). A stream asked
    /// to give memory back (the device is short, or past its headroom)
    /// maps none to do it.
    pub(in crate::memory::pool) fn relocate_granules(
        &mut self,
        mover: &mut Mover<'_>,
        reason: RelocationReason,
        report: &mut RelocationReport,
    ) -> Result<(), MemoryError> {
        let voids = if reason == RelocationReason::Short {
            Voids::Below(0)
        } else {
            Voids::BelowHighWater
        };
        let evacuated = if reason == RelocationReason::Outdated {
            Ok(())
        } else {
            self.evacuate_granules(mover, report, voids)
        };
        let before = self.mapped();
        self.unmap_all_free(mover.storage);
        if reason == RelocationReason::Settle && mover.rehome && evacuated.is_ok() {
            // What is still free and mapped now is pinned by the handles
            // it shares with allocations: move those that pin most. What
            // one move frees can leave a neighbour pinning in its turn, so
            // look again while anything moved (a few times at most).
            for _ in 0..REHOME_PASSES {
                let moved = report.moved;
                let rehomed = self.rehome_pinning(mover, report);
                self.unmap_all_free(mover.storage);
                rehomed?;
                if report.moved == moved {
                    break;
                }
            }
            // Then what only a group's move frees, the best group first.
            for _ in 0..REHOME_GROUP_PASSES {
                let rehomed = self.rehome_group(mover, report);
                self.unmap_all_free(mover.storage);
                if !rehomed? {
                    break;
                }
            }
        }
        report.bytes_released += before.saturating_sub(self.mapped());
        evacuated
    }

    /// Move allocations down into free blocks below them where that
    /// releases granules worth the bytes moved (`evacuate.rs`); what moved
    /// goes in `report`. The granules go back at the unmapping that
    /// follows; what the slides may map meanwhile, `voids` says.
    fn evacuate_granules(
        &mut self,
        mover: &mut Mover<'_>,
        report: &mut RelocationReport,
        voids: Voids,
    ) -> Result<(), MemoryError> {
        let mut evacuation = self.evacuation();
        while let Some(group) =
            self.next_group(&mut evacuation, MOVE_PER_BYTE_SAVED, mover.movable())
        {
            let (run, landed) = self.move_as_planned(mover, &group.moves);
            report.moved += run.moved;
            report.bytes_moved += run.bytes;
            self.group_moved(&mut evacuation, &landed);
            match run.ended {
                Ended::Done => {}
                // Pinned by a client since it was planned: the rest of the
                // group stays too.
                Ended::Pinned => report.skipped_pinned += 1,
                Ended::Failed(error) => return Err(error),
            }
        }
        self.slide_down(mover, report, voids)
    }

    /// Slide runs of allocations down where that releases granules worth
    /// the bytes moved, the best first, planned again after each
    /// (`slide.rs`): what the groups could not move for want of a hole
    /// that holds them.
    fn slide_down(
        &mut self,
        mover: &mut Mover<'_>,
        report: &mut RelocationReport,
        voids: Voids,
    ) -> Result<(), MemoryError> {
        let shares = mover.storage.shares_a_budget();
        let may_map = match voids {
            Voids::BelowHighWater => u64::MAX,
            Voids::Below(bytes) => bytes.saturating_sub(1),
        };
        let before = self.mapped();
        for _ in 0..SLIDES_PLANNED {
            // What the slides may map is a budget for all of them, net of
            // what went back since.
            let left = may_map.saturating_sub(self.mapped().saturating_sub(before));
            let planned = self.plan_slide(SLIDE_PER_BYTE_SAVED, shares, left, mover.movable());
            let Some(slide) = planned else {
                break;
            };
            // A mapping refused (the device is full): what was mapped goes
            // back at the unmapping that follows.
            let Some(run) = self.make_slide(mover, slide) else {
                return Ok(());
            };
            report.moved += run.moved;
            report.bytes_moved += run.bytes;
            // Before a growth, what a slide gathered goes back before the
            // next maps more: the voids of all the slides are never mapped
            // at once (on a random trace through the service they were,
            // and made the device's peak 1.050 times its peak live for a
            // moment that no growth was needed).
            if matches!(voids, Voids::Below(_)) {
                self.unmap_past(mover.storage, before);
            }
            match run.ended {
                Ended::Done => {}
                // Pinned since the plan: the ones above it stay too.
                Ended::Pinned => {
                    report.skipped_pinned += 1;
                    return Ok(());
                }
                Ended::Failed(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Make `slide`: map the void runs it crosses, then slide its
    /// allocations in address order until one cannot be made. `None` when
    /// a mapping was refused (nothing slid; what was mapped lies free,
    /// queued for the next cleanup point).
    fn make_slide(&mut self, mover: &mut Mover<'_>, slide: Slide) -> Option<Run> {
        for &void in &slide.voids {
            self.map_for_slide(mover.storage, void, mover.serial).ok()?;
        }
        let mut run = Run::default();
        let mut rest = &slide.slots[..];
        while !rest.is_empty() {
            let adjacent = self.adjacent(mover, rest);
            let slid = self.slide_adjacent(mover, &rest[..adjacent]);
            let done = slid.as_ref().map_or(0, |&(_, done)| done);
            if !run.take(slid.map(|(step, _)| step)) {
                break;
            }
            rest = &rest[done..];
        }
        Some(run)
    }

    /// Count what a compaction before growth moved.
    fn count_moved_before_growth(&mut self, moved: u64, bytes: u64) {
        self.moved_before_growth.0 += moved;
        self.moved_before_growth.1 += bytes;
    }

    /// Allocations moved, and their bytes, by compactions before growth.
    pub(crate) fn moved_before_growth(&self) -> (u64, u64) {
        self.moved_before_growth
    }

    /// Make `moves` in order, each to the start of what the moves before
    /// left of its block, until one cannot be made: what moved and how it
    /// ended, and for each block used (by its node when planned) what is
    /// left of it now.
    fn move_as_planned(
        &mut self,
        mover: &mut Mover<'_>,
        moves: &[PlannedMove],
    ) -> (Run, Vec<(u32, u32)>) {
        let mut run = Run::default();
        let mut landed: Vec<(u32, u32)> = Vec::new();
        for &(slot, planned) in moves {
            let at = match landed.iter().position(|&(block, _)| block == planned) {
                Some(at) => at,
                None => {
                    landed.push((planned, planned));
                    landed.len() - 1
                }
            };
            let into = landed[at].1;
            let step = self.move_into(mover, slot, into);
            let step = step.map(|moved| {
                moved.map_or(Step::Pinned, |bytes| Step::Moved {
                    allocations: 1,
                    bytes,
                })
            });
            if !run.take(step) {
                break;
            }
            // The move carved the start of the block; the rest is where
            // the next move planned there lands.
            landed[at].1 = self.rest_of_hole(into);
        }
        (run, landed)
    }
}
