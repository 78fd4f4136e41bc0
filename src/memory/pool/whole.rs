//! A pool that gives each allocation a page of its own. The three kinds that
//! use it differ in how a freed page is found again and when it goes back:
//!
//! - exclusive pages: pages binned by size class (at most 12.5% over the
//!   request), reused by any request of the class, returned after the
//!   deallocation period;
//! - persistent: exact-size pages (weights), reused by the same size only,
//!   returned at an explicit cleanup;
//! - dedicated: exact-size pages returned on the first cleanup after the
//!   free (a period of 0), so a buffer kept out of every pool does not linger.

use super::arena::NONE;
use super::bins;
use super::idle_pages::{IdlePages, IdleSweep};
use super::mover::Pages;
use super::page::{Backing, Placement, Sweep, Wanted};
use crate::memory::config::PoolKind;
use crate::memory::report::{PoolReport, PoolStats};
use crate::storage::{DeviceStorage, StorageError, StorageHandle};
use std::collections::HashMap;

/// One page.
#[derive(Debug, Clone, Default)]
struct Page {
    /// Backing; `None` while lazy, or once released.
    storage: Option<Backing>,
    /// Bytes.
    size: u64,
    /// Its reuse key (size class or exact size).
    key: u64,
    /// Holds a live allocation.
    used: bool,
    /// The slot of that allocation.
    owner: u32,
    /// Live page guards.
    guards: u32,
    /// Bumped at every change of state, so queued entries can be recognised
    /// as stale without searching the queues.
    epoch: u32,
    /// Held (not yet returned).
    held: bool,
}

impl Page {
    fn reusable(&self) -> bool {
        self.held && !self.used && self.guards == 0
    }
}

/// One allocation per page.
#[derive(Debug)]
pub(crate) struct WholePagePool {
    /// Exclusive, persistent or dedicated.
    kind: PoolKind,
    /// The largest reservation served.
    max_alloc_size: u64,
    /// Reservations a free page may wait before a periodic cleanup returns it.
    pub(super) dealloc_period: Option<u64>,
    /// Pages by index.
    pages: Vec<Page>,
    /// Released page indices.
    spare: Vec<u32>,
    /// Free pages by reuse key: (page, epoch), newest last.
    free: HashMap<u64, Vec<(u32, u32)>>,
    /// Free pages in the order they were freed: (page, epoch, serial).
    idle: IdlePages,
    /// Pages held per reuse key (for the size-match policy).
    held_sizes: HashMap<u64, u32>,
    /// Usage and peaks.
    stats: PoolStats,
}

impl WholePagePool {
    pub(crate) fn new(kind: PoolKind, max_alloc_size: u64, dealloc_period: Option<u64>) -> Self {
        Self {
            kind,
            max_alloc_size,
            dealloc_period,
            pages: Vec::new(),
            spare: Vec::new(),
            free: HashMap::new(),
            idle: IdlePages::default(),
            held_sizes: HashMap::new(),
            stats: PoolStats::default(),
        }
    }

    pub(crate) fn max_alloc_size(&self) -> u64 {
        self.max_alloc_size
    }

    /// The page size (and reuse key) for an aligned request. A size class
    /// is capped at the largest page the device allows (which need not be a
    /// power of two): the classes above the cap share one page size, and
    /// every request routed here fits it.
    fn key(&self, aligned: u64) -> u64 {
        match self.kind {
            PoolKind::ExclusivePages => bins::class_size(bins::round_up(aligned))
                .min(self.max_alloc_size)
                .max(aligned),
            _ => aligned,
        }
    }

    /// The bytes of the page a reservation of `aligned` bytes would add.
    pub(crate) fn new_page_size(&self, aligned: u64) -> u64 {
        self.key(aligned)
    }

    /// Whether a page of this request's size is held (used or free).
    pub(crate) fn holds_size(&self, aligned: u64) -> bool {
        self.held_sizes
            .get(&self.key(aligned))
            .is_some_and(|n| *n > 0)
    }

    pub(crate) fn try_reserve(&mut self, size: u64, aligned: u64, slot: u32) -> Option<Placement> {
        let key = self.key(aligned);
        let list = self.free.get_mut(&key)?;
        while let Some((index, epoch)) = list.pop() {
            let page = &self.pages[index as usize];
            if page.epoch == epoch && page.reusable() {
                return Some(self.take(index, size, aligned, slot));
            }
        }
        None
    }

