//! The pools a manager routes reservations to. Two mechanisms serve every
//! kind: [`SlicedPool`] carves many allocations from each page (the
//! metadata pool and the adaptive arena), [`WholePagePool`] gives each
//! allocation a page of its own (exclusive pages, persistent, dedicated)
//! and differs per kind only in how freed pages are reused and returned.

mod arena;
mod bins;
mod expandable;
mod idle_pages;
pub(crate) mod mover;
mod page;
mod sliced;
mod whole;

pub(crate) use expandable::ExpandablePool;
pub(crate) use page::{FreeRoom, Growth, Placement, Sweep, Wanted, align_up};
pub(crate) use sliced::SlicedPool;
pub(crate) use whole::WholePagePool;

use super::config::{PoolConfig, PoolKind};
use super::error::MemoryError;
use super::policy::PageUpdate;
use super::relocation::{RelocationReason, RelocationReport};
use super::report::PoolReport;
use crate::storage::{DeviceStorage, DriverPath, StorageError, StorageHandle};
use mover::{Mover, Pages};

/// One pool.
#[derive(Debug)]
pub(crate) enum Pool {
    /// Many allocations per page.
    Sliced(SlicedPool),
    /// One allocation per page.
    Whole(WholePagePool),
    /// Address space mapped a granule at a time.
    Expandable(ExpandablePool),
}

macro_rules! each {
    ($self:ident, $pool:ident => $body:expr) => {
        match $self {
            Pool::Sliced($pool) => $body,
            Pool::Whole($pool) => $body,
            Pool::Expandable($pool) => $body,
        }
    };
}

impl Pool {
    /// A dynamic pool from its configuration, on a storage whose virtual
    /// memory maps `granule` bytes at a time (`None`: it has none, and an
    /// expandable pool is an adaptive arena instead); an expandable pool
    /// keeps free room as `free_room` says.
    pub(crate) fn dynamic(
        config: &PoolConfig,
        alignment: u64,
        max_page: u64,
        granule: Option<u64>,
        free_room: FreeRoom,
    ) -> Self {
        match config.kind {
            // Allocations start on the alignment, and so do granules: the
            // pool maps in the least common multiple of the storage's
            // granule and the alignment, where that stays a few granules
            // (an alignment of 3 maps 6 MiB at a time). Past that (an
            // alignment of 255 would map 510 MiB at a time, one of 2 MiB +
            // 1 four TiB) the pool is an adaptive arena of pages, as on a
            // storage without virtual memory.
            PoolKind::Expandable { range_size } => {
                match granule.and_then(|granule| pool_granule(granule, alignment)) {
                    Some(granule) => Pool::Expandable(ExpandablePool::new(
                        config.kind,
                        range_size,
                        granule,
                        config,
                        free_room,
                    )),
                    None => Pool::Sliced(SlicedPool::new(
                        PoolKind::Adaptive {
                            min_page_size: super::config::ADAPTIVE_MIN_PAGE_SIZE,
                        },
                        super::config::ADAPTIVE_MIN_PAGE_SIZE,
                        Some(max_page),
                        config,
                        alignment,
                    )),
                }
            }
            PoolKind::Sliced { page_size } => Pool::Sliced(SlicedPool::new(
                config.kind,
                page_size,
                None,
                config,
                alignment,
            )),
            PoolKind::Adaptive { min_page_size } => Pool::Sliced(SlicedPool::new(
                config.kind,
                min_page_size,
                Some(max_page),
                config,
                alignment,
            )),
            PoolKind::ExclusivePages | PoolKind::Persistent | PoolKind::Dedicated => Pool::Whole(
                WholePagePool::new(config.kind, config.max_alloc_size, config.dealloc_period),
            ),
        }
    }

    pub(crate) fn max_alloc_size(&self) -> u64 {
        each!(self, pool => pool.max_alloc_size())
    }

