//! Relocation in a sliced pool: empty pages into the room the others hold
//! (outdated pages first, then the least full), and on a settle move what a
//! page much larger than its contents holds into a new page sized to fit.
//! Each move is made with the manager's [`Mover`].

use super::SlicedPool;
use crate::memory::error::MemoryError;
use crate::memory::pool::mover::{Mover, Moving, Pages};
use crate::memory::pool::page::{Growth, Wanted, align_up};
use crate::memory::relocation::{RelocationReason, RelocationReport};

impl SlicedPool {
    /// Move allocations as `reason` allows; emptied pages go back (queued
    /// until the manager's flush).
    pub(in crate::memory::pool) fn relocate(
        &mut self,
        mover: &mut Mover<'_>,
        reason: RelocationReason,
        report: &mut RelocationReport,
    ) -> Result<(), MemoryError> {
        let mut pages: Vec<_> = self.page_infos().filter(|page| !page.guarded).collect();
        // Outdated pages first, then the least full: the cheapest pages to empty.
        pages.sort_by_key(|page| (!page.outdated, page.used));
        let compact = matches!(
            reason,
            RelocationReason::Compaction | RelocationReason::Short | RelocationReason::Settle
        );
        for page in pages {
            if !page.outdated && !compact {
                continue;
            }
            let may_add_page = reason == RelocationReason::Outdated;
            let mut done = RelocationReport::default();
            let emptied = self.evacuate(mover, page.page, may_add_page, &mut done);
            report.add(done);
            if !emptied? && compact && !page.outdated {
                // The least-full page did not fit in the others' room; fuller
                // pages will not either.
                break;
            }
        }
        if reason == RelocationReason::Settle {
            self.shrink(mover, report)?;
        }
        Ok(())
    }

    /// Move the allocations of every page that holds at least a step less
    /// than its size into a new page just large enough (or into room held
    /// elsewhere), and return the old page. Pages with a pinned allocation
    /// are left alone: half a move would hold both pages.
    fn shrink(
        &mut self,
        mover: &mut Mover<'_>,
        report: &mut RelocationReport,
    ) -> Result<(), MemoryError> {
        let step = self.growth_step();
        let mut pages: Vec<_> = self
            .page_infos()
            .filter(|page| !page.guarded && page.used > 0)
            .filter(|page| align_up(page.used, step).saturating_add(step) <= page.size)
            .collect();
        pages.sort_by_key(|page| page.used);
        for page in pages {
            let pinned = self.slots_on(page.page).iter().any(|&slot| {
                mover
                    .slots
                    .get(slot)
                    .is_some_and(crate::memory::slot::Live::stays_put)
            });
            if pinned {
                continue;
            }
            let lazy = self.page_backing(page.page).is_none();
            let fit = align_up(page.used, step);
            let Ok(smaller) = self.add_empty_page(mover.storage, fit, lazy) else {
                // No room on the device for the smaller page: keep the big one.
                return Ok(());
            };
            let moved = self.evacuate(mover, page.page, false, report);
            // The moves found room elsewhere: the new page goes back unused.
            if let Some(bytes) = self.release_now(mover.storage, smaller) {
                report.pages_released += 1;
                report.bytes_released += bytes;
            }
            moved?;
        }
        Ok(())
    }

    /// Move every allocation off `page`; release the page if it ends empty.
    /// `Ok(true)` when it did.
    fn evacuate(
        &mut self,
        mover: &mut Mover<'_>,
        page: u32,
        may_add_page: bool,
        report: &mut RelocationReport,
    ) -> Result<bool, MemoryError> {
        let slots = self.slots_on(page);
        if !may_add_page {
            let needed: u64 = slots
                .iter()
                .filter_map(|slot| mover.slots.get(*slot))
                .map(|live| live.aligned)
                .sum();
            if needed > self.carvable_free_bytes_excluding(page) {
                return Ok(false);
            }
        }
        self.set_evacuating(page, true, mover.serial);
        let mut result = Ok(());
        for slot in slots {
            match self.move_elsewhere(mover, slot, may_add_page) {
                Ok(Some(bytes)) => {
                    report.moved += 1;
                    report.bytes_moved += bytes;
                }
                Ok(None) => report.skipped_pinned += 1,
                Err(err) => {
                    result = Err(err);
                    break;
                }
            }
        }
        let released = self.release_now(mover.storage, page);
        if let Some(bytes) = released {
            report.pages_released += 1;
            report.bytes_released += bytes;
        } else {
            self.set_evacuating(page, false, mover.serial);
        }
        result.map(|()| released.is_some())
    }

    /// Move one allocation to room this pool holds, or to a new page when
    /// `may_add_page`. `Ok(None)` when it is pinned (or finds no room),
    /// `Ok(Some(bytes))` when moved.
    fn move_elsewhere(
        &mut self,
        mover: &mut Mover<'_>,
        slot: u32,
        may_add_page: bool,
    ) -> Result<Option<u64>, MemoryError> {
        mover.move_claimed(slot, |mover, moving| {
            let Moving { size, aligned, .. } = moving;
            let to = match self.try_reserve(size, aligned, slot) {
                Some(to) => to,
                None if may_add_page => {
                    let lazy = self.page_backing(moving.from.page()).is_none();
                    let (storage, growth) = (&mut *mover.storage, Growth::Pool);
                    let wanted = Wanted {
                        size,
                        aligned,
                        slot,
                    };
                    self.reserve_new_page(storage, wanted, lazy, growth)?
                }
                None => return Ok(None),
            };
            mover.carry(self, slot, moving, to)
        })
    }
}
