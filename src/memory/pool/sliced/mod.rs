//! A pool that carves many allocations from each page: the metadata pool
//! (one fixed page size) and the adaptive arena (a page size that grows
//! with the largest allocation served, leaving older pages *outdated*).

use super::arena::Arena;
use super::idle_pages::{IdlePages, IdleSweep};
use super::mover::Pages;
use super::page::{Backing, Growth, PageInfo, Placement, Sweep, Wanted, align_down, align_up};
use crate::memory::config::{PoolConfig, PoolKind};
use crate::memory::report::{PoolReport, PoolStats};
use crate::storage::{DeviceStorage, StorageError, StorageHandle};

mod relocate;

/// Adaptive pages grow in steps of this many bytes (or the smallest page
/// size, if smaller).
const GROWTH_STEP: u64 = 1024 * 1024;

/// One page of the pool.
#[derive(Debug, Clone)]
struct Page {
    /// Backing; `None` while carved lazily under a dry run, or once released.
    storage: Option<Backing>,
    /// Bytes.
    size: u64,
    /// Its first arena node (stable for the page's life).
    first: u32,
    /// Live allocations on it.
    live: u32,
    /// Bytes carved from it (aligned sizes).
    used: u64,
    /// Left behind by a growth: nothing new is carved from it.
    outdated: bool,
    /// Live page guards.
    guards: u32,
    /// Being emptied by a relocation: nothing new is carved from it.
    evacuating: bool,
    /// Bumped each time the page stops being empty, so an idle-queue entry
    /// from an earlier empty spell is recognised as stale.
    epoch: u32,
    /// Held (not yet returned).
    held: bool,
}

impl Page {
    fn withdrawn(&self) -> bool {
        self.outdated || self.guards > 0 || self.evacuating
    }

    fn releasable(&self) -> bool {
        self.held && self.live == 0 && self.guards == 0
    }
}

/// Many allocations per page.
#[derive(Debug)]
pub(crate) struct SlicedPool {
    /// Configured kind (for reports).
    kind: PoolKind,
    /// The largest reservation served.
    max_alloc_size: u64,
    /// Size of new pages.
    page_size: u64,
    /// For adaptive pools, the largest page size it may grow to.
    growth_limit: Option<u64>,
    /// Slice alignment.
    alignment: u64,
    /// Reservations a page may sit empty before a periodic cleanup returns it.
    pub(super) dealloc_period: Option<u64>,
    /// Pages by index; released indices are reused.
    pages: Vec<Page>,
    /// Released page indices.
    spare: Vec<u32>,
    /// Free space of every carvable page.
    arena: Arena,
    /// Pages that went empty: (page, epoch, serial).
    idle: IdlePages,
    /// Outdated pages that emptied: returned at the next cleanup.
    drained: Vec<u32>,
    /// Usage and peaks.
    stats: PoolStats,
}

impl SlicedPool {
    pub(crate) fn new(
        kind: PoolKind,
        page_size: u64,
        growth_limit: Option<u64>,
        config: &PoolConfig,
        alignment: u64,
    ) -> Self {
        let page_size = align_up(page_size.max(1), alignment);
        Self {
            kind,
            max_alloc_size: config.max_alloc_size,
            page_size,
            growth_limit,
            alignment,
            dealloc_period: config.dealloc_period,
            pages: Vec::new(),
            spare: Vec::new(),
            arena: Arena::default(),
            idle: IdlePages::default(),
            drained: Vec::new(),
            stats: PoolStats::default(),
        }
    }

    pub(crate) fn max_alloc_size(&self) -> u64 {
        self.max_alloc_size
    }

    pub(crate) fn try_reserve(&mut self, size: u64, aligned: u64, slot: u32) -> Option<Placement> {
        let node = self.arena.carve(aligned)?;
        Some(self.carved(node, size, aligned, slot))
    }

    fn carved(&mut self, node: u32, size: u64, aligned: u64, slot: u32) -> Placement {
        let placement = self.arena.hand_to(node, slot);
        let page = &mut self.pages[placement.page() as usize];
        if page.live == 0 {
            page.epoch = page.epoch.wrapping_add(1);
        }
        page.live += 1;
        page.used += aligned;
        self.stats.allocated(size, aligned);
        placement
    }

