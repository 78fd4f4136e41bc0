//! Relocation: moving live allocations so whole pages go back to the device.
//!
//! Two uses. The seed's: an adaptive pool that grew its page size leaves
//! *outdated* pages behind, and emptying them into current pages returns
//! their memory. Ours on top: *compaction* of any sliced page, least full
//! first, when the pages hold far more than is in use, or when the device is
//! short. Every byte moves with its allocation through the storage's copy;
//! handles keep their ids (the slot records the new place). Persistent and
//! dedicated allocations (whole pages), guarded pages and pinned allocations
//! never move.
//!
//! A move claims the allocation with one CAS on its pin word (no pin held →
//! `MOVING`); a client that pins concurrently (the service's lock-free
//! resolve) either pinned first, and the move skips the allocation, or sees
//! `MOVING` and asks the owner instead. A copy that fails leaves the
//! allocation where it was: no byte is lost, and the pages stay consistent.

use super::compaction::Voids;
use super::error::MemoryError;
use super::handle::MOVING;
use super::manager::MemoryManager;
use super::pool::{Growth, Placement, Pool, align_up};
use crate::storage::{DeviceStorage, StorageHandle};
use crate::sync::atomic::Ordering;

/// Whether a relocation is wanted ([`MemoryManager::relocation_need`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelocationNeed {
    /// Nothing to gain.
    None,
    /// Outdated pages still hold allocations.
    Outdated,
    /// Pages hold more than the compaction threshold over what is in use.
    Compaction,
}

/// What a relocation may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelocationReason {
    /// Empty outdated pages into current ones, taking new current pages
    /// when the held ones are full (the seed's relocation).
    Outdated,
    /// Empty the least-full pages into the room other pages hold; no new
    /// page is taken.
    Compaction,
    /// The device is short: outdated pages, then compaction, no new page.
    Short,
    /// The load fell: compaction, then every page that holds much less
    /// than its size moves into a new page sized to what it holds (pages
    /// grown for a busy time shrink back). Takes new, smaller pages.
    Settle,
}

/// What a relocation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RelocationReport {
    /// Allocations moved.
    pub moved: u64,
    /// Bytes copied.
    pub bytes_moved: u64,
    /// Pages returned to the device.
    pub pages_released: u64,
    /// Bytes returned to the device.
    pub bytes_released: u64,
    /// Allocations left in place because they were pinned.
    pub skipped_pinned: u64,
}

impl RelocationReport {
    fn add(&mut self, other: Self) {
        self.moved += other.moved;
        self.bytes_moved += other.bytes_moved;
        self.pages_released += other.pages_released;
        self.bytes_released += other.bytes_released;
        self.skipped_pinned += other.skipped_pinned;
    }
}

/// A relocation that stopped at a failed copy: what it did before, and why
/// it stopped. The allocation whose copy failed is where it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("relocation stopped after moving {} allocations: {error}", report.moved)]
pub struct RelocationError {
    /// What was done before the failure (and stays done).
    pub report: RelocationReport,
    /// The failure.
    pub error: MemoryError,
}

/// Where a move puts an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Destination {
    /// Wherever the pool serves it from what it holds, or from a new page
    /// when `may_add_page`.
    Anywhere {
        /// Whether a page may be added for it.
        may_add_page: bool,
    },
    /// At the start of this free block of an expandable pool (a planned
    /// compaction's landing place).
    Into(u32),
}

impl<S: DeviceStorage> MemoryManager<S> {
    /// Whether a relocation is wanted: outdated pages that still hold
    /// allocations, or pages past the compaction threshold. `None` again
    /// after a relocation that could move nothing, until the next reservation.
    pub fn relocation_need(&self) -> RelocationNeed {
        if self.futile_at == Some(self.tick) {
            return RelocationNeed::None;
        }
        let sliced = || {
            self.pools.iter().filter_map(|pool| match pool {
                Pool::Sliced(pool) => Some(pool),
                Pool::Whole(_) | Pool::Expandable(_) => None,
            })
        };
        if sliced().any(|pool| {
            pool.page_infos()
                .any(|page| page.outdated && page.used > 0 && !page.guarded)
        }) {
            return RelocationNeed::Outdated;
        }
        if let Some(threshold) = self.compaction_threshold
            && self.pools.iter().any(|pool| match pool {
                Pool::Sliced(pool) => pool.wants_compaction(threshold),
                Pool::Expandable(pool) => pool.wants_compaction(threshold),
                Pool::Whole(_) => false,
            })
        {
            return RelocationNeed::Compaction;
        }
        RelocationNeed::None
    }

    /// Whether a growth left outdated pages behind.
    pub fn has_outdated(&self) -> bool {
        self.pools.iter().any(|pool| match pool {
            Pool::Sliced(pool) => pool.has_outdated(),
            Pool::Whole(_) | Pool::Expandable(_) => false,
        })
    }

    /// Compact: [`relocate`](Self::relocate) with [`RelocationReason::Compaction`].
    pub fn compact(&mut self) -> Result<RelocationReport, RelocationError> {
        self.relocate(RelocationReason::Compaction)
    }

