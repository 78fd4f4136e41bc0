//! Making a sliding compaction's moves (`pool/expandable/slide.rs` plans
//! them): each allocation claimed with the pin-word CAS every relocation
//! uses (`while_claimed`), its bytes moved down with the storage's overlapping
//! [`slide`](crate::storage::DeviceStorage::slide), then its new place
//! published before the claim is dropped.

use super::error::MemoryError;
use super::manager::MemoryManager;
use super::pool::Pool;
use crate::storage::{DeviceStorage, StorageHandle};

/// What a slide did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slid {
    /// Moved down, this many bytes.
    Moved(u64),
    /// Nothing free right below it (it stays, and needs not move).
    InPlace,
    /// Pinned by a client (it stays).
    Pinned,
}

impl<S: DeviceStorage> MemoryManager<S> {
    /// Slide the allocation of `slot` in expandable pool `pool` down over
    /// the free block right below it, if it is not pinned. A failed copy
    /// leaves its bytes where they were (the storage undoes a partial one).
    pub(crate) fn slide_slot(&mut self, pool: usize, slot: u32) -> Result<Slid, MemoryError> {
        self.while_claimed(slot, |memory| memory.slide_claimed(pool, slot))
            .unwrap_or(Ok(Slid::Pinned))
    }

    fn slide_claimed(&mut self, pool: usize, slot: u32) -> Result<Slid, MemoryError> {
        let live = self.slots.get(slot).expect("claimed");
        let (size, from) = (live.size, live.placement);
        let Pool::Expandable(expandable) = &self.pools[pool] else {
            return Ok(Slid::InPlace);
        };
        let Some(to) = expandable.slide_target(from.node) else {
            return Ok(Slid::InPlace);
        };
        if let Some(range) = self.pools[pool].page_storage(from.page) {
            let at = |offset: u64| StorageHandle {
                id: range.id,
                offset: range.offset + offset,
                size,
            };
            self.storage.slide(&at(from.offset), &at(to))?;
        }
        let tick = self.tick;
        let Pool::Expandable(expandable) = &mut self.pools[pool] else {
            unreachable!("checked above");
        };
        let placement = expandable.slid(from.node, slot, tick);
        self.publish_place(pool, slot, placement);
        Ok(Slid::Moved(size))
    }
}
