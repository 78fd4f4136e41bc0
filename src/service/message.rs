//! The private protocol between a [`StreamHandle`](super::StreamHandle) and
//! its actor: one request enum whose variants carry their reply sender (the
//! split of Alice Ryhl's "Actors with Tokio").

use super::actor::StreamActor;
use super::error::ServiceError;
use crate::memory::{Allocation, AllocationMode, PageUpdate, StreamId};
use crate::sync::channel;
use crate::sync::reply::ReplyTo;
use std::time::Duration;

/// Where an answer goes: a blocking caller's reply cell (it spins, then
/// parks until the answer unparks it; `sync/reply.rs`), a channel nobody
/// waits on yet, or an async caller's channel. Sending never blocks, and an
/// answer to a caller that went away is dropped, which releases whatever it
/// held; a reply dropped unanswered tells its caller no answer will come.
#[derive(Debug)]
pub(crate) enum Reply<T> {
    /// A blocking caller waits for this.
    Waiter(ReplyTo<T>),
    /// Read later, perhaps on another thread (a detached shutdown's, a
    /// model's submitted reservation).
    Channel(channel::Sender<T>),
    /// An async caller awaits this.
    #[cfg(not(streamalloc_loom))]
    Async(crate::sync::async_channel::Sender<T>),
}

impl<T> Reply<T> {
    pub(crate) fn send(self, value: T) {
        match self {
            Reply::Waiter(to) => to.send(value),
            Reply::Channel(tx) => {
                let _ = tx.try_send(value);
            }
            #[cfg(not(streamalloc_loom))]
            Reply::Async(tx) => {
                let _ = tx.try_send(value);
            }
        }
    }
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

/// A request to a stream actor. Only what the actor treats specially has
/// a variant of its own: reservations (served, parked, retried), shutdown
/// (it ends the loop) and wake-ups. Every other operation is a [`Job`]: the
/// handle's one generic call ([`StreamHandle::run`](super::StreamHandle))
/// builds it, so adding an operation touches one place (`handle.rs`).
pub(crate) enum Request {
    /// `reserve` (one size) and `reserve_many`: all of the sizes or none.
    ReserveMany {
        sizes: Sizes,
        update: PageUpdate,
        mode: AllocationMode,
        /// How long the caller will wait for memory when the device is short.
        wait: Option<Duration>,
        /// How many of the sizes, the last ones, are for the caller's hot
        /// cache (reserved off the live meter; dropped when tight).
        for_cache: usize,
        reply: Answer<Allocations>,
    },
    /// Any other operation, run on the actor's thread.
    Run(Job),
    Shutdown {
        reply: Answer<ShutdownReport>,
    },
    /// Wakes an idle actor to look at its control channel (and its parked
    /// requests); carries nothing, and so is never counted as queued
    /// (`Connection::wake`).
    Wake,
    /// Answered once the actor has served everything before it, control
    /// traffic included (`Supervisor::tick`'s wait). Like `Wake`, not a
    /// request of the stream's clients: it leaves the stream idle.
    Barrier {
        reply: Answer<()>,
    },
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::ReserveMany { sizes, mode, .. } => f
                .debug_struct("ReserveMany")
                .field("sizes", sizes)
                .field("mode", mode)
                .finish_non_exhaustive(),
            Request::Run(_) => f.write_str("Run"),
            Request::Shutdown { .. } => f.write_str("Shutdown"),
            Request::Wake => f.write_str("Wake"),
            Request::Barrier { .. } => f.write_str("Barrier"),
        }
    }
}

/// An operation for a stream's actor. It is given the actor to run on, or
/// the error that refuses it (the stream stopped or failed), and answers its
/// caller itself either way, so a refused job still answers. A job dropped
/// without running (it reached the inbox as the actor left, and went with
/// the channel) refuses itself with `StreamStopped`: what it carried (a
/// bind's reservation) goes back to its caller, never lost.
pub(crate) struct Job {
    run: Option<JobFn>,
    stream: StreamId,
}

type JobFn = Box<dyn FnOnce(Result<&mut StreamActor, ServiceError>) + Send>;

impl Job {
    /// A job for `stream`'s actor.
    pub(crate) fn new(
        stream: StreamId,
        run: impl FnOnce(Result<&mut StreamActor, ServiceError>) + Send + 'static,
    ) -> Self {
        Self {
            run: Some(Box::new(run)),
            stream,
        }
    }

    /// Run it on the actor, or refuse it with `error`.
    pub(crate) fn run(mut self, actor: Result<&mut StreamActor, ServiceError>) {
        if let Some(run) = self.run.take() {
            run(actor);
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(run) = self.run.take() {
            run(Err(ServiceError::StreamStopped(self.stream)));
        }
    }
}

/// The job that runs `op` on `stream`'s actor and sends its result to
/// `reply`.
pub(crate) fn job<T: Send + 'static>(
    stream: StreamId,
    op: impl FnOnce(&mut StreamActor) -> Result<T, ServiceError> + Send + 'static,
    reply: Answer<T>,
) -> Request {
    Request::Run(Job::new(stream, move |actor| {
        reply.send(actor.and_then(op))
    }))
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
    /// No request for the idle tick: tidy up as an idle stream does.
    Idle,
    /// The stream holds more than it needed lately: return empty pages and
    /// compact, down towards `keep` bytes (see `settle.rs`).
    Settle {
        /// Bytes the stream should hold at most.
        keep: u64,
    },
}

impl Control {
    /// Sent by the coordinator's timers (a tick), not by a recovery round
    /// that a parked request waits for.
    pub(crate) fn is_timer(&self) -> bool {
        matches!(
            self,
            Control::Compact | Control::Idle | Control::Settle { .. }
        )
    }
}

impl Request {
    /// Answer the request with `error` without doing it.
    pub(crate) fn reject(self, error: ServiceError) {
        match self {
            Request::ReserveMany { reply, .. } => reply.send(Err(error)),
            Request::Run(job) => job.run(Err(error)),
            Request::Shutdown { reply } => reply.send(Err(error)),
            Request::Wake => {}
            Request::Barrier { reply } => reply.send(Err(error)),
        }
    }
}