    pub(crate) fn reserve_new_page(
        &mut self,
        storage: &mut dyn DeviceStorage,
        wanted: Wanted,
        lazy: bool,
        growth: Growth,
    ) -> Result<Placement, StorageError> {
        let (size, aligned, slot) = (wanted.size, wanted.aligned, wanted.slot);
        let (grown, wanted) = match growth {
            Growth::Pool => (
                (aligned > self.page_size).then(|| self.grown_page_size(aligned)),
                self.new_page_size(aligned),
            ),
            Growth::Tight => (None, align_up(aligned, self.growth_step()).max(aligned)),
        };
        let index = match self.add_page(storage, wanted, lazy) {
            Ok(index) => {
                if let Some(page_size) = grown {
                    self.grow_to(page_size, index);
                }
                index
            }
            // Short of memory: a page of just this allocation may still fit,
            // and the page size stays as it was.
            Err(StorageError::OutOfMemory { .. }) if wanted > aligned => {
                self.add_page(storage, aligned, lazy)?
            }
            Err(err) => return Err(err),
        };
        let node = self
            .arena
            .carve_in(self.pages[index as usize].first, aligned)
            .expect("a fresh page holds the allocation it was sized for");
        Ok(self.carved(node, size, aligned, slot))
    }

    /// The bytes of the page a reservation of `aligned` bytes would add.
    pub(crate) fn new_page_size(&self, aligned: u64) -> u64 {
        if aligned > self.page_size {
            self.grown_page_size(aligned).max(aligned)
        } else {
            self.page_size
        }
    }

    /// The page size an adaptive pool grows to for `aligned` bytes: a
    /// quarter to spare, in whole steps, within the device's limit.
    fn grown_page_size(&self, aligned: u64) -> u64 {
        let Some(limit) = self.growth_limit else {
            return self.page_size;
        };
        let step = self.growth_step();
        let wanted = align_up(aligned.saturating_add(aligned / 4), step).min(limit);
        align_down(wanted, self.alignment).max(aligned)
    }

    /// Adopt a grown page size: every page but `new_page` becomes outdated.
    fn grow_to(&mut self, page_size: u64, new_page: u32) {
        if self.growth_limit.is_none() {
            return;
        }
        self.page_size = page_size;
        for index in 0..self.pages.len() {
            let page = &mut self.pages[index];
            if index as u32 != new_page && page.held && !page.outdated {
                page.outdated = true;
                self.arena.withdraw_page(page.first);
                if page.live == 0 {
                    self.drained.push(index as u32);
                }
            }
        }
        tracing::debug!(page_size, "adaptive pool grew its pages");
    }

    fn add_page(
        &mut self,
        storage: &mut dyn DeviceStorage,
        size: u64,
        lazy: bool,
    ) -> Result<u32, StorageError> {
        let backing = if lazy {
            None
        } else {
            Some(Backing::allocate(storage, size)?)
        };
        let index = self.spare.pop().unwrap_or_else(|| {
            self.pages.push(Page {
                storage: None,
                size: 0,
                first: 0,
                live: 0,
                used: 0,
                outdated: false,
                guards: 0,
                evacuating: false,
                epoch: 0,
                held: false,
            });
            (self.pages.len() - 1) as u32
        });
        let first = self.arena.add_page(index, size, true);
        let page = &mut self.pages[index as usize];
        *page = Page {
            storage: backing,
            size,
            first,
            live: 0,
            used: 0,
            outdated: false,
            guards: 0,
            evacuating: false,
            epoch: page.epoch.wrapping_add(1),
            held: true,
        };
        self.stats.page_added(size);
        Ok(index)
    }

    /// Add an empty page of `size` bytes (a relocation fills it).
    pub(crate) fn add_empty_page(
        &mut self,
        storage: &mut dyn DeviceStorage,
        size: u64,
        lazy: bool,
    ) -> Result<u32, StorageError> {
        self.add_page(storage, size, lazy)
    }

    /// The step page sizes grow (and shrink) by.
    pub(crate) fn growth_step(&self) -> u64 {
        match self.kind {
            PoolKind::Adaptive { min_page_size } => GROWTH_STEP.min(min_page_size.max(1)),
            _ => GROWTH_STEP,
        }
        .max(self.alignment)
    }

    pub(crate) fn free(&mut self, placement: Placement, size: u64, aligned: u64, serial: u64) {
        let page = &mut self.pages[placement.page() as usize];
        page.live -= 1;
        page.used -= aligned;
        let listed = !page.withdrawn();
        self.arena.free(placement.node(), listed);
        self.stats.freed(size, aligned);
        self.note_if_empty(placement.page(), serial);
    }

    /// Queue a page that just became releasable for the cleanup that suits it.
    fn note_if_empty(&mut self, index: u32, serial: u64) {
        let page = &self.pages[index as usize];
        if !page.releasable() {
            return;
        }
        if page.outdated {
            self.drained.push(index);
        } else {
            self.idle.push(index, page.epoch, serial);
        }
    }

    #[inline]
    pub(crate) fn cleanup(&mut self, storage: &mut dyn DeviceStorage, sweep: Sweep) -> bool {
        if self.drained.is_empty() && self.nothing_due(sweep) {
            return false;
        }
        let mut released = false;
        for index in std::mem::take(&mut self.drained) {
            released |= self.release(storage, index);
        }
        released | self.sweep_pages(storage, sweep)
    }

