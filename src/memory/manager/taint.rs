//! Taint, on the manager: failures recorded in its error graph, and the
//! byte ranges of allocations that point at them (`memory/taint.rs`).

use super::MemoryManager;
use crate::memory::error::MemoryError;
use crate::memory::handle::Allocation;
use crate::memory::taint::{ErrorGraph, FailureId};
use crate::storage::DeviceStorage;
use std::ops::Range;

impl<S: DeviceStorage> MemoryManager<S> {
    /// Record a failure (caused by `causes`) for taint ranges to point at.
    pub fn record_failure(
        &mut self,
        message: impl Into<String>,
        causes: &[FailureId],
    ) -> FailureId {
        self.failures.record(message, causes)
    }

    /// The failures recorded so far.
    pub fn failures(&self) -> &ErrorGraph {
        &self.failures
    }

    /// Point bytes `range` of `allocation` at `failure`.
    pub fn taint(
        &mut self,
        allocation: &Allocation,
        range: Range<u64>,
        failure: FailureId,
    ) -> Result<(), MemoryError> {
        self.check_range(allocation, &range)?;
        if !self.failures.contains(failure) {
            return Err(MemoryError::UnknownFailure(failure));
        }
        self.live_mut(allocation)?.taint.taint(range, failure);
        Ok(())
    }

    /// Bytes `range` of `allocation` were written (by a kernel, say): no
    /// failure claims them any more. [`write`](Self::write) does this itself.
    pub fn written(
        &mut self,
        allocation: &Allocation,
        range: Range<u64>,
    ) -> Result<(), MemoryError> {
        self.check_range(allocation, &range)?;
        self.live_mut(allocation)?.taint.written(range);
        Ok(())
    }

    /// The failure that claims the lowest tainted byte of `range`, if any.
    pub fn failure(
        &self,
        allocation: &Allocation,
        range: Range<u64>,
    ) -> Result<Option<FailureId>, MemoryError> {
        self.check_range(allocation, &range)?;
        Ok(self.live(allocation)?.1.taint.failure(&range))
    }

    fn check_range(&self, allocation: &Allocation, range: &Range<u64>) -> Result<(), MemoryError> {
        let size = self.live(allocation)?.1.size;
        if range.start > range.end || range.end > size {
            return Err(MemoryError::OutOfBounds {
                start: range.start,
                end: range.end,
                size,
            });
        }
        Ok(())
    }
}
