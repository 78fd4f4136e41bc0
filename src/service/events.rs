//! Supervisor events, for the user to log or count.

use crate::memory::StreamId;
use crate::sync::channel::{self, Receiver};
use std::time::Duration;

/// Something that happened to a device's streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SupervisorEvent {
    /// A stream's actor started.
    StreamStarted(StreamId),
    /// A stream shut down (every page returned).
    StreamStopped(StreamId),
    /// A stream's actor panicked.
    StreamFailed {
        /// The stream.
        stream: StreamId,
        /// The panic's message.
        message: String,
    },
    /// A stream could not get a page; the supervisor asks the others for
    /// theirs.
    RanShort {
        /// The stream.
        stream: StreamId,
        /// Bytes its request asked for.
        requested: u64,
    },
    /// A stream would have grown the device past its headroom; the
    /// supervisor asks the others for their cached pages first.
    HeadroomReached {
        /// The stream.
        stream: StreamId,
        /// Bytes its request asked for.
        requested: u64,
    },
    /// The other streams gave back cached pages for a short stream.
    GaveBack {
        /// The stream that was short.
        stream: StreamId,
        /// Bytes the others returned to the device.
        freed: u64,
    },
    /// Another stream served a stream's request past the headroom from
    /// the room it holds: no memory moved, and no driver call mapped any
    /// (`docs/service.md`, "Serving another stream").
    Lent {
        /// The stream whose request it was.
        stream: StreamId,
        /// The stream that served it (its allocations are the lender's).
        lender: StreamId,
        /// Bytes of the request.
        bytes: u64,
    },
    /// A stream's parked request was served after others gave memory back.
    Recovered {
        /// The stream.
        stream: StreamId,
        /// Bytes of the request.
        requested: u64,
    },
    /// A request failed for want of memory, after cross-stream cleanup.
    OutOfMemory {
        /// The stream.
        stream: StreamId,
        /// Bytes of the request.
        requested: u64,
    },
    /// The supervisor asked a stream to compact (its reserved / in-use
    /// passed the threshold).
    CompactionScheduled(StreamId),
    /// The supervisor asked a stream to settle: it held more than it had
    /// needed within the settle window.
    SettleScheduled {
        /// The stream.
        stream: StreamId,
        /// Bytes it held.
        reserved: u64,
        /// Bytes it should keep at most.
        keep: u64,
    },
}

/// A subscription to a supervisor's events ([`Supervisor::events`](super::Supervisor::events)).
#[derive(Debug)]
pub struct Events {
    /// Where the coordinator sends them.
    pub(crate) receiver: Receiver<SupervisorEvent>,
}

impl Events {
    pub(crate) fn channel() -> (channel::Sender<SupervisorEvent>, Self) {
        let (tx, rx) = channel::unbounded();
        (tx, Self { receiver: rx })
    }

    /// The next event, if one is waiting.
    pub fn try_next(&self) -> Option<SupervisorEvent> {
        self.receiver.try_recv().ok()
    }

    /// The next event, waiting up to `timeout`.
    pub fn next_timeout(&self, timeout: Duration) -> Option<SupervisorEvent> {
        self.receiver.recv_timeout(timeout).ok()
    }

    /// Every event waiting now.
    pub fn drain(&self) -> Vec<SupervisorEvent> {
        std::iter::from_fn(|| self.try_next()).collect()
    }
}
