//! The private protocol between a [`StreamHandle`](super::StreamHandle) and
//! its actor: one request enum whose variants carry their reply sender (the
//! split of Alice Ryhl's "Actors with Tokio").

use super::error::ServiceError;
use crate::memory::{
    Allocation, AllocationMode, Cleanup, FailureId, MemoryReport, PageGuard, PageUpdate, Pinned,
    RelocationReason, RelocationReport,
};
use crate::sync::channel;
use std::ops::Range;
use std::time::Duration;

/// Where an answer goes: a blocking caller's channel, or an async caller's.
/// Sending never blocks (capacity 1, one answer), and an answer to a caller
/// that went away is dropped, which releases whatever it held.
#[derive(Debug)]
pub(crate) enum Reply<T> {
    /// A blocking caller waits on this.
    Blocking(channel::Sender<T>),
    /// A blocking caller that keeps its channel: the answer brings a
    /// sender back (see [`Returned`]).
    Returning(channel::Sender<Returned<T>>),
    /// An async caller awaits this.
    #[cfg(not(streamalloc_loom))]
    Async(flume::Sender<T>),
}

impl<T> Reply<T> {
    pub(crate) fn send(self, value: T) {
        match self {
            Reply::Blocking(tx) => {
                let _ = tx.try_send(value);
            }
            Reply::Returning(tx) => {
                let sender = tx.clone();
                let _ = tx.try_send(Returned { value, sender });
            }
            #[cfg(not(streamalloc_loom))]
            Reply::Async(tx) => {
                let _ = tx.try_send(value);
            }
        }
    }
}

/// An answer that carries a sender of its own channel back to the caller,
/// so the caller can keep the channel for its next request without holding
/// a sender while it waits: a request dropped unanswered (its stream
/// stopped or failed) still disconnects the channel, which the caller sees.
#[derive(Debug)]
pub(crate) struct Returned<T> {
    /// The answer.
    pub(crate) value: T,
    /// For the caller's next request.
    pub(crate) sender: channel::Sender<Returned<T>>,
}

/// The answer to most requests.
pub(crate) type Answer<T> = Reply<Result<T, ServiceError>>;

/// The sizes of one reservation request; one is held inline, so a plain
/// `reserve` puts nothing on the heap for the actor's thread to free.
pub(crate) type Sizes = smallvec::SmallVec<[u64; 1]>;
/// The allocations that answer one (one inline, likewise).
pub(crate) type Allocations = smallvec::SmallVec<[Allocation; 1]>;

/// What the service sends to shut a stream down, and what it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownReport {
    /// The stream.
    pub stream: crate::memory::StreamId,
    /// Requests answered with `StreamStopped` while draining.
    pub rejected: u64,
    /// Allocations still pinned when the wait for pins ran out.
    pub pinned_at_exit: usize,
    /// Bytes the storage still held after freeing every page (0 unless a
    /// storage failed to free).
    pub bytes_left: u64,
}

/// A request to a stream actor.
#[derive(Debug)]
pub(crate) enum Request {
    /// `reserve` (one size) and `reserve_many`: all of the sizes or none.
    ReserveMany {
        sizes: Sizes,
        update: PageUpdate,
        mode: AllocationMode,
        /// How long the caller will wait for memory when the device is short.
        wait: Option<Duration>,
        reply: Answer<Allocations>,
    },
    Unbound {
        reply: Answer<Allocation>,
    },
    Bind {
        reserved: Allocation,
        assigned: Allocation,
        cursor: u64,
        reply: Answer<()>,
    },
    Resolve {
        allocation: Allocation,
        reply: Answer<Pinned>,
    },
    Read {
        allocation: Allocation,
        offset: u64,
        len: u64,
        reply: Answer<Vec<u8>>,
    },
    Write {
        allocation: Allocation,
        offset: u64,
        data: Vec<u8>,
        reply: Answer<()>,
    },
    Copy {
        from: Allocation,
        to: Allocation,
        reply: Answer<()>,
    },
    Cleanup {
        cleanup: Cleanup,
        reply: Answer<()>,
    },
    Relocate {
        reason: RelocationReason,
        reply: Answer<RelocationReport>,
    },
    Guard {
        allocation: Allocation,
        reply: Answer<PageGuard>,
    },
    RecordFailure {
        message: String,
        causes: Vec<FailureId>,
        reply: Answer<FailureId>,
    },
    Taint {
        allocation: Allocation,
        range: Range<u64>,
        failure: FailureId,
        reply: Answer<()>,
    },
    Written {
        allocation: Allocation,
        range: Range<u64>,
        reply: Answer<()>,
    },
    Failure {
        allocation: Allocation,
        range: Range<u64>,
        reply: Answer<Option<FailureId>>,
    },
    Report {
        reply: Answer<MemoryReport>,
    },
    Shutdown {
        reply: Answer<ShutdownReport>,
    },
    /// Wakes an idle actor to look at its control channel; carries nothing.
    Wake,
}

/// Control traffic from the supervisor's coordinator to a stream actor, on
/// an unbounded channel (a send never blocks), each followed by a `Wake`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// Another stream is short: return every page nothing holds, compact,
    /// and say how much went back.
    GiveBack {
        /// The recovery episode this answers.
        episode: u64,
    },
    /// The recovery round for this stream is over: retry what is parked.
    Retry,
    /// Reserved / in use passed the threshold: compact.
    Compact,
    /// The stream holds more than it needed lately: return empty pages and
    /// compact, down towards `keep` bytes (see `settle.rs`).
    Settle {
        /// Bytes the stream should hold at most.
        keep: u64,
    },
}

impl Request {
    /// Answer the request with `error` without doing it.
    pub(crate) fn reject(self, error: ServiceError) {
        match self {
            Request::Unbound { reply } => reply.send(Err(error)),
            Request::ReserveMany { reply, .. } => reply.send(Err(error)),
            Request::Bind { reply, .. }
            | Request::Write { reply, .. }
            | Request::Copy { reply, .. }
            | Request::Cleanup { reply, .. }
            | Request::Taint { reply, .. }
            | Request::Written { reply, .. } => reply.send(Err(error)),
            Request::Resolve { reply, .. } => reply.send(Err(error)),
            Request::Read { reply, .. } => reply.send(Err(error)),
            Request::Relocate { reply, .. } => reply.send(Err(error)),
            Request::Guard { reply, .. } => reply.send(Err(error)),
            Request::RecordFailure { reply, .. } => reply.send(Err(error)),
            Request::Failure { reply, .. } => reply.send(Err(error)),
            Request::Report { reply } => reply.send(Err(error)),
            Request::Shutdown { reply } => reply.send(Err(error)),
            Request::Wake => {}
        }
    }
}
