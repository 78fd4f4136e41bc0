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
    /// No memory for the request, even after cross-stream cleanup (or its
    /// wait ran out): what was asked, and who holds what.
    #[error("{0}")]
    OutOfMemory(Box<OutOfMemoryReport>),
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
    /// More streams than the device runs at once
    /// ([`ServiceConfig::max_streams`](super::ServiceConfig::max_streams)).
    #[error(
        "{requested} streams asked for; this device runs at most {limit} (ServiceConfig::max_streams)"
    )]
    TooManyStreams {
        /// Streams that would run.
        requested: usize,
        /// The most the device runs.
        limit: usize,
    },
    /// A replay of a trace that names more devices than a replay runs
    /// (each device is a supervisor with threads of its own).
    #[error(
        "the trace names more than {limit} devices; a replay runs at most {limit} (device {device} is one too many)"
    )]
    TooManyDevices {
        /// The device that would pass the limit.
        device: u32,
        /// The most devices a replay runs.
        limit: usize,
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
    /// An allocation handle was used with a stream it does not belong to:
    /// another stream, another device's stream of the same id, or the one
    /// this stream replaced after it failed or stopped.
    #[error("{}", wrong_stream(.owner, .used_on))]
    WrongStream {
        /// The stream that owns the allocation.
        owner: StreamId,
        /// The stream it was used with.
        used_on: StreamId,
    },
}

/// What [`ServiceError::WrongStream`] says: two ids that are the same
/// name two streams that are not.
fn wrong_stream(owner: &StreamId, used_on: &StreamId) -> String {
    if owner == used_on {
        format!(
            "allocation belongs to a {owner} of another device (or to the one this \
             {used_on} replaced), not this one"
        )
    } else {
        format!("allocation belongs to {owner}, not {used_on}")
    }
}

/// One stream's share of the device when a request ran out of memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamUsage {
    /// The stream.
    pub stream: StreamId,
    /// Bytes of pages it held.
    pub reserved: u64,
    /// Bytes its live allocations asked for.
    pub in_use: u64,
}

/// Why a reservation found no memory, after the stream's own cleanup and
/// compaction and the other streams' giving back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemoryReport {
    /// The stream that asked.
    pub stream: StreamId,
    /// Bytes it asked for.
    pub requested: u64,
    /// Bytes of new device memory serving it would have taken: whole
    /// granules (or a page), which can be far more than `requested` (100
    /// bytes need a 2 MiB granule when no free room holds them).
    pub needed: Option<u64>,
    /// The device budget, if one is set.
    pub budget: Option<u64>,
    /// Bytes of pages all streams held.
    pub reserved: u64,
    /// Bytes all streams' live allocations asked for.
    pub in_use: u64,
    /// Each stream's share.
    pub per_stream: Vec<StreamUsage>,
}

impl std::fmt::Display for OutOfMemoryReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::memory::Bytes;
        write!(
            f,
            "out of memory on {}: requested {}{}; device holds {} reserved, {} in use",
            self.stream,
            Bytes(self.requested),
            match self.needed {
                Some(needed) if needed > self.requested => {
                    format!(
                        ", which needs {} of new device memory (whole granules or a page)",
                        Bytes(needed)
                    )
                }
                _ => String::new(),
            },
            Bytes(self.reserved),
            Bytes(self.in_use)
        )?;
        if let Some(budget) = self.budget {
            write!(f, " of a {} budget", Bytes(budget))?;
        }
        for usage in &self.per_stream {
            write!(
                f,
                "; {}: {} reserved, {} in use",
                usage.stream,
                Bytes(usage.reserved),
                Bytes(usage.in_use)
            )?;
        }
        Ok(())
    }
}
