//! What a storage was asked to give back, held until its next flush: a
//! device frees memory only once the work queued before may no longer
//! touch it, so `deallocate` and `unmap` queue and `flush` gives back.

use super::{DriverOps, StorageHandle, StorageId};

/// Pages and ranges to free, and granule runs to unmap, at the next flush.
#[derive(Debug, Default)]
pub(crate) struct GiveBack {
    /// Pages and ranges to free, each once.
    frees: Vec<StorageId>,
    /// Runs of granules of live ranges to unmap.
    unmaps: Vec<StorageHandle>,
}

impl GiveBack {
    /// Queue the page or range `id` to be freed; `known`: the storage holds
    /// it (an unknown id, or one queued already, changes nothing).
    pub(crate) fn free(&mut self, id: StorageId, known: bool) {
        if known && !self.frees.contains(&id) {
            self.frees.push(id);
        }
    }

    /// Queue the granules `run` names to be unmapped; `known`: its range
    /// is live.
    pub(crate) fn unmap(&mut self, run: &StorageHandle, known: bool) {
        if known {
            self.unmaps.push(*run);
        }
    }

    /// Whether nothing waits to go back.
    pub(crate) fn is_empty(&self) -> bool {
        self.frees.is_empty() && self.unmaps.is_empty()
    }

    /// Whether granules wait to be unmapped.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn has_unmaps(&self) -> bool {
        !self.unmaps.is_empty()
    }

    /// The pages and ranges queued to be freed.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn frees(&self) -> &[StorageId] {
        &self.frees
    }

    /// Forget the queued frees of `ids` (given back another way).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn forget_frees(&mut self, ids: &[StorageId]) {
        self.frees.retain(|id| !ids.contains(id));
    }

    /// Everything queued, as a flush that waits for the stream first takes
    /// it (the wait counted on `ops`): a device lets memory go only once
    /// the work queued before can no longer touch it. `None` when nothing
    /// is queued (no wait).
    pub(crate) fn take_after_wait(
        &mut self,
        ops: &mut DriverOps,
    ) -> Option<(Vec<StorageHandle>, Vec<StorageId>)> {
        if self.is_empty() {
            return None;
        }
        ops.waited();
        Some(self.take())
    }

    /// Everything queued, in the order a flush gives it back: the unmaps
    /// (of ranges that stay), then the frees.
    pub(crate) fn take(&mut self) -> (Vec<StorageHandle>, Vec<StorageId>) {
        (
            std::mem::take(&mut self.unmaps),
            std::mem::take(&mut self.frees),
        )
    }
}
