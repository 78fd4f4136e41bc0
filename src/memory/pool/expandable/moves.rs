//! Making the moves the planners chose, with the manager's [`Mover`]: a
//! move into a free block (a window, an evacuation group) copies the bytes;
//! a slide moves them down over the free block right below with the
//! storage's overlapping [`slide`](crate::storage::DeviceStorage::slide).
//! Each claims its allocation first and publishes the new place before the
//! claim is dropped (`pool/mover.rs`).

use super::ExpandablePool;
use crate::memory::error::MemoryError;
use crate::memory::pool::mover::Mover;

use crate::storage::StorageHandle;

/// What a slide did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slid {
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
        let live = mover
            .slots
            .get(slot)
            .expect("a carved block has a live slot");
        let (size, aligned, from) = (live.size, live.aligned, live.placement);
        mover
            .while_claimed(slot, |mover| {
                let Some(to) = self.reserve_into(hole, size, aligned, slot) else {
                    return Ok(None);
                };
                mover.carry(self, slot, from, to).map(Some)
            })
            .unwrap_or(Ok(None))
    }

    /// Slide the allocation of `slot` down over the free block right below
    /// it, if it is not pinned. A failed copy leaves its bytes where they
    /// were (the storage undoes a partial one).
    pub(super) fn slide_slot(
        &mut self,
        mover: &mut Mover<'_>,
        slot: u32,
    ) -> Result<Slid, MemoryError> {
        mover
            .while_claimed(slot, |mover| self.slide_claimed(mover, slot))
            .unwrap_or(Ok(Slid::Pinned))
    }

    fn slide_claimed(&mut self, mover: &mut Mover<'_>, slot: u32) -> Result<Slid, MemoryError> {
        let live = mover.slots.get(slot).expect("claimed");
        let (size, from) = (live.size, live.placement);
        let Some(to) = self.slide_target(from.node) else {
            return Ok(Slid::InPlace);
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
        Ok(Slid::Moved(size))
    }
}
