//! The release queue: how a dropped handle gives its allocation back to the
//! owner without blocking, without a round trip, and (on the common path)
//! without a lock.
//!
//! The long form: `docs/modules.md`, "`src/memory/release.rs`".

use super::handle::AllocationCell;
use super::live::LiveMeter;
use super::slot::SlotKey;
use crate::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use crate::sync::{Arc, Mutex};
use std::fmt;
use std::ptr;

/// What a client gave back on the locked lane, for the owner to process
/// in order (the last handles of cells come through [`DroppedCells`]).
#[derive(Debug)]
pub(crate) enum Release {
    /// A pinned allocation whose handles went is unpinned: release this
    /// slot key again.
    Allocation(SlotKey),
    /// A page guard dropped: (pool, page).
    Guard {
        /// Pool index.
        pool: u8,
        /// Page index in the pool.
        page: u32,
    },
}

/// The owner's inbox of releases: unbounded, never blocks the dropper, and
/// separate from any request channel (so an actor dropping a handle cannot
/// block on its own inbox).
pub(crate) struct ReleaseQueue {
    /// Head of the stack of released cells; null when empty, [`closed`] once
    /// the owner is gone. Each entry owns one strong count of its cell.
    cells: AtomicPtr<AllocationCell>,
    /// Guard releases and repeated releases after a last unpin.
    others: Mutex<Vec<Release>>,
    /// Length of `others`, written under its lock; lets the owner skip the
    /// lock when nothing waits there.
    others_waiting: AtomicUsize,
    /// Where a manager that retired with pins held waits for them.
    pub(crate) keeper: super::keeper::PinKeeper,
    /// Counts live bytes for other threads (`live.rs`), if the owner is
    /// metered: the last handle's drop takes its bytes off here.
    pub(crate) meter: Option<Arc<LiveMeter>>,
}

/// The head that marks a closed queue. Never dereferenced; an address no
/// allocation can have (`Arc` data is aligned to at least 8).
fn closed() -> *mut AllocationCell {
    ptr::dangling_mut::<u8>() as *mut AllocationCell
}

impl ReleaseQueue {
    fn new(meter: Option<Arc<LiveMeter>>) -> Self {
        Self {
            cells: AtomicPtr::new(ptr::null_mut()),
            others: Mutex::new(Vec::new()),
            others_waiting: AtomicUsize::new(0),
            keeper: super::keeper::PinKeeper::default(),
            meter,
        }
    }
}

impl fmt::Debug for ReleaseQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseQueue")
            .field(
                "cells_waiting",
                &!self.cells.load(Ordering::Relaxed).is_null(),
            )
            .field(
                "others_waiting",
                &self.others_waiting.load(Ordering::Relaxed),
            )
            .finish()
    }
}