    /// Serve `aligned` bytes from the pages held, for `slot`.
    pub(crate) fn try_reserve(&mut self, size: u64, aligned: u64, slot: u32) -> Option<Placement> {
        each!(self, pool => pool.try_reserve(size, aligned, slot))
    }

    /// Serve `aligned` bytes for `slot` that the room held did not: a new
    /// page (with no backing when `lazy`) as large as `growth` says, or an
    /// expandable pool's growth, which tries moving allocations first
    /// where `update` allows (`expandable/grow.rs`).
    pub(crate) fn grow(
        &mut self,
        mover: &mut Mover<'_>,
        wanted: Wanted,
        update: PageUpdate,
        growth: Growth,
        lazy: bool,
    ) -> Result<Placement, StorageError> {
        let was = mover.storage.set_driver_path(DriverPath::Growth);
        let grown = match self {
            Pool::Sliced(pool) => pool.reserve_new_page(mover.storage, wanted, lazy, growth),
            // One allocation per page: its page is its size already.
            Pool::Whole(pool) => pool.reserve_new_page(mover.storage, wanted, lazy),
            // Maps just the granules it needs, whatever the growth (and
            // backs them now: address space costs nothing to hold lazily).
            Pool::Expandable(pool) => pool.grow(mover, wanted, update),
        };
        mover.storage.set_driver_path(was);
        grown
    }

    /// Give back free memory in whole physical handles, the longest idle
    /// first, until `bytes` went (or none is left free): what a round for
    /// a stream past the headroom asks. Only an expandable pool gives back part of what it
    /// holds; the bytes it unmapped, queued for the caller's flush.
    pub(crate) fn give_back_up_to(&mut self, storage: &mut dyn DeviceStorage, bytes: u64) -> u64 {
        match self {
            Pool::Expandable(pool) => {
                let before = pool.mapped();
                pool.unmap_idle_handles(storage, bytes);
                before.saturating_sub(pool.mapped())
            }
            _ => 0,
        }
    }

    /// After a reservation that may change pages: an expandable pool gives
    /// back what it holds free past its slack.
    #[inline]
    pub(crate) fn trim_after_reserve(&mut self, storage: &mut dyn DeviceStorage) {
        if let Pool::Expandable(pool) = self {
            pool.trim_after_reserve(storage);
        }
    }

    /// Move allocations as `reason` allows (whole pages never move).
    pub(crate) fn relocate(
        &mut self,
        mover: &mut Mover<'_>,
        reason: RelocationReason,
        report: &mut RelocationReport,
    ) -> Result<(), MemoryError> {
        match self {
            Pool::Sliced(pool) => pool.relocate(mover, reason, report),
            Pool::Expandable(pool) => pool.relocate_granules(mover, reason, report),
            Pool::Whole(_) => Ok(()),
        }
    }

    /// Whether outdated pages still hold allocations a relocation could move.
    pub(crate) fn holds_outdated_allocations(&self) -> bool {
        match self {
            Pool::Sliced(pool) => pool
                .page_infos()
                .any(|page| page.outdated && page.used > 0 && !page.guarded),
            Pool::Whole(_) | Pool::Expandable(_) => false,
        }
    }

    /// Whether a growth left outdated pages behind.
    pub(crate) fn has_outdated(&self) -> bool {
        match self {
            Pool::Sliced(pool) => pool.has_outdated(),
            Pool::Whole(_) | Pool::Expandable(_) => false,
        }
    }

    /// Whether the pages hold more than `threshold` times what is in use.
    pub(crate) fn wants_compaction(&self, threshold: f64) -> bool {
        match self {
            Pool::Sliced(pool) => pool.wants_compaction(threshold),
            Pool::Expandable(pool) => pool.wants_compaction(threshold),
            Pool::Whole(_) => false,
        }
    }

    /// Allocations moved, and their bytes, by compactions before growth.
    pub(crate) fn moved_before_growth(&self) -> (u64, u64) {
        match self {
            Pool::Expandable(pool) => pool.moved_before_growth(),
            Pool::Sliced(_) | Pool::Whole(_) => (0, 0),
        }
    }

