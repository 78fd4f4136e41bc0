//! Everything a caller of the memory manager can cause, as one typed error.

use super::handle::AllocationId;
use super::taint::FailureId;
use crate::storage::StorageError;

/// Why a memory operation was refused. None of these is a bug of the
/// manager; each names what the caller did or what the device refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// A reservation of zero bytes.
    #[error("cannot reserve 0 bytes")]
    ZeroSize,
    /// A reservation larger than any page the device allows.
    #[error(
        "a reservation of {size} bytes{} exceeds the largest page the device allows ({max} bytes)",
        aligned_note(*size, *aligned)
    )]
    TooLarge {
        /// Bytes asked for.
        size: u64,
        /// What they take once aligned (what was weighed against `max`).
        aligned: u64,
        /// The device's largest page.
        max: u64,
    },
    /// A handle that was never bound to memory (made by `unbound`).
    #[error("the allocation handle was never bound to memory")]
    Uninitialized,
    /// A handle whose allocation was released or rebound: its slot's
    /// generation moved on, so it names nothing.
    #[error("allocation {0} is stale: its memory was released or rebound")]
    Stale(AllocationId),
    /// A handle made by another manager (another stream or device).
    #[error("allocation {0} belongs to another memory manager")]
    Foreign(AllocationId),
    /// `bind` was given an `assigned` handle that already names memory.
    #[error("the handle to bind to already names allocation {0}")]
    AlreadyBound(AllocationId),
    /// No room is held for the reservation and the page update forbids a
    /// new page.
    #[error("no room held for {size} bytes, and the page update forbids a new page")]
    PageUpdateForbidden {
        /// Bytes asked for.
        size: u64,
    },
    /// A byte range outside the allocation.
    #[error("range {start}..{end} lies outside the allocation of {size} bytes")]
    OutOfBounds {
        /// First byte asked for.
        start: u64,
        /// One past the last byte asked for.
        end: u64,
        /// The allocation's size.
        size: u64,
    },
    /// More streams recorded as users of one allocation than a manager
    /// keeps (`MemoryManager::record_use`).
    #[error("allocation {id} already records {max} other streams as users, the most it keeps")]
    TooManyUsers {
        /// The allocation.
        id: AllocationId,
        /// The most streams one allocation records.
        max: usize,
    },
    /// A failure id the manager's [`ErrorGraph`](super::ErrorGraph) never recorded.
    #[error("{0} was never recorded")]
    UnknownFailure(FailureId),
    /// The storage refused (out of device memory, a driver failure, a fault).
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// An operation that failed, with the allocation it was given, handed back
/// rather than freed (crossbeam's `SendError(T)`): what
/// [`MemoryManager::try_bind`](super::MemoryManager::try_bind) and
/// `StreamHandle::try_bind` answer.
#[derive(Debug)]
pub struct HandedBack<E> {
    /// Why it failed.
    pub error: E,
    /// What it was given, untouched (`None` only when a stream stopped with
    /// the request in flight: its allocations went with it).
    pub allocation: Option<super::Allocation>,
}

impl<E: std::fmt::Display> std::fmt::Display for HandedBack<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<E: std::error::Error + 'static> std::error::Error for HandedBack<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<E> HandedBack<E> {
    /// The same allocation handed back, with the error turned into `F`.
    pub fn map<F>(self, into: impl FnOnce(E) -> F) -> HandedBack<F> {
        HandedBack {
            error: into(self.error),
            allocation: self.allocation,
        }
    }
}

/// ", N once aligned" where alignment is what made a size too large.
fn aligned_note(size: u64, aligned: u64) -> String {
    if aligned == size {
        String::new()
    } else {
        format!(" ({aligned} once aligned)")
    }
}
