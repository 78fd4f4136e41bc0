//! What a relocation may do and what it did. The manager routes a
//! relocation to its pools (`manager/relocate.rs`); each pool kind moves
//! its own allocations (`pool/sliced/relocate.rs`, `pool/expandable/`).

use super::error::MemoryError;

/// Whether a relocation is wanted ([`MemoryManager::relocation_need`](super::MemoryManager::relocation_need)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelocationNeed {
    /// Nothing to gain.
    None,
    /// Outdated pages still hold allocations.
    Outdated,
    /// Pages hold more than the compaction threshold over what is in use.
    Compaction,
}

/// What a relocation may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelocationReason {
    /// Empty outdated pages into current ones, taking new current pages
    /// when the held ones are full (the seed's relocation).
    Outdated,
    /// Empty the least-full pages into the room other pages hold; no new
    /// page is taken.
    Compaction,
    /// The device is short: outdated pages, then compaction, no new page.
    Short,
    /// The load fell: compaction, then every page that holds much less
    /// than its size moves into a new page sized to what it holds (pages
    /// grown for a busy time shrink back). Takes new, smaller pages.
    Settle,
}

/// What a relocation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RelocationReport {
    /// Allocations moved.
    pub moved: u64,
    /// Bytes copied.
    pub bytes_moved: u64,
    /// Pages returned to the device.
    pub pages_released: u64,
    /// Bytes returned to the device.
    pub bytes_released: u64,
    /// Allocations left in place because they were pinned.
    pub skipped_pinned: u64,
}

impl RelocationReport {
    pub(crate) fn add(&mut self, other: Self) {
        self.moved += other.moved;
        self.bytes_moved += other.bytes_moved;
        self.pages_released += other.pages_released;
        self.bytes_released += other.bytes_released;
        self.skipped_pinned += other.skipped_pinned;
    }
}

/// A relocation that stopped at a failed copy: what it did before, and why
/// it stopped. The allocation whose copy failed is where it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("relocation stopped after moving {} allocations: {error}", report.moved)]
pub struct RelocationError {
    /// What was done before the failure (and stays done).
    pub report: RelocationReport,
    /// The failure.
    pub error: MemoryError,
}