    /// The bytes of the page [`grow`](Self::grow)
    /// would take for `aligned` bytes now.
    pub(crate) fn new_page_size(&self, aligned: u64) -> u64 {
        each!(self, pool => pool.new_page_size(aligned))
    }

    /// At least [`new_page_size`](Self::new_page_size), and cheap to know
    /// (an expandable pool's exact answer searches its voids).
    pub(crate) fn new_page_size_at_most(&self, aligned: u64) -> u64 {
        match self {
            Pool::Expandable(pool) => pool.new_page_size_at_most(aligned),
            other => other.new_page_size(aligned),
        }
    }

    /// Give an allocation's bytes back to the pool (not to the device).
    pub(crate) fn free(&mut self, placement: Placement, size: u64, aligned: u64, serial: u64) {
        each!(self, pool => pool.free(placement, size, aligned, serial))
    }

    /// Return pages to the device as `cleanup` says; whether any went.
    #[inline]
    pub(crate) fn cleanup(&mut self, storage: &mut dyn DeviceStorage, sweep: Sweep) -> bool {
        each!(self, pool => pool.cleanup(storage, sweep))
    }

    /// The page's storage, `None` while it has no backing (lazy).
    pub(crate) fn page_storage(&self, page: u32) -> Option<StorageHandle> {
        each!(self, pool => pool.page_backing(page).map(|b| b.handle))
    }

    /// The address of the page's first byte, `None` while it has no backing.
    pub(crate) fn page_base(&self, page: u32) -> Option<u64> {
        each!(self, pool => pool.page_backing(page).map(|b| b.base))
    }

    /// Return every page to the device, whatever holds it (shutdown).
    pub(crate) fn release_all(&mut self, storage: &mut dyn DeviceStorage) {
        each!(self, pool => pool.release_all(storage))
    }

    /// Give a lazily carved page its backing.
    pub(crate) fn materialize(
        &mut self,
        storage: &mut dyn DeviceStorage,
        page: u32,
    ) -> Result<StorageHandle, StorageError> {
        each!(self, pool => pool.materialize(storage, page))
    }

    pub(crate) fn guard(&mut self, page: u32) {
        each!(self, pool => pool.guard(page))
    }

    pub(crate) fn unguard(&mut self, page: u32, serial: u64) {
        each!(self, pool => pool.unguard(page, serial))
    }

    pub(crate) fn report(&self) -> PoolReport {
        each!(self, pool => pool.report())
    }

    /// Whether this is an expandable arena that keeps the room its peak
    /// needed mapped until asked for (`FreeRoom::keep_peak`).
    pub(crate) fn keeps_peak_mapped(&self) -> bool {
        matches!(self, Pool::Expandable(pool) if pool.keeps_peak_mapped())
    }

    /// Reservations an unused page waits before a periodic cleanup returns it.
    pub(crate) fn dealloc_period(&self) -> Option<u64> {
        each!(self, pool => pool.dealloc_period)
    }

    /// Bytes of the pages held (cheaper than a report).
    pub(crate) fn bytes_reserved(&self) -> u64 {
        each!(self, pool => pool.stats().usage.bytes_reserved)
    }
}

/// The most storage granules one granule of an expandable pool spans.
const MAX_GRANULES_PER_POOL_GRANULE: u64 = 16;

/// What an expandable pool maps at a time: the least common multiple of
/// the storage's `granule` and the `alignment`, or `None` when that is
/// more than [`MAX_GRANULES_PER_POOL_GRANULE`] granules.
pub(crate) fn pool_granule(granule: u64, alignment: u64) -> Option<u64> {
    fn gcd(mut a: u64, mut b: u64) -> u64 {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    }
    let (granule, alignment) = (granule.max(1), alignment.max(1));
    let lcm = (granule / gcd(granule, alignment)).checked_mul(alignment)?;
    (lcm / granule <= MAX_GRANULES_PER_POOL_GRANULE).then_some(lcm)
}