impl ReleaseQueue {
    /// Queue the release of the cell whose last handle just dropped, taking
    /// over that handle's reference to it.
    pub(crate) fn push_cell(cell: Arc<AllocationCell>) {
        let node = Arc::into_raw(cell).cast_mut();
        // SAFETY: `node` came from `Arc::into_raw` just above and its
        // reference is still ours: nobody else can free the cell (nor the
        // queue the cell holds) until the CAS below publishes it.
        let queue: &ReleaseQueue = unsafe { &(*node).releases };
        // Guess an empty stack (the owner drains before each operation, so it
        // usually is) and let a failed CAS say otherwise: one atomic
        // operation on the common path. (It also keeps loom honest: a load
        // just before the CAS would hide the owner's concurrent drain from
        // its exploration.)
        let mut head = ptr::null_mut();
        loop {
            if head == closed() {
                // SAFETY: the reference taken by `into_raw` above, unpublished.
                drop(unsafe { Arc::from_raw(node) });
                return;
            }
            // SAFETY: as above, the node is still ours alone.
            unsafe { (*node).next_release.store(head, Ordering::Relaxed) };
            // Release: the handle's last uses, and `next_release`, happen
            // before the owner's acquiring swap sees the node.
            match queue.cells.compare_exchange_weak(
                head,
                node,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Queue a release that is not a cell's first (see the module docs).
    pub(crate) fn push(&self, release: Release) {
        let mut others = self.others.lock();
        others.push(release);
        // Under the lock: a drain cannot zero the count over this item.
        self.others_waiting.store(others.len(), Ordering::Release);
        if let Some(meter) = &self.meter {
            meter.returned_late();
        }
    }

    /// Take every cell whose last handle dropped, in the order the handles
    /// dropped (for one dropping thread): one swap, and the stack turned
    /// around in place, so the owner frees each as it walks, with no buffer
    /// between (every reservation drains first: this is its common path).
    pub(crate) fn take_cells(&self) -> DroppedCells {
        let mut node = ptr::null_mut();
        if !self.cells.load(Ordering::Relaxed).is_null() {
            node = self.cells.swap(ptr::null_mut(), Ordering::Acquire);
            debug_assert!(node != closed(), "drained after close");
        }
        // Newest first on the stack: link each node to the one pushed
        // before it instead. The swap made this thread the only holder of
        // every node's queued reference, and no handle of a queued cell
        // exists to push it again, so nobody else reads or writes these
        // links now.
        let mut oldest_first = ptr::null_mut();
        while !node.is_null() {
            // SAFETY: every node on the stack is an `Arc::into_raw`
            // reference handed over by `push_cell`, ours since the swap.
            let cell = unsafe { &*node };
            let older = cell.next_release.load(Ordering::Relaxed);
            cell.next_release.store(oldest_first, Ordering::Relaxed);
            oldest_first = node;
            node = older;
        }
        DroppedCells { node: oldest_first }
    }

    /// Move everything waiting on the locked lane into `out` (no lock
    /// taken when nothing waits there, the common case).
    pub(crate) fn drain_others(&self, out: &mut Vec<Release>) {
        if self.others_waiting() {
            let mut others = self.others.lock();
            out.append(&mut others);
            self.others_waiting.store(0, Ordering::Release);
        }
    }

    /// Whether anything waits on the locked lane.
    #[inline]
    fn others_waiting(&self) -> bool {
        self.others_waiting.load(Ordering::Acquire) != 0
    }

    /// Whether nothing is waiting.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.cells.load(Ordering::Acquire).is_null() && !self.others_waiting()
    }

    /// The owner is gone: drop every queued reference, and make later pushes
    /// drop theirs at once.
    pub(crate) fn close(&self) {
        let mut node = self.cells.swap(closed(), Ordering::Acquire);
        while !node.is_null() && node != closed() {
            // SAFETY: as in `take_cells`.
            let cell = unsafe { Arc::from_raw(node) };
            node = cell.next_release.load(Ordering::Relaxed);
        }
        self.others.lock().clear();
        self.others_waiting.store(0, Ordering::Release);
    }
}

/// The cells whose last handles dropped, as [`ReleaseQueue::take_cells`]
/// took them: each with the reference its last handle queued, oldest
/// first. What is not walked is let go when this drops.
pub(crate) struct DroppedCells {
    /// The next cell, linked through `next_release`; null at the end.
    node: *mut AllocationCell,
}

impl Iterator for DroppedCells {
    type Item = Arc<AllocationCell>;

    #[inline]
    fn next(&mut self) -> Option<Arc<AllocationCell>> {
        if self.node.is_null() {
            return None;
        }
        // SAFETY: each node is a queued `Arc::into_raw` reference that
        // `take_cells` handed to this list alone; it is taken back once.
        let cell = unsafe { Arc::from_raw(self.node) };
        self.node = cell.next_release.load(Ordering::Relaxed);
        Some(cell)
    }
}

impl Drop for DroppedCells {
    fn drop(&mut self) {
        self.for_each(drop);
    }
}

/// The owner's end of a [`ReleaseQueue`]: closes it when the owner drops.
#[derive(Debug)]
pub(crate) struct ReleaseInbox(Arc<ReleaseQueue>);

impl ReleaseInbox {
    /// The inbox of an owner, its live bytes counted by `meter` if given.
    pub(crate) fn new(meter: Option<Arc<LiveMeter>>) -> Self {
        Self(Arc::new(ReleaseQueue::new(meter)))
    }

    /// The queue, for a new cell or guard to report to.
    pub(crate) fn queue(&self) -> &Arc<ReleaseQueue> {
        &self.0
    }
}

impl std::ops::Deref for ReleaseInbox {
    type Target = ReleaseQueue;

    fn deref(&self) -> &ReleaseQueue {
        &self.0
    }
}

impl Drop for ReleaseInbox {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use crate::memory::{MemoryConfig, MemoryManager, PageUpdate};
    use crate::storage::VirtualStorage;
    use crate::sync::Arc;

    /// The cells come off the queue in the order their last handles
    /// dropped (the stack is turned around in place), and a list dropped
    /// before it is walked lets every queued reference go.
    #[test]
    fn cells_come_in_drop_order_and_an_unwalked_list_lets_go() {
        let mut memory = MemoryManager::new(VirtualStorage::new(), MemoryConfig::default());
        let handles: Vec<_> = (1..=4)
            .map(|i| memory.reserve(i * 1024, PageUpdate::Allow).unwrap())
            .collect();
        let ids: Vec<_> = handles.iter().map(|h| h.id().unwrap()).collect();
        let mut handles: Vec<_> = handles.into_iter().map(Some).collect();
        for index in [2, 0, 3, 1] {
            handles[index] = None;
        }
        let queue = Arc::clone(memory.release_queue());
        let taken: Vec<_> = queue.take_cells().map(|cell| cell.id().unwrap()).collect();
        assert_eq!(taken, vec![ids[2], ids[0], ids[3], ids[1]]);
        assert!(queue.is_empty());

        let handles: Vec<_> = (1..=2)
            .map(|i| memory.reserve(i * 1024, PageUpdate::Allow).unwrap())
            .collect();
        let cells: Vec<_> = handles.iter().map(|h| Arc::clone(&h.cell)).collect();
        let counts = |cells: &[Arc<_>]| cells.iter().map(Arc::strong_count).collect::<Vec<_>>();
        let held = counts(&cells);
        drop(handles);
        assert_eq!(
            counts(&cells),
            held,
            "a queued release keeps the handle's reference"
        );
        let mut list = queue.take_cells();
        assert!(list.next().is_some());
        drop(list);
        let after = counts(&cells);
        assert_eq!(
            after.iter().sum::<usize>() + 2,
            held.iter().sum::<usize>(),
            "both queued references went, the walked one and the unwalked one"
        );
    }
}