    fn take(&mut self, index: u32, size: u64, aligned: u64, slot: u32) -> Placement {
        let page = &mut self.pages[index as usize];
        page.used = true;
        page.owner = slot;
        page.epoch = page.epoch.wrapping_add(1);
        self.stats.allocated(size, aligned);
        Placement::new(index, NONE, 0)
    }

    pub(crate) fn reserve_new_page(
        &mut self,
        storage: &mut dyn DeviceStorage,
        wanted: Wanted,
        lazy: bool,
    ) -> Result<Placement, StorageError> {
        let (size, aligned, slot) = (wanted.size, wanted.aligned, wanted.slot);
        let key = self.key(aligned);
        let backing = if lazy {
            None
        } else {
            Some(Backing::allocate(storage, key)?)
        };
        let index = self.spare.pop().unwrap_or_else(|| {
            self.pages.push(Page::default());
            (self.pages.len() - 1) as u32
        });
        let page = &mut self.pages[index as usize];
        *page = Page {
            storage: backing,
            size: key,
            key,
            used: false,
            owner: NONE,
            guards: 0,
            epoch: page.epoch.wrapping_add(1),
            held: true,
        };
        *self.held_sizes.entry(key).or_default() += 1;
        self.stats.page_added(key);
        Ok(self.take(index, size, aligned, slot))
    }

    pub(crate) fn free(&mut self, placement: Placement, size: u64, aligned: u64, serial: u64) {
        let page = &mut self.pages[placement.page() as usize];
        page.used = false;
        page.epoch = page.epoch.wrapping_add(1);
        self.stats.freed(size, aligned);
        self.offer(placement.page(), serial);
    }

    /// Make a page that just became reusable findable, and start its idle clock.
    fn offer(&mut self, index: u32, serial: u64) {
        let page = &self.pages[index as usize];
        if !page.reusable() {
            return;
        }
        let entry = (index, page.epoch);
        self.free.entry(page.key).or_default().push(entry);
        self.idle.push(entry.0, entry.1, serial);
    }

    #[inline]
    pub(crate) fn cleanup(&mut self, storage: &mut dyn DeviceStorage, sweep: Sweep) -> bool {
        if self.nothing_due(sweep) {
            return false;
        }
        if sweep == Sweep::All {
            self.free.clear();
        }
        self.sweep_pages(storage, sweep)
    }

    fn release(&mut self, storage: &mut dyn DeviceStorage, index: u32) -> bool {
        let page = &mut self.pages[index as usize];
        if !page.reusable() {
            return false;
        }
        page.held = false;
        page.epoch = page.epoch.wrapping_add(1);
        Backing::give_back(&mut page.storage, storage);
        let (key, size) = (page.key, page.size);
        if let Some(count) = self.held_sizes.get_mut(&key) {
            *count -= 1;
        }
        self.stats.page_removed(size);
        self.spare.push(index);
        true
    }

    pub(crate) fn release_all(&mut self, storage: &mut dyn DeviceStorage) {
        for mut page in self.pages.drain(..) {
            Backing::give_back(&mut page.storage, storage);
        }
        self.spare.clear();
        self.idle.clear();
        self.free.clear();
        self.held_sizes.clear();
        self.stats.clear_usage();
    }

    pub(crate) fn guard(&mut self, index: u32) {
        let page = &mut self.pages[index as usize];
        page.guards += 1;
        // A free page that gains a guard leaves the free lists: its queued
        // entries go stale with the epoch.
        page.epoch = page.epoch.wrapping_add(1);
    }

    pub(crate) fn unguard(&mut self, index: u32, serial: u64) {
        let page = &mut self.pages[index as usize];
        page.guards -= 1;
        if page.guards == 0 {
            page.epoch = page.epoch.wrapping_add(1);
            self.offer(index, serial);
        }
    }

    pub(crate) fn stats(&self) -> &PoolStats {
        &self.stats
    }

    pub(crate) fn report(&self) -> PoolReport {
        self.stats.report(self.kind, self.max_alloc_size)
    }
}

crate::memory::pool::idle_pages::idle_sweep_by_fields!(WholePagePool);

crate::memory::pool::mover::pages_of_page_pool!(WholePagePool);
