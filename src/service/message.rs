//! The private protocol between a [`StreamHandle`](super::StreamHandle) and
//! its actor: one request enum whose variants carry their reply sender (the
//! split of Alice Ryhl's "Actors with Tokio").

use super::error::ServiceError;
use super::hot::HotCache;
use super::protocol::{Allocations, Answer, LendAsk, ShutdownReport, Sizes};
use super::shared::{Refuse, StreamShared};
use crate::memory::{AllocationMode, MemoryManager, PageUpdate, StreamId};
use crate::storage::DeviceStorage;
use crate::sync::channel::Receiver;
use std::time::Duration;

/// A request to a stream actor. Only what the actor treats specially has
/// a variant of its own: reservations (served, parked, retried), shutdown
/// (it ends the loop) and wake-ups. Every other operation is a [`Job`]: the
/// handle's one generic call ([`StreamHandle::run`](super::StreamHandle))
/// builds it, so adding an operation touches one place (`handle/`).
pub(crate) enum Request {
    /// `reserve` (one size) and `reserve_many`: all of the sizes or none,
    /// already in the form the actor serves, parks and retries.
    ReserveMany(Pending),
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
            Request::ReserveMany(pending) => f
                .debug_struct("ReserveMany")
                .field("sizes", &pending.sizes)
                .field("mode", &pending.mode)
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

type JobFn = Box<dyn FnOnce(Result<&mut dyn ActorTurn, ServiceError>) + Send>;

/// What a job may do with the actor it runs on, in the actor's turn (the
/// actor's own type stays in `actor/`, which no client-side file imports).
pub(crate) trait ActorTurn {
    /// The stream's pools.
    fn memory(&mut self) -> &mut MemoryManager<Box<dyn DeviceStorage>>;

    /// What the stream publishes.
    fn shared(&self) -> &StreamShared;

    /// A client's refill ahead of its hot cache (`StreamActor::refill_hot`).
    fn refill_hot(&mut self, cache: &HotCache, size: u64, mode: AllocationMode);

    /// Publish its counters for handles to read (`StreamActor::publish`).
    fn publish(&mut self);
}

impl Job {
    /// A job for `stream`'s actor.
    pub(crate) fn new(
        stream: StreamId,
        run: impl FnOnce(Result<&mut dyn ActorTurn, ServiceError>) + Send + 'static,
    ) -> Self {
        Self {
            run: Some(Box::new(run)),
            stream,
        }
    }

    /// Run it on the actor, or refuse it with `error`.
    pub(crate) fn run(mut self, actor: Result<&mut dyn ActorTurn, ServiceError>) {
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
    op: impl FnOnce(&mut dyn ActorTurn) -> Result<T, ServiceError> + Send + 'static,
    reply: Answer<T>,
) -> Request {
    Request::Run(Job::new(stream, move |actor| {
        reply.send(actor.and_then(op))
    }))
}

impl Request {
    /// Answer the request with `error` without doing it.
    pub(crate) fn reject(self, error: ServiceError) {
        match self {
            Request::ReserveMany(pending) => pending.answer(Err(error)),
            Request::Run(job) => job.run(Err(error)),
            Request::Shutdown { reply } => reply.send(Err(error)),
            Request::Wake => {}
            Request::Barrier { reply } => reply.send(Err(error)),
        }
    }
}

impl Refuse for Receiver<Request> {
    fn refuse_all(&self, error: &ServiceError) {
        while let Ok(request) = self.try_recv() {
            request.reject(error.clone());
        }
    }
}

/// A reservation being served (or parked).
#[derive(Debug)]
pub(crate) struct Pending {
    /// Sizes (one for `reserve`).
    pub(crate) sizes: Sizes,
    /// Page update allowed.
    pub(crate) update: PageUpdate,
    /// The caller's mode.
    pub(crate) mode: AllocationMode,
    /// How many of the sizes, the last ones, are for the caller's hot cache.
    pub(crate) for_cache: usize,
    /// Where the answer goes.
    pub(crate) reply: Answer<Allocations>,
    /// How long the caller waits for memory when the device is short.
    wait: Option<Duration>,
    /// Until when (on the service's clock) the caller waits for memory
    /// (`None`: one recovery round); set when the actor starts serving it.
    pub(crate) deadline: Option<Duration>,
    /// Where it stands.
    pub(crate) state: PendingState,
}

impl Pending {
    /// A caller's reservation, as it goes to the actor.
    pub(crate) fn new(
        sizes: Sizes,
        update: PageUpdate,
        mode: AllocationMode,
        wait: Option<Duration>,
        for_cache: usize,
        reply: Answer<Allocations>,
    ) -> Self {
        Self {
            sizes,
            update,
            mode,
            for_cache,
            reply,
            wait,
            deadline: None,
            state: PendingState::Serving,
        }
    }