    /// Move allocations as `reason` allows and return the emptied pages to
    /// the device.
    ///
    /// # Errors
    /// A [`RelocationError`] when a copy or a new page failed; what was
    /// moved before stays moved, and the failed allocation stays in place.
    pub fn relocate(
        &mut self,
        reason: RelocationReason,
    ) -> Result<RelocationReport, RelocationError> {
        self.process_releases();
        let mut report = RelocationReport::default();
        for pool in 0..self.pools.len() {
            if matches!(self.pools[pool], Pool::Expandable(_)) {
                // Compacting reasons move allocations down out of granules
                // they alone keep mapped; every reason then gives back the
                // free granules (the holes cost nothing once unmapped).
                // A stream asked to give memory back (the device is short,
                // or past its headroom) maps none to do it.
                let voids = if reason == RelocationReason::Short {
                    Voids::Below(0)
                } else {
                    Voids::BelowHighWater
                };
                let evacuated = if reason == RelocationReason::Outdated {
                    Ok(())
                } else {
                    self.evacuate_granules(pool, &mut report, voids)
                };
                let Pool::Expandable(expandable) = &mut self.pools[pool] else {
                    unreachable!("checked above");
                };
                let before = expandable.stats().usage.bytes_reserved;
                expandable.unmap_all_free(&mut self.storage);
                report.bytes_released += before - expandable.stats().usage.bytes_reserved;
                if let Err(error) = evacuated {
                    self.storage.flush();
                    return Err(RelocationError { report, error });
                }
                continue;
            }
            if !matches!(self.pools[pool], Pool::Sliced(_)) {
                continue;
            }
            let result = self.relocate_pool(pool, reason, &mut report);
            if let Err(error) = result {
                self.storage.flush();
                return Err(RelocationError { report, error });
            }
        }
        if report.pages_released > 0 || report.bytes_released > 0 {
            self.storage.flush();
        }
        self.futile_at = (report.moved == 0 && report.bytes_released == 0).then_some(self.tick);
        Ok(report)
    }

