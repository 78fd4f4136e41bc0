//! The end of a manager with pins still held: pages under a live pin are
//! never returned to the device. The manager returns every page no pin
//! holds, then hands itself to the pins; the last of them to drop returns
//! the rest.
//!
//! The hand-over, per pinned cell, is one CAS that sets [`ORPHANED`] only
//! while a pin is held, so each cell is counted exactly once by whichever
//! comes last of the hand-over and its final unpin (the two touch the same
//! word, so they are totally ordered):
//!
//! - the owner adds one to [`PinKeeper::holds`] *before* it tries to mark a
//!   cell (so the count never goes below zero), and takes it back when the
//!   mark fails because the pins went meanwhile;
//! - an unpin that takes the count of an `ORPHANED` cell from one to zero
//!   takes that cell's hold back;
//! - `ORPHANED` refuses new pins (like `MOVING`), so a cell's pin count
//!   goes to zero once after its mark;
//! - the owner keeps one hold of its own while it hands over, and stores
//!   what frees the pages before it lets go of it: whoever takes the count
//!   to zero finds it there and runs it (`loom-tests/retire.rs`).

use super::handle::{AllocationCell, ORPHANED, PIN_MASK};
use super::manager::MemoryManager;
use super::slots::Live;
use crate::storage::DeviceStorage;
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::{Arc, Mutex};
use std::fmt;

/// What returns the pages a retired manager kept for its pins.
type Keep = Box<dyn FnOnce() + Send>;

/// Where a retired manager waits for its last pin (one per release queue,
/// which every cell of the manager reaches).
#[derive(Default)]
pub(crate) struct PinKeeper {
    /// Orphaned cells still pinned, plus one while the owner hands over.
    holds: AtomicUsize,
    /// Frees the kept pages; run by whoever takes `holds` to zero.
    keep: Mutex<Option<Keep>>,
}

impl fmt::Debug for PinKeeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinKeeper")
            .field("holds", &self.holds.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl PinKeeper {
    /// The last pin of an orphaned cell dropped.
    pub(crate) fn unpinned(&self) {
        self.let_go();
    }

    fn hold(&self) {
        self.holds.fetch_add(1, Ordering::SeqCst);
    }

    fn let_go(&self) {
        if self.holds.fetch_sub(1, Ordering::SeqCst) == 1 {
            let keep = self.keep.lock().take();
            if let Some(keep) = keep {
                keep();
            }
        }
    }
}

/// Mark `cell` orphaned if a pin holds it now; `false` when none does.
fn orphan(cell: &AllocationCell) -> bool {
    let mut state = cell.pins.load(Ordering::SeqCst);
    loop {
        if state & PIN_MASK == 0 {
            return false;
        }
        match cell.pins.compare_exchange_weak(
            state,
            state | ORPHANED,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(_) => return true,
            Err(now) => state = now,
        }
    }
}

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
        let (pools, tick) = (&mut self.pools, self.tick);
        let mut freed = 0;
        self.slots.free_all_but(Live::is_pinned, |live| {
            live.cell.addr.store(0, Ordering::Release);
            Self::unmeter(meter.as_ref(), &live.cell);
            freed += live.size;
            pools[live.pool as usize].free(live.placement, live.size, live.aligned, tick);
        });
        self.freed_in_use(freed);
    }

    /// Return every page to the device now, whatever still names it: the
    /// end of a stream. Every handle is stale afterwards (its reads answer
    /// an error), and the storage holds nothing once flushed.
    pub fn release_everything(&mut self) {
        self.process_releases();
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
        self.storage.flush();
    }
}

impl<S: DeviceStorage + 'static> MemoryManager<S> {
    /// The end of a stream, first half: return every page that no pin
    /// holds. Every unpinned allocation is freed (its handles are stale
    /// from now on); pinned ones keep their bytes and their pages.
    pub fn release_unpinned(&mut self) {
        self.process_releases();
        if self.pinned_count() == 0 {
            return self.release_everything();
        }
        self.free_unpinned();
        self.cleanup(crate::memory::Cleanup::Explicit);
        self.flush();
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
            if !orphan(&cell) {
                keeper.let_go();
            }
        }
        *keeper.keep.lock() = Some(Box::new(move || self.release_everything()));
        keeper.let_go();
    }
}