    /// Return the page to the device if nothing holds it.
    fn release(&mut self, storage: &mut dyn DeviceStorage, index: u32) -> bool {
        let page = &mut self.pages[index as usize];
        if !page.releasable() {
            return false;
        }
        page.held = false;
        page.epoch = page.epoch.wrapping_add(1);
        Backing::give_back(&mut page.storage, storage);
        let (first, size) = (page.first, page.size);
        self.arena.remove_page(first);
        self.spare.push(index);
        self.stats.page_removed(size);
        true
    }

    pub(crate) fn release_all(&mut self, storage: &mut dyn DeviceStorage) {
        for page in &mut self.pages {
            Backing::give_back(&mut page.storage, storage);
        }
        self.pages.clear();
        self.spare.clear();
        self.idle.clear();
        self.arena = Arena::default();
        self.drained.clear();
        self.stats.clear_usage();
    }

    pub(crate) fn guard(&mut self, index: u32) {
        let page = &mut self.pages[index as usize];
        self.arena.add_guard(page.first, &mut page.guards);
    }

    pub(crate) fn unguard(&mut self, index: u32, serial: u64) {
        let page = &mut self.pages[index as usize];
        page.guards -= 1;
        if page.guards == 0 {
            if !page.withdrawn() {
                self.arena.relist_page(page.first);
            }
            self.note_if_empty(index, serial);
        }
    }

    /// The pages held, for relocation decisions.
    pub(crate) fn page_infos(&self) -> impl Iterator<Item = PageInfo> + '_ {
        self.pages
            .iter()
            .enumerate()
            .filter(|(_, page)| page.held)
            .map(|(index, page)| PageInfo {
                page: index as u32,
                size: page.size,
                used: page.used,
                outdated: page.outdated,
                guarded: page.guards > 0,
            })
    }

    /// The slots of the allocations on a page, in address order.
    pub(crate) fn slots_on(&self, index: u32) -> Vec<u32> {
        self.arena
            .used_blocks(self.pages[index as usize].first)
            .into_iter()
            .map(|node| self.arena.owner(node))
            .collect()
    }

    /// Stop (or resume) carving from a page while a relocation empties it.
    pub(crate) fn set_evacuating(&mut self, index: u32, evacuating: bool, serial: u64) {
        let page = &mut self.pages[index as usize];
        if page.evacuating == evacuating {
            return;
        }
        let was_withdrawn = page.withdrawn();
        page.evacuating = evacuating;
        match (was_withdrawn, page.withdrawn()) {
            (false, true) => self.arena.withdraw_page(page.first),
            (true, false) => self.arena.relist_page(page.first),
            _ => {}
        }
        if !evacuating {
            self.note_if_empty(index, serial);
        }
    }

    /// Free bytes on carvable pages other than `except`.
    pub(crate) fn carvable_free_bytes_excluding(&self, except: u32) -> u64 {
        self.pages
            .iter()
            .enumerate()
            .filter(|(index, page)| *index != except as usize && page.held && !page.withdrawn())
            .map(|(_, page)| page.size - page.used)
            .sum()
    }

    /// Whether the pages hold more than `threshold` times the bytes carved
    /// from them, with at least a page's worth to win back.
    pub(crate) fn wants_compaction(&self, threshold: f64) -> bool {
        let reserved = self.stats.usage.bytes_reserved;
        let used: u64 = self.pages.iter().filter(|p| p.held).map(|p| p.used).sum();
        let smallest = self
            .pages
            .iter()
            .filter(|p| p.held)
            .map(|p| p.size)
            .min()
            .unwrap_or(u64::MAX);
        self.stats.pages > 1
            && reserved.saturating_sub(used) >= smallest
            && reserved as f64 > used as f64 * threshold
    }

    /// Return `index` to the device now if nothing holds it; its bytes.
    pub(crate) fn release_now(
        &mut self,
        storage: &mut dyn DeviceStorage,
        index: u32,
    ) -> Option<u64> {
        let size = self.pages[index as usize].size;
        self.release(storage, index).then_some(size)
    }

    pub(crate) fn has_outdated(&self) -> bool {
        self.pages.iter().any(|page| page.held && page.outdated)
    }

    pub(crate) fn stats(&self) -> &PoolStats {
        &self.stats
    }

    pub(crate) fn report(&self) -> PoolReport {
        PoolReport {
            page_size: Some(self.page_size),
            outdated_pages: self
                .pages
                .iter()
                .filter(|page| page.held && page.outdated)
                .count() as u64,
            ..self.stats.report(self.kind, self.max_alloc_size)
        }
    }
}

crate::memory::pool::idle_pages::idle_sweep_by_fields!(SlicedPool);

crate::memory::pool::mover::pages_of_page_pool!(SlicedPool);