    fn relocate_pool(
        &mut self,
        pool: usize,
        reason: RelocationReason,
        report: &mut RelocationReport,
    ) -> Result<(), MemoryError> {
        let Pool::Sliced(sliced) = &self.pools[pool] else {
            return Ok(());
        };
        let mut pages: Vec<_> = sliced.page_infos().filter(|page| !page.guarded).collect();
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
            let emptied = self.evacuate(pool, page.page, may_add_page, &mut done);
            report.add(done);
            if !emptied? && compact && !page.outdated {
                // The least-full page did not fit in the others' room; fuller
                // pages will not either.
                break;
            }
        }
        if reason == RelocationReason::Settle {
            self.shrink_pool(pool, report)?;
        }
        Ok(())
    }

    /// Move the allocations of every page that holds at least a step less
    /// than its size into a new page just large enough (or into room held
    /// elsewhere), and return the old page. Pages with a pinned allocation
    /// are left alone: half a move would hold both pages.
    fn shrink_pool(
        &mut self,
        pool: usize,
        report: &mut RelocationReport,
    ) -> Result<(), MemoryError> {
        let Pool::Sliced(sliced) = &self.pools[pool] else {
            return Ok(());
        };
        let step = sliced.growth_step();
        let mut pages: Vec<_> = sliced
            .page_infos()
            .filter(|page| !page.guarded && page.used > 0)
            .filter(|page| align_up(page.used, step).saturating_add(step) <= page.size)
            .collect();
        pages.sort_by_key(|page| page.used);
        for page in pages {
            let Pool::Sliced(sliced) = &mut self.pools[pool] else {
                unreachable!("checked above");
            };
            let pinned = sliced.slots_on(page.page).iter().any(|&slot| {
                self.slots
                    .get(slot)
                    .is_some_and(super::slots::Live::is_pinned)
            });
            if pinned {
                continue;
            }
            let lazy = sliced.page_backing(page.page).is_none();
            let fit = align_up(page.used, step);
            let Ok(smaller) = sliced.add_empty_page(&mut self.storage, fit, lazy) else {
                // No room on the device for the smaller page: keep the big one.
                return Ok(());
            };
            let moved = self.evacuate(pool, page.page, false, report);
            let Pool::Sliced(sliced) = &mut self.pools[pool] else {
                unreachable!("checked above");
            };
            // The moves found room elsewhere: the new page goes back unused.
            if let Some(bytes) = sliced.release_now(&mut self.storage, smaller) {
                report.pages_released += 1;
                report.bytes_released += bytes;
            }
            moved?;
        }
        Ok(())
    }

    /// Move every allocation off `page` of sliced pool `pool`; release the
    /// page if it ends empty. `Ok(true)` when it did.
    fn evacuate(
        &mut self,
        pool: usize,
        page: u32,
        may_add_page: bool,
        report: &mut RelocationReport,
    ) -> Result<bool, MemoryError> {
        let Pool::Sliced(sliced) = &mut self.pools[pool] else {
            return Ok(false);
        };
        let slots = sliced.slots_on(page);
        if !may_add_page {
            let needed: u64 = slots
                .iter()
                .filter_map(|slot| self.slots.get(*slot))
                .map(|live| live.aligned)
                .sum();
            if needed > sliced.carvable_free_bytes_excluding(page) {
                return Ok(false);
            }
        }
        sliced.set_evacuating(page, true, self.tick);
        let mut result = Ok(());
        for slot in slots {
            match self.move_slot(pool, slot, Destination::Anywhere { may_add_page }) {
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
        let Pool::Sliced(sliced) = &mut self.pools[pool] else {
            unreachable!("checked above");
        };
        let released = sliced.release_now(&mut self.storage, page);
        if let Some(bytes) = released {
            report.pages_released += 1;
            report.bytes_released += bytes;
        } else {
            sliced.set_evacuating(page, false, self.tick);
        }
        result.map(|()| released.is_some())
    }

    /// Move one allocation to another place in its pool. `Ok(None)` when it
    /// is pinned (or `to` has no room), `Ok(Some(bytes))` when moved.
    pub(crate) fn move_slot(
        &mut self,
        pool: usize,
        slot: u32,
        to: Destination,
    ) -> Result<Option<u64>, MemoryError> {
        let live = self
            .slots
            .get(slot)
            .expect("a carved block has a live slot");
        let (size, aligned, from) = (live.size, live.aligned, live.placement);
        self.while_claimed(slot, |memory| {
            memory.copy_to_new_place(pool, slot, size, aligned, from, to)
        })
        .unwrap_or(Ok(None))
    }

    /// Run `moving` with the allocation of `slot` claimed for a move (its
    /// pin word from 0 to `MOVING`, back to 0 after); `None`, without
    /// running it, when a client holds a pin on it.
    pub(crate) fn while_claimed<T>(
        &mut self,
        slot: u32,
        moving: impl FnOnce(&mut Self) -> T,
    ) -> Option<T> {
        let live = self
            .slots
            .get(slot)
            .expect("a carved block has a live slot");
        // A pin through a cell it was bound away from holds it too (no
        // client can pin those afresh: their address is unpublished).
        if live.pinned_through_retired() {
            return None;
        }
        let cell = live.cell.clone();
        if cell
            .pins
            .compare_exchange(0, MOVING, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return None;
        }
        let moved = moving(self);
        // Release: a client that pins after this sees the new place.
        cell.pins.store(0, Ordering::SeqCst);
        Some(moved)
    }

    fn copy_to_new_place(
        &mut self,
        pool: usize,
        slot: u32,
        size: u64,
        aligned: u64,
        from: Placement,
        destination: Destination,
    ) -> Result<Option<u64>, MemoryError> {
        let found = match destination {
            Destination::Anywhere { .. } => self.pools[pool].try_reserve(size, aligned, slot),
            Destination::Into(hole) => match &mut self.pools[pool] {
                Pool::Expandable(expandable) => expandable.reserve_into(hole, size, aligned, slot),
                _ => None,
            },
        };
        let may_add_page = matches!(destination, Destination::Anywhere { may_add_page: true });
        let to = match found {
            Some(to) => to,
            None if may_add_page => {
                let lazy = self.pools[pool].page_storage(from.page).is_none();
                self.pools[pool].reserve_new_page(
                    &mut self.storage,
                    size,
                    aligned,
                    slot,
                    lazy,
                    Growth::Pool,
                )?
            }
            None => return Ok(None),
        };
        if let Err(err) = self.copy_bytes(pool, from, to, size) {
            self.pools[pool].free(to, size, aligned, self.tick);
            return Err(err);
        }
        self.pools[pool].free(from, size, aligned, self.tick);
        self.publish_place(pool, slot, to);
        Ok(Some(size))
    }

    /// Record that the allocation of `slot` now lies at `to`, and publish
    /// its address. Called before a move's claim is dropped (`move_slot`,
    /// `slide_slot`), so a client that pins next reads the new address.
    pub(crate) fn publish_place(&mut self, pool: usize, slot: u32, to: Placement) {
        let addr = self.pools[pool]
            .page_base(to.page)
            .map_or(0, |base| base + to.offset);
        let live = self.slots.get_mut(slot).expect("live");
        live.placement = to;
        live.cell.addr.store(addr, Ordering::SeqCst);
    }

    /// Copy `size` bytes from one placement to another; a source page never
    /// backed (lazy) holds nothing to copy.
    fn copy_bytes(
        &mut self,
        pool: usize,
        from: Placement,
        to: Placement,
        size: u64,
    ) -> Result<(), MemoryError> {
        let Some(source) = self.pools[pool].page_storage(from.page) else {
            return Ok(());
        };
        let target = match self.pools[pool].page_storage(to.page) {
            Some(target) => target,
            None => self.pools[pool].materialize(&mut self.storage, to.page)?,
        };
        let range = |page: StorageHandle, at: Placement| StorageHandle {
            id: page.id,
            offset: page.offset + at.offset,
            size,
        };
        self.storage
            .copy(&range(source, from), &range(target, to))?;
        Ok(())
    }
}
