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
            let range = backing.handle;
            let at = |offset: u64| StorageHandle {
                id: range.id,
                offset: range.offset + offset,
                size,
            };
            mover.storage.slide(&at(from.offset), &at(to))?;
        }
        let placement = self.slid(from.node, slot, mover.serial);
        mover.publish(self, slot, placement);
        Ok(Step::Moved(size))
    }
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