    /// The actor starts serving it at `now`: its wait runs from here. The
    /// clock is read only for a request that waits a bounded time (most
    /// wait as long as it takes: a clock read each was a twentieth of a
    /// served reservation).
    pub(crate) fn start(&mut self, now: impl FnOnce() -> Duration) {
        self.deadline = self.wait.map(|wait| crate::clock::deadline(now(), wait));
    }
}

/// Where a reservation stands. Set where it changes, read by `retry_parked`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PendingState {
    /// Being served, not parked.
    Serving,
    /// Being served past the device's headroom after the others had their
    /// chance to give back: a page taken for it is just large enough
    /// (`MemoryManager::reserve_tight`).
    ServingTight,
    /// Parked to let the others give back before this stream grows past
    /// the device's headroom: after the round it takes a page whatever the
    /// headroom says.
    ParkedForHeadroom {
        /// When it was parked (on the service's clock).
        since: Duration,
    },
    /// Parked because the device is short: tried again at each retry,
    /// answered `OutOfMemory` when its round (or its deadline) is over.
    ParkedShort {
        /// When it was parked (on the service's clock).
        since: Duration,
    },
}

impl PendingState {
    /// When it was parked, if it is.
    pub(crate) fn parked_since(self) -> Option<Duration> {
        match self {
            PendingState::ParkedForHeadroom { since } | PendingState::ParkedShort { since } => {
                Some(since)
            }
            PendingState::Serving | PendingState::ServingTight => None,
        }
    }
}

impl Pending {
    /// The bytes asked for in all. Sizes come from the caller: their sum
    /// saturates (a total past `u64::MAX` is refused as too large by the
    /// manager, never an overflow that takes the stream down).
    pub(crate) fn requested(&self) -> u64 {
        requested(&self.sizes)
    }

    pub(crate) fn answer(self, result: Result<Allocations, ServiceError>) {
        self.reply.send(result);
    }
}

/// The bytes `sizes` ask for in all, saturating (see [`Pending::requested`]).
pub(crate) fn requested(sizes: &[u64]) -> u64 {
    sizes
        .iter()
        .fold(0u64, |total, size| total.saturating_add(*size))
}

/// A request past the headroom, out of its stream's turn to be served by
/// another stream's room (`lending.rs`; `docs/service.md`, "Serving
/// another stream").
#[derive(Debug)]
pub(crate) struct LendJob {
    /// The asking stream.
    pub(crate) asker: StreamId,
    /// The request (`PendingState::ParkedForHeadroom`).
    pub(crate) pending: Pending,
    /// What a lender serves of it.
    pub(crate) ask: LendAsk,
    /// The streams asked, in order.
    pub(crate) lenders: Vec<Lender>,
}

/// A stream a [`LendJob`] asks, and how it reaches its actor.
#[derive(Debug)]
pub(crate) struct Lender {
    pub(crate) stream: StreamId,
    pub(crate) seat: Box<dyn Lends>,
}

/// A stream's actor as another stream's lending job reaches it: in a turn
/// of its own, taken as any client of the stream takes one (`lending.rs`).
pub(crate) trait Lends: Send + Sync + std::fmt::Debug {
    /// `ask`, served from the room the stream holds, or `None` (refused,
    /// or the stream no longer runs).
    fn lend(&self, ask: &LendAsk) -> Option<Allocations>;

    /// Another reach of the same actor, for a job to keep.
    fn cloned(&self) -> Box<dyn Lends>;
}
