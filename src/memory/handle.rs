//! Allocation handles: what a client holds.
//!
//! An [`Allocation`] is a reference-counted pointer to a shared cell that
//! names its allocation by `(slot, generation)`. The manager's slot table
//! checks the generation on every access, so a handle whose slot was
//! released or rebound gets [`MemoryError::Stale`](super::MemoryError),
//! never another allocation's bytes (sharded-slab's scheme). Dropping the
//! last clone pushes the id onto the owner's [`ReleaseQueue`]; that is the
//! allocator's "free", and it never blocks.

use super::release::ReleaseQueue;
use super::slot::{PinWord, SlotKey};
use crate::sync::Arc;
use crate::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::Deref;

/// A device stream, as the service numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StreamId(pub u32);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {}", self.0)
    }
}

/// Names one allocation: its stream, its slot in that stream's table, and
/// the slot's generation when it was handed out.
///
/// Generations are 32 bits and skip 0 (which marks an unbound handle); a
/// slot must be reused 2^32 - 1 times before a generation repeats, and only
/// a handle that lived through all of those reuses could be confused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AllocationId {
    /// The owning stream.
    pub stream: StreamId,
    /// Index in the owner's slot table.
    pub slot: u32,
    /// The slot's generation.
    pub generation: u32,
}

impl fmt::Display for AllocationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}#{}", self.stream.0, self.slot, self.generation)
    }
}

/// Identifies one manager, so a handle of another is refused as foreign.
pub(crate) type OwnerId = u64;

/// The state an allocation's handles share with its owner.
#[derive(Debug)]
pub(crate) struct AllocationCell {
    /// The manager that made it.
    pub(crate) owner: OwnerId,
    /// The owner's stream.
    pub(crate) stream: StreamId,
    /// Packed `(slot, generation)`; 0 while unbound. Written by the owner
    /// only (at reserve or bind), before any other thread can see the handle
    /// or under the owner's exclusive access.
    pub(crate) key: AtomicU64,
    /// Live client handles (clones of [`Allocation`] and [`Binding`]).
    /// Separate from the `Arc`'s count because the owner also keeps the
    /// cell alive and must not count as a client.
    pub(crate) handles: AtomicUsize,
    /// The clients' pins and the owner's move and retirement (`slot/pin.rs`).
    pub(crate) pins: PinWord,
    /// The address of the allocation's first byte as last published by the
    /// owner, or 0 when the owner must be asked (never backed, or its
    /// stream stopped). Read only under a pin.
    pub(crate) addr: AtomicU64,
    /// The allocation's size in bytes (0 while unbound).
    pub(crate) len: AtomicU64,
    /// Bytes this binding still counts on its owner's live meter
    /// (`live.rs`); whoever ends the binding swaps them out, once.
    pub(crate) metered: AtomicU64,
    /// The manager whose stream's clients were handed this allocation
    /// from the owner's room ([`MemoryManager::lend_to`]), 0 for none: their
    /// handles take it as theirs and run its operations on the owner.
    ///
    /// [`MemoryManager::lend_to`]: crate::memory::MemoryManager::lend_to
    pub(crate) lent_to: AtomicU64,
    /// Where the last handle's drop sends the release.
    pub(crate) releases: Arc<ReleaseQueue>,
    /// The next cell on the release queue's stack, while this one is on it.
    pub(crate) next_release: AtomicPtr<AllocationCell>,
}

impl AllocationCell {
    pub(crate) fn id(&self) -> Option<AllocationId> {
        let key = self.key();
        key.is_bound().then(|| AllocationId {
            stream: self.stream,
            slot: key.slot(),
            generation: key.generation(),
        })
    }

    /// The slot key this cell names now.
    #[inline]
    pub(crate) fn key(&self) -> SlotKey {
        SlotKey::from_word(self.key.load(Ordering::Acquire))
    }

    /// Name `key` (the owner only, at reserve or bind).
    #[inline]
    pub(crate) fn set_key(&self, key: SlotKey) {
        self.key.store(key.word(), Ordering::Release);
    }
}

/// A handle to an allocation. Cloning is cheap; dropping the last clone
/// frees the allocation (its bytes go back to its pool, not to the device).
pub struct Allocation {
    /// Taken (not dropped) by the last handle's drop, which hands the
    /// reference to the release queue.
    pub(crate) cell: ManuallyDrop<Arc<AllocationCell>>,
}

