//! Relocation, routed: the manager asks each pool to move its own
//! allocations as the reason allows (`pool/sliced/relocate.rs` empties
//! pages; `pool/expandable/compact.rs` evacuates granules), then returns
//! what emptied to the device at one flush.
//!
//! The long form: `docs/modules.md`, "`src/memory/manager/relocate.rs`".

use super::MemoryManager;
use crate::memory::pool::Pool;
use crate::memory::relocation::{
    RelocationError, RelocationNeed, RelocationReason, RelocationReport,
};
use crate::storage::{DeviceStorage, DriverPath};

impl<S: DeviceStorage> MemoryManager<S> {
    /// Whether a relocation is wanted: outdated pages that still hold
    /// allocations, or pages past the compaction threshold. `None` again
    /// after a relocation that could move nothing, until the next reservation.
    pub fn relocation_need(&self) -> RelocationNeed {
        if self.futile_at == Some(self.serial) {
            return RelocationNeed::None;
        }
        if self.pools.iter().any(Pool::holds_outdated_allocations) {
            return RelocationNeed::Outdated;
        }
        if let Some(threshold) = self.compaction_threshold
            && self
                .pools
                .iter()
                .any(|pool| pool.wants_compaction(threshold))
        {
            return RelocationNeed::Compaction;
        }
        RelocationNeed::None
    }

    /// Whether a growth left outdated pages behind.
    pub fn has_outdated(&self) -> bool {
        self.pools.iter().any(Pool::has_outdated)
    }

    /// Compact: [`relocate`](Self::relocate) with [`RelocationReason::Compaction`].
    pub fn compact(&mut self) -> Result<RelocationReport, RelocationError> {
        self.relocate(RelocationReason::Compaction)
    }

    /// Move allocations as `reason` allows and return the emptied pages to
    /// the device. A [`RelocationReason::Settle`] also re-homes an
    /// allocation that keeps free granules of a physical handle held,
    /// where moving it lets more whole handles go than it maps
    /// (`docs/memory.md`, "Re-homing at a settle").
    ///
    /// # Errors
    /// A [`RelocationError`] when a copy or a new page failed; what was
    /// moved before stays moved, and the failed allocation stays in place.
    pub fn relocate(
        &mut self,
        reason: RelocationReason,
    ) -> Result<RelocationReport, RelocationError> {
        // A stream short of memory relocates on the path that found it
        // short (a trim past the headroom, a round, a device's budget).
        let path = match reason {
            RelocationReason::Settle => DriverPath::Settle,
            RelocationReason::Short => return self.relocate_rehoming(reason, false),
            _ => DriverPath::Compaction,
        };
        self.on_driver_path(path, |memory| {
            memory.relocate_rehoming(reason, reason == RelocationReason::Settle)
        })
    }

    /// [`relocate`](Self::relocate), re-homing at a settle only with
    /// `rehome` (`pool/expandable/rehome.rs`; its tests compare the two).
    pub(crate) fn relocate_rehoming(
        &mut self,
        reason: RelocationReason,
        rehome: bool,
    ) -> Result<RelocationReport, RelocationError> {
        self.process_releases();
        let mut report = RelocationReport::default();
        let (pools, mut mover) = self.lend();
        mover.rehome = rehome;
        for pool in pools.iter_mut() {
            if let Err(error) = pool.relocate(&mut mover, reason, &mut report) {
                mover.storage.flush();
                return Err(RelocationError { report, error });
            }
        }
        if report.pages_released > 0 || report.bytes_released > 0 {
            mover.storage.flush();
        }
        self.futile_at = (report.moved == 0 && report.bytes_released == 0).then_some(self.serial);
        Ok(report)
    }
}
