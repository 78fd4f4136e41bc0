//! The end of a manager with pins still held: pages under a live pin are
//! never returned to the device. The manager returns every page no pin
//! holds, then hands itself to the pins; the last of them to drop returns
//! the rest.
//!
//! The long form: `docs/modules.md`, "`src/memory/manager/retire.rs`".

use super::MemoryManager;
use crate::memory::handle::AllocationCell;
use crate::memory::slot::Live;
use crate::storage::DeviceStorage;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;

impl<S: DeviceStorage> MemoryManager<S> {
    /// Live allocations that are pinned now.
    pub fn pinned_count(&self) -> usize {
        self.slots.pinned_count()
    }

    /// Every cell through which a pin holds a live allocation now.
    pub(crate) fn pinned_cells(&self) -> Vec<Arc<AllocationCell>> {
        self.slots.pinned_cells()
    }

    /// Free every live allocation no pin holds, whatever handles still
    /// name it (they are stale afterwards), as [`release_everything`]
    /// does, but leaving pinned ones and their pages in place.
    ///
    /// [`release_everything`]: Self::release_everything
    pub(crate) fn free_unpinned(&mut self) {
        let meter = self.meter().cloned();
        let (pools, serial) = (&mut self.pools, self.serial);
        let mut freed = 0;
        self.slots.free_all_but(Live::is_pinned, |live| {
            live.cell.addr.store(0, Ordering::Release);
            Self::unmeter(meter.as_ref(), &live.cell);
            freed += live.size;
            pools[live.pool as usize].free(live.placement, live.size, live.aligned, serial);
        });
        self.freed_in_use(freed);
    }

    /// Return every page to the device now, whatever still names it: the
    /// end of a stream. Every handle is stale afterwards (its reads answer
    /// an error), and the storage holds nothing once flushed.
    pub(crate) fn release_everything(&mut self) {
        self.process_releases();
        self.wait_every_user();
        let meter = self.meter().cloned();
        self.slots.free_all_but(
            |_| false,
            |live| {
                live.cell.addr.store(0, Ordering::Release);
                Self::unmeter(meter.as_ref(), &live.cell);
            },
        );
        self.freed_in_use(self.bytes_in_use());
        for pool in &mut self.pools {
            pool.release_all(&mut self.storage);
        }
        self.storage.drain();
    }
}

impl<S: DeviceStorage + 'static> MemoryManager<S> {
    /// The end of a stream, first half: return every page that no pin
    /// holds. Every unpinned allocation is freed (its handles are stale
    /// from now on); pinned ones keep their bytes and their pages.
    pub(crate) fn release_unpinned(&mut self) {
        self.process_releases();
        if self.pinned_count() == 0 {
            return self.release_everything();
        }
        self.wait_every_user();
        self.free_unpinned();
        self.cleanup(crate::memory::Cleanup::Explicit);
    }

    /// The end of a stream, second half: return every page now if no pin
    /// is held, else hand the manager to the pins: the last of them to drop
    /// returns what it holds (see the module's notes). A pinned address
    /// thus stays valid for as long as its pin lives, stream or no stream.
    pub fn retire(mut self) {
        self.process_releases();
        let queue = Arc::clone(self.release_queue());
        let keeper = &queue.keeper;
        keeper.hold();
        for cell in self.pinned_cells() {
            keeper.hold();
            if !cell.pins.orphan() {
                keeper.let_go();
            }
        }
        *keeper.keep.lock() = Some(Box::new(move || self.release_everything()));
        keeper.let_go();
    }
}
