//! Page guards, pins and taint: what keeps bytes where they are, and what
//! says which of them a failure left invalid.

use super::MemoryManager;
use crate::memory::error::MemoryError;
use crate::memory::handle::{Allocation, AllocationCell};
use crate::memory::release::{Release, ReleaseQueue};
use crate::memory::slot::Unpinned;
use crate::storage::{DeviceStorage, Resource};
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use std::fmt;

/// Keeps one page as it is while it lives: nothing new is carved from it,
/// it is never returned to the device, and relocation leaves it alone. The
/// allocations on it can still be updated in place. What a replayed graph
/// (a CUDA graph, say) needs: its recorded addresses stay valid.
pub struct PageGuard {
    /// Where the drop is reported.
    releases: Arc<ReleaseQueue>,
    /// Pool index.
    pool: u8,
    /// Page index in the pool.
    page: u32,
}

impl Drop for PageGuard {
    fn drop(&mut self) {
        self.releases.push(Release::Guard {
            pool: self.pool,
            page: self.page,
        });
    }
}

impl fmt::Debug for PageGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PageGuard(pool {}, page {})", self.pool, self.page)
    }
}

/// What both kinds of pin say about the bytes they hold in place (each
/// keeps a `resource: Resource`).
macro_rules! pin_accessors {
    () => {
        /// The address of the first byte.
        pub fn addr(&self) -> u64 {
            self.resource.addr
        }

        /// Length in bytes.
        pub fn len(&self) -> u64 {
            self.resource.len
        }

        /// Whether the allocation is empty (never: reservations are non-zero).
        pub fn is_empty(&self) -> bool {
            self.resource.len == 0
        }

        /// Address and length.
        pub fn resource(&self) -> Resource {
            self.resource
        }
    };
}

/// Keeps an allocation at its address while it lives: relocation skips a
/// pinned allocation, and if every handle drops meanwhile the bytes are
/// freed only when the last pin goes. Pins do not count against
/// [`Allocation::can_mut`].
pub struct Pinned {
    /// The allocation's cell.
    cell: Arc<AllocationCell>,
    /// Address and length, valid while the pin lives.
    resource: Resource,
}

impl Pinned {
    /// Pin `cell` if no move is under way and its owner has not retired;
    /// the caller reads the address after this succeeds.
    pub(crate) fn try_pin(cell: &AllocationCell) -> bool {
        cell.pins.try_pin()
    }

    pub(crate) fn new(cell: Arc<AllocationCell>, resource: Resource) -> Self {
        Self { cell, resource }
    }

    pin_accessors!();
}

/// Drop one pin of `cell`; `true` when it was the last of a cell whose
/// owner is still there (the caller may owe it a release).
fn unpin(cell: &AllocationCell) -> bool {
    match cell.pins.unpin() {
        Unpinned::Held => false,
        Unpinned::Last => true,
        Unpinned::LastOrphaned => {
            // The owner retired with this pin held: this was what kept its
            // pages (see `retire.rs`).
            cell.releases.keeper.unpinned();
            false
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // The last pin of an allocation whose handles are all gone: the
        // owner skipped the release while pinned, so queue it again. If the
        // owner already freed it, the key is stale and the repeat is ignored.
        if unpin(&self.cell) && self.cell.handles.load(Ordering::SeqCst) == 0 {
            let key = self.cell.key();
            if key.is_bound() {
                self.cell.releases.push(Release::Allocation(key));
            }
        }
    }
}

/// A pin borrowed from its handle: keeps the allocation at its address
/// while it lives, as [`Pinned`] does, but cannot outlive the handle it
/// was taken through. The handle's own reference keeps the allocation, so
/// pinning is one CAS and unpinning one decrement (a `Pinned` also clones
/// and drops the cell's `Arc`, and checks for a release to repeat).
pub struct PinnedRef<'a> {
    /// The allocation's cell, borrowed from the handle.
    cell: &'a AllocationCell,
    /// Address and length, valid while the pin lives.
    resource: Resource,
}

impl<'a> PinnedRef<'a> {
    pub(crate) fn new(cell: &'a AllocationCell, resource: Resource) -> Self {
        Self { cell, resource }
    }

    pin_accessors!();
}

impl Drop for PinnedRef<'_> {
    fn drop(&mut self) {
        // The borrowed handle is alive, so no release was skipped for this
        // pin: unpinning is all there is.
        unpin(self.cell);
    }
}

impl fmt::Debug for PinnedRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PinnedRef({:#x}, {} bytes)",
            self.resource.addr, self.resource.len
        )
    }
}

impl fmt::Debug for Pinned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Pinned({:#x}, {} bytes)",
            self.resource.addr, self.resource.len
        )
    }
}

impl<S: DeviceStorage> MemoryManager<S> {
    /// Guard the page that holds `allocation` (see [`PageGuard`]).
    pub fn guard(&mut self, allocation: &Allocation) -> Result<PageGuard, MemoryError> {
        let (_, live) = self.live(allocation)?;
        let (pool, page) = (live.pool, live.placement.page());
        self.pools[pool as usize].guard(page);
        Ok(PageGuard {
            releases: Arc::clone(&allocation.cell.releases),
            pool,
            page,
        })
    }

    /// Pin `allocation` at its address (see [`Pinned`]).
    pub fn pin(&mut self, allocation: &Allocation) -> Result<Pinned, MemoryError> {
        let resource = self.get_resource(allocation, None, None)?;
        allocation.cell.addr.store(resource.addr, Ordering::Release);
        // Single-threaded, no move can be under way; the CAS is the one the
        // service's lock-free resolve uses.
        let pinned = Pinned::try_pin(&allocation.cell);
        debug_assert!(pinned, "no relocation runs during a &mut call");
        Ok(Pinned::new(Arc::clone(&allocation.cell), resource))
    }

    /// Whether `allocation` is pinned now.
    pub fn is_pinned(&self, allocation: &Allocation) -> bool {
        match self.live(allocation) {
            Ok((_, live)) => live.is_pinned(),
            Err(_) => allocation.cell.pins.is_pinned(),
        }
    }
}