impl Allocation {
    pub(crate) fn new(cell: AllocationCell) -> Self {
        cell.handles.store(1, Ordering::Relaxed);
        Self {
            cell: ManuallyDrop::new(Arc::new(cell)),
        }
    }

    /// The handle as one raw pointer (its `Arc` reference and its handle
    /// count go with it), for a lock-free slot to hold; back with
    /// [`from_raw`](Self::from_raw), exactly once.
    pub(crate) fn into_raw(self) -> *mut AllocationCell {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped, so the cell is taken once.
        let cell = unsafe { ManuallyDrop::take(&mut this.cell) };
        Arc::into_raw(cell).cast_mut()
    }

    /// The handle [`into_raw`](Self::into_raw) made.
    ///
    /// # Safety
    /// `raw` came from `into_raw` and is turned back only once.
    pub(crate) unsafe fn from_raw(raw: *mut AllocationCell) -> Self {
        Self {
            // SAFETY: the caller passes a pointer `into_raw` made, once.
            cell: ManuallyDrop::new(unsafe { Arc::from_raw(raw.cast_const()) }),
        }
    }

    /// Put an allocation reserved for a hot cache on its owner's live meter
    /// as it is handed out (on the client's thread: this is its only
    /// handle, so nothing can end the binding meanwhile).
    pub(crate) fn hand_out_from_cache(&self) {
        if let Some(meter) = &self.cell.releases.meter {
            let size = self.size();
            self.cell.metered.store(size, Ordering::Release);
            meter.handed_out_from_cache(size);
        }
    }

    /// The first handle of a recycled cell (no other reference to it exists).
    pub(crate) fn from_cell(cell: Arc<AllocationCell>) -> Self {
        cell.handles.store(1, Ordering::Relaxed);
        Self {
            cell: ManuallyDrop::new(cell),
        }
    }

    /// The allocation's id, `None` for a handle never bound to memory.
    pub fn id(&self) -> Option<AllocationId> {
        self.cell.id()
    }

    /// Whether this is the only handle, so the bytes may be updated in place.
    /// Bindings count as handles; page guards and pins do not.
    pub fn can_mut(&self) -> bool {
        self.cell.handles.load(Ordering::Acquire) == 1
    }

    /// A binding: a handle that a kernel or a resource holds to keep the
    /// allocation alive and in place.
    pub fn binding(&self) -> Binding {
        Binding(self.clone())
    }

    /// The allocation's size in bytes (0 for an unbound handle).
    pub fn size(&self) -> u64 {
        self.cell.len.load(Ordering::Acquire)
    }

    /// Whether two handles name the same allocation cell.
    pub fn same(&self, other: &Allocation) -> bool {
        Arc::ptr_eq(&self.cell, &other.cell)
    }
}

impl Clone for Allocation {
    fn clone(&self) -> Self {
        self.cell.handles.fetch_add(1, Ordering::Relaxed);
        Self {
            cell: ManuallyDrop::new(Arc::clone(&self.cell)),
        }
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // AcqRel as in `Arc`: every use of the handle happens before the
        // owner processes the release.
        let last = self.cell.handles.fetch_sub(1, Ordering::AcqRel) == 1;
        // SAFETY: `self.cell` is taken exactly once, here, and never used
        // again: this is the handle's drop.
        let cell = unsafe { ManuallyDrop::take(&mut self.cell) };
        if last && cell.key().is_bound() {
            if let Some(meter) = &cell.releases.meter {
                // Off the count before the release is queued: a decision
                // after this drop sees the bytes free (`live.rs`).
                meter.ended(cell.metered.swap(0, Ordering::AcqRel));
            }
            ReleaseQueue::push_cell(cell);
        }
    }
}

impl fmt::Debug for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.id() {
            Some(id) => write!(f, "Allocation({id})"),
            None => f.write_str("Allocation(unbound)"),
        }
    }
}

/// A handle held by whatever uses the allocation's bytes (a kernel launch, a
/// [`ManagedResource`](super::ManagedResource)): it keeps the allocation
/// alive, and it counts against [`Allocation::can_mut`].
#[derive(Clone, Debug)]
pub struct Binding(Allocation);

impl Deref for Binding {
    type Target = Allocation;

    fn deref(&self) -> &Allocation {
        &self.0
    }
}

impl From<Binding> for Allocation {
    fn from(binding: Binding) -> Self {
        binding.0
    }
}
