//! Making the moves the planners chose, with the manager's [`Mover`]: a
//! move into a free block (a window, an evacuation group) copies the bytes;
//! a slide moves them down over the free block right below with the
//! storage's overlapping [`slide`](crate::storage::DeviceStorage::slide).
//! Each claims its allocation first and publishes the new place before the
//! claim is dropped (`pool/mover.rs`).

use super::ExpandablePool;
use crate::memory::error::MemoryError;
use crate::memory::pool::mover::{Mover, Pages};
use crate::memory::pool::page::{Backing, Placement};

use crate::storage::{DeviceStorage, StorageError, StorageHandle};
use std::ops::Range;

/// What one move of a planned run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Moved down, this many bytes.
    Moved(u64),
    /// Nothing free right below it (it stays, and needs not move).
    InPlace,
    /// Pinned by a client (it stays).
    Pinned,
}

impl ExpandablePool {
    /// Move the allocation of `slot` to the start of the free block `hole`.
    /// `Ok(None)` when it is pinned (or the block has no room for it),
    /// `Ok(Some(bytes))` when moved.
    pub(super) fn move_into(
        &mut self,
        mover: &mut Mover<'_>,
        slot: u32,
        hole: u32,
    ) -> Result<Option<u64>, MemoryError> {
        mover.move_claimed(slot, |mover, moving| {
            let Some(to) = self.reserve_into(hole, moving.size, moving.aligned, slot) else {
                return Ok(None);
            };
            mover.carry(self, slot, moving, to)
        })
    }

    /// Slide the allocation of `slot` down over the free block right below
    /// it, if it is not pinned. A failed copy leaves its bytes where they
    /// were (the storage undoes a partial one).
    pub(super) fn slide_slot(
        &mut self,
        mover: &mut Mover<'_>,
        slot: u32,
    ) -> Result<Step, MemoryError> {
        mover
            .while_claimed(slot, |mover| self.slide_claimed(mover, slot))
            .unwrap_or(Ok(Step::Pinned))
    }

    fn slide_claimed(&mut self, mover: &mut Mover<'_>, slot: u32) -> Result<Step, MemoryError> {
        let live = mover.slots.get(slot).expect("claimed");
        let (size, from) = (live.size, live.placement);
        let Some(to) = self.slide_target(from.node) else {
            return Ok(Step::InPlace);
        };
        if let Some(backing) = self.page_backing(from.page) {
            let at = |offset: u64| StorageHandle {
                id: backing.handle.id,
                offset: backing.handle.offset + offset,
                size,
            };
            let (source, target) = (at(from.offset), at(to));
            match self.staging(from.page, size, to..from.offset + size) {
                Some(staging) => stage(mover.storage, &source, &staging, &target)?,
                None => mover.storage.slide(&source, &target)?,
            }
        }
        let placement = self.slid(from.node, slot, mover.serial);
        mover.publish(self, slot, placement);
        Ok(Step::Moved(size))
    }

    /// Where to stage `size` bytes that slide down over `span` of range
    /// `page` (from the target's start to the source's end), when a slide
    /// in place would take more copies than two: it copies in pieces no
    /// longer than the distance (`DeviceStorage::slide`), and each queued
    /// copy costs the host about as much as moving 15 MB (7.5 us on an
    /// H200). A free block of the pool apart from the span, or `None`.
    fn staging(&self, page: u32, size: u64, span: Range<u64>) -> Option<StorageHandle> {
        let distance = span.end - size - span.start;
        if size.div_ceil(distance.max(1)) <= 2 {
            return None;
        }
        let node = self.arena.free_apart(size, page, span)?;
        let backing = self.page_backing(self.arena.page(node))?;
        Some(StorageHandle {
            id: backing.handle.id,
            offset: backing.handle.offset + self.arena.offset(node),
            size,
        })
    }
}

/// Move `source`'s bytes to `target`, which overlaps it, through the free
/// `staging`: two copies. If the second fails, the source's bytes are put
/// back from the staging copy (the target overlaps them), so a failure
/// leaves them where they were, as a failed slide does.
fn stage(
    storage: &mut dyn DeviceStorage,
    source: &StorageHandle,
    staging: &StorageHandle,
    target: &StorageHandle,
) -> Result<(), StorageError> {
    storage.copy(source, staging)?;
    if let Err(error) = storage.copy(staging, target) {
        storage.copy(staging, source)?;
        return Err(error);
    }
    Ok(())
}

impl Pages for ExpandablePool {
    fn page_backing(&self, index: u32) -> Option<Backing> {
        self.ranges[index as usize].backing
    }

    /// Ranges have their reservation from the start: nothing to back later.
    fn materialize(
        &mut self,
        _storage: &mut dyn DeviceStorage,
        index: u32,
    ) -> Result<StorageHandle, StorageError> {
        self.ranges[index as usize]
            .backing
            .map(|backing| backing.handle)
            .ok_or(StorageError::NoVirtualMemory)
    }

    fn free(&mut self, placement: Placement, size: u64, aligned: u64, serial: u64) {
        Self::free(self, placement, size, aligned, serial);
    }
}
