//! How a CUDA storage gives memory back: what is queued is sealed behind
//! an event on its stream,
//! and reclaimed once the fence has passed, or waited for where memory ran
//! short or the storage drains.
//!
//! The long form: `docs/modules.md`, "`src/storage/cuda.rs`".

use super::{CudaFence, CudaPage, CudaStorage};
use crate::storage::give_back::Batch;
use cudarc::driver::result;
use cudarc::driver::sys;

impl CudaStorage {
    /// Seal what is queued behind a fence: an event recorded on the
    /// stream now. `false` where no event could be recorded (the caller waits).
    pub(super) fn seal(&mut self) -> bool {
        let Ok(event) = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING) else {
            return false;
        };
        // SAFETY: a fresh event, recorded on this storage's live stream.
        if unsafe { result::event::record(event, self.stream.cu_stream()) }.is_err() {
            // SAFETY: made above, recorded nowhere.
            let _ = unsafe { result::event::destroy(event) };
            return false;
        }
        self.give_back.seal(
            &mut self.ops,
            CudaFence {
                events: vec![event],
            },
        );
        true
    }

    /// Ready the storage for a flush or a drain: the context bound
    /// (`false`: it could not be, and nothing is done), and the bytes an
    /// allocation short of memory freed since the last one left at last.
    pub(super) fn catch_up(&mut self) -> bool {
        if self.bind().is_err() {
            return false;
        }
        self.bytes = self
            .bytes
            .saturating_sub(std::mem::take(&mut self.freed_uncounted));
        true
    }

    /// Wait for the stream (for memory others use, for the whole device)
    /// and give back everything queued or behind a fence.
    pub(super) fn wait_all(&mut self) {
        if self.give_back.is_empty() {
            return;
        }
        let _ = if self.foreign_streams {
            self.context.synchronize()
        } else {
            self.stream.synchronize()
        };
        let fence = CudaFence { events: Vec::new() };
        for batch in self.give_back.drain(&mut self.ops, fence) {
            self.reclaim(batch, true);
        }
    }

    /// Give the driver what `batch` holds, its fence passed (or waited
    /// for: `waited`): its granules still given back, then its pages and
    /// ranges.
    pub(super) fn reclaim(&mut self, batch: Batch<CudaFence>, waited: bool) {
        batch.fence.destroy(waited, &mut self.ops);
        for handle in &batch.unmaps {
            if let Some(range) = self.ranges.get_mut(&handle.id) {
                let gone = range.unmap_doomed(handle, batch.id, self.hold_spares, &mut self.ops);
                let granule = range.granule_map().granule();
                self.bytes = self.bytes.saturating_sub(gone.saturating_mul(granule));
            }
        }
        for id in batch.frees {
            if let Some(page) = self.pages.remove(&id) {
                self.free_page(page);
            }
            if let Some(range) = self.ranges.remove(&id) {
                if self.hold_spares {
                    // Its handles kept whole, unmapped, not released.
                    let kept = range.release_keeping_handles(&mut self.ops);
                    let refused = self.adopted.adopt(kept, self.granule);
                    debug_assert!(refused.is_empty(), "a range's own granule");
                    continue;
                }
                self.bytes = self.bytes.saturating_sub(range.mapped_bytes());
                range.release(&mut self.ops);
            }
        }
    }

    /// Memory ran short while what this storage gave back still waits
    /// behind fences: wait for them and give it back now, its bytes still
    /// counted until the next flush (where a budget sees them go).
    pub(super) fn reclaim_held_back(&mut self) -> bool {
        if self.give_back.is_empty() {
            return false;
        }
        let before = self.bytes;
        self.wait_all();
        self.freed_uncounted = self
            .freed_uncounted
            .saturating_add(before.saturating_sub(self.bytes));
        self.bytes = before;
        true
    }

    /// Free a page (its stream's work on it is done; the manager kept
    /// memory other streams used until their fences passed).
    pub(super) fn free_page(&mut self, page: CudaPage) {
        // SAFETY: `ptr` came from `malloc_sync` and is freed once; the
        // stream's work before its give-back is done (its fence passed,
        // or the stream was waited for).
        unsafe {
            let _ = result::free_sync(page.ptr);
        }
        self.ops.page_freed(page.size);
        self.bytes = self.bytes.saturating_sub(page.size);
    }
}
