//! The pools a manager routes reservations to. Two mechanisms serve every
//! kind: [`SlicedPool`] carves many allocations from each page (the
//! metadata pool and the adaptive arena), [`WholePagePool`] gives each
//! allocation a page of its own (exclusive pages, persistent, dedicated)
//! and differs per kind only in how freed pages are reused and returned.

mod expandable;
mod sliced;
mod whole;

pub(crate) use expandable::{ExpandablePool, PlannedMove, Slide};
pub(crate) use sliced::SlicedPool;
pub(crate) use whole::WholePagePool;

use super::config::{PoolConfig, PoolKind};
use super::policy::Cleanup;
use super::report::PoolReport;
use crate::storage::{DeviceStorage, StorageError, StorageHandle};

/// Where a pool put an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    /// The pool's page index.
    pub(crate) page: u32,
    /// The arena node of a sliced pool's block (`arena::NONE` for whole pages).
    pub(crate) node: u32,
    /// Offset in the page.
    pub(crate) offset: u64,
}

/// A page as the manager sees it when deciding what to relocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageInfo {
    /// The pool's page index.
    pub(crate) page: u32,
    /// Bytes of the page.
    pub(crate) size: u64,
    /// Bytes carved from it (aligned).
    pub(crate) used: u64,
    /// Left behind by a growth of the page size.
    pub(crate) outdated: bool,
    /// Guarded: never moved from, carved from or released.
    pub(crate) guarded: bool,
}

/// How large a page a reservation that needs one may add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Growth {
    /// The pool's page size (an adaptive pool grows it for a larger
    /// reservation).
    Pool,
    /// Just this reservation, in growth steps; the page size stays.
    Tight,
}

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
    /// trims its free room to one in `free_slack_one_in` of its bytes in
    /// use.
    pub(crate) fn dynamic(
        config: &PoolConfig,
        alignment: u64,
        max_page: u64,
        granule: Option<u64>,
        free_slack_one_in: Option<u64>,
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
                        free_slack_one_in,
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

    /// Add a page that holds `aligned` bytes (with no backing when `lazy`)
    /// and serve them from it.
    pub(crate) fn reserve_new_page(
        &mut self,
        storage: &mut dyn DeviceStorage,
        size: u64,
        aligned: u64,
        slot: u32,
        lazy: bool,
        growth: Growth,
    ) -> Result<Placement, StorageError> {
        match self {
            Pool::Sliced(pool) => pool.reserve_new_page(storage, size, aligned, slot, lazy, growth),
            // One allocation per page: its page is its size already.
            Pool::Whole(pool) => pool.reserve_new_page(storage, size, aligned, slot, lazy),
            // Maps just the granules it needs, whatever the growth (and
            // backs them now: address space costs nothing to hold lazily).
            Pool::Expandable(pool) => pool.reserve_new_page(storage, size, aligned, slot),
        }
    }

    /// The bytes of the page [`reserve_new_page`](Self::reserve_new_page)
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
    pub(crate) fn free(&mut self, placement: Placement, size: u64, aligned: u64, tick: u64) {
        each!(self, pool => pool.free(placement, size, aligned, tick))
    }

    /// Return pages to the device as `cleanup` says; whether any went.
    pub(crate) fn cleanup(
        &mut self,
        storage: &mut dyn DeviceStorage,
        tick: u64,
        cleanup: Cleanup,
    ) -> bool {
        each!(self, pool => pool.cleanup(storage, tick, cleanup))
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

    pub(crate) fn unguard(&mut self, page: u32, tick: u64) {
        each!(self, pool => pool.unguard(page, tick))
    }

    pub(crate) fn report(&self) -> PoolReport {
        each!(self, pool => pool.report())
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

/// A page's backing: its storage range and the address of its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backing {
    /// The whole page.
    pub(crate) handle: StorageHandle,
    /// Address of its first byte (what allocations publish for resolve).
    pub(crate) base: u64,
}

impl Backing {
    /// Queue a page's backing, if it has one, for deallocation.
    pub(crate) fn give_back(slot: &mut Option<Backing>, storage: &mut dyn DeviceStorage) {
        if let Some(backing) = slot.take() {
            storage.deallocate(backing.handle.id);
        }
    }

    /// A page's backing, allocated now if the page was carved lazily.
    pub(crate) fn get_or_allocate(
        slot: &mut Option<Backing>,
        storage: &mut dyn DeviceStorage,
        size: u64,
    ) -> Result<StorageHandle, StorageError> {
        if let Some(backing) = slot {
            return Ok(backing.handle);
        }
        let backing = Self::allocate(storage, size)?;
        *slot = Some(backing);
        Ok(backing.handle)
    }

    /// Allocate a page of `size` bytes and learn its address.
    pub(crate) fn allocate(
        storage: &mut dyn DeviceStorage,
        size: u64,
    ) -> Result<Self, StorageError> {
        let handle = storage.allocate(size)?;
        match storage.resource(&handle) {
            Ok(resource) => Ok(Self {
                handle,
                base: resource.addr,
            }),
            Err(err) => {
                storage.deallocate(handle.id);
                Err(err)
            }
        }
    }
}

/// `size` rounded up to a multiple of `alignment` (any alignment >= 1).
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

pub(crate) fn align_up(size: u64, alignment: u64) -> u64 {
    // The common case (every real device) without a division.
    if alignment.is_power_of_two() {
        let mask = alignment - 1;
        return size.checked_add(mask).map_or(u64::MAX, |end| end & !mask);
    }
    size.div_ceil(alignment).saturating_mul(alignment)
}

/// `size` rounded down to a multiple of `alignment`.
pub(crate) fn align_down(size: u64, alignment: u64) -> u64 {
    // As in `align_up`: a planner's walk calls this for every block.
    if alignment.is_power_of_two() {
        return size & !(alignment - 1);
    }
    size / alignment * alignment
}
