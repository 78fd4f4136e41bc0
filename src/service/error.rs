//! Errors of the service: the manager's, plus what comes from talking to a
//! stream over channels.

use crate::memory::{MemoryError, RelocationError, StreamId};

/// Why a service call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// The stream's manager refused (bad size, stale or foreign handle,
    /// storage failure, ...).
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A relocation stopped at a failure; what it moved stays moved.
    #[error(transparent)]
    Relocation(#[from] RelocationError),
    /// The stream was shut down (or removed); its handles answer this.
    #[error("{0} is stopped")]
    StreamStopped(StreamId),
    /// The stream's actor panicked; the stream is unusable.
    #[error("{stream} failed: {message}")]
    StreamFailed {
        /// The stream.
        stream: StreamId,
        /// The panic's message.
        message: String,
    },
    /// The supervisor is shut down: no stream can be created.
    #[error("the supervisor is shut down")]
    SupervisorStopped,
    /// The storage factory could not make a storage for a new stream.
    #[error("cannot create storage for {stream}: {message}")]
    StorageUnavailable {
        /// The stream.
        stream: StreamId,
        /// Why.
        message: String,
    },
    /// An allocation handle was used with a stream it does not belong to.
    #[error("allocation belongs to {owner}, not {used_on}")]
    WrongStream {
        /// The stream that owns the allocation.
        owner: StreamId,
        /// The stream it was used with.
        used_on: StreamId,
    },
}
