//! A hook for whoever wants to see every reservation, free, rebind and
//! failure as it happens (the trace recorder, a metrics exporter).

use super::error::MemoryError;
use super::handle::{AllocationId, StreamId};

/// Told of each event of a manager, in order, on the manager's thread.
/// Every method has an empty default.
pub trait MemoryObserver: Send {
    /// An allocation of `size` bytes was reserved as `id`.
    fn reserved(&mut self, id: AllocationId, size: u64) {
        let _ = (id, size);
    }

    /// The allocation `id` of `size` bytes was freed (its last handle dropped).
    fn freed(&mut self, id: AllocationId, size: u64) {
        let _ = (id, size);
    }

    /// The allocation `from` now goes by `to` (a `bind`).
    fn rebound(&mut self, from: AllocationId, to: AllocationId) {
        let _ = (from, to);
    }

    /// A reservation of `size` bytes on `stream` failed.
    fn failed(&mut self, stream: StreamId, size: u64, error: &MemoryError) {
        let _ = (stream, size, error);
    }
}
