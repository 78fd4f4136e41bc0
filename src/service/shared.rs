//! What a stream's actor publishes for its handles and the supervisor to
//! read without a round trip: its state and its counters.

use super::error::ServiceError;
use super::hot::HotCaches;
use crate::memory::{LiveMeter, StreamId};
use crate::storage::UserStream;
use crate::sync::Arc;
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// An inbox an actor left: whatever reaches it is refused by its callers
/// (the inbox's requests, `message.rs`).
pub(crate) trait Refuse: Send + std::fmt::Debug {
    /// Refuse every request waiting in it with `error`.
    fn refuse_all(&self, error: &ServiceError);
}

/// Serving requests.
const RUNNING: u64 = 0;
/// Draining for shutdown: new requests are refused.
const STOPPING: u64 = 1;
/// Gone: every page returned.
const STOPPED: u64 = 2;
/// Its actor panicked.
const FAILED: u64 = 3;

/// The life of a stream, as [`StreamStats::state`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamState {
    /// Serving requests.
    Running,
    /// Shutting down.
    Stopping,
    /// Shut down.
    Stopped,
    /// Its actor panicked, with this message.
    Failed(String),
}

/// A snapshot of one stream's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStats {
    /// The stream.
    pub stream: StreamId,
    /// Its state.
    pub state: StreamState,
    /// Requests served.
    pub requests: u64,
    /// Allocations reserved.
    pub reservations: u64,
    /// Bytes in use now.
    pub bytes_in_use: u64,
    /// Bytes of pages held now.
    pub bytes_reserved: u64,
    /// Most bytes of pages held at once.
    pub peak_bytes_reserved: u64,
    /// Allocations moved by relocations.
    pub relocated: u64,
    /// Idle ticks that ran a cleanup.
    pub idle_cleanups: u64,
    /// Settles the supervisor asked for (the load fell).
    pub settles: u64,
    /// Reserves its clients served from their handles' hot caches, with no
    /// round trip (`service/hot.rs`).
    pub hot_hits: u64,
    /// Reserves of a size and mode a hot cache keeps that went to the actor.
    pub hot_misses: u64,
    /// Cached allocations the actor took back from its clients' handles.
    pub hot_taken_back: u64,
    /// Requests its clients served on their own threads, in the actor's
    /// turn (`Calls::serve_in_place`); the rest of `requests` went
    /// to the actor's thread.
    pub served_in_place: u64,
    /// Allocations it served from its room for other streams' requests
    /// past the device's headroom (`docs/service.md`, "Serving another
    /// stream"): counted in its bytes in use, not in `reservations`.
    pub lent: u64,
    /// Allocations its clients were answered with from another stream's
    /// room (the lender's allocations, in the lender's bytes in use).
    pub borrowed: u64,
}

/// Shared between a stream's actor, its handles and the supervisor.
#[derive(Debug)]
pub(crate) struct StreamShared {
    /// The stream.
    pub(crate) stream: StreamId,
    /// One of the state constants.
    state: AtomicU64,
    /// The panic message once failed.
    failure: Mutex<Option<String>>,
    /// The actor left: it will answer nothing more. What reaches its inbox
    /// from now on is refused by the callers themselves (`leftovers`).
    exited: AtomicBool,
    /// The inbox, handed over by the actor as it left: a request that
    /// reached it after the actor's last look is still there (a bounded
    /// channel keeps its messages until every sender goes), so a caller
    /// that finds the actor gone refuses whatever waits there, its own
    /// included, and every refused job answers its own caller.
    leftovers: Mutex<Option<Box<dyn Refuse>>>,
    /// Requests served.
    pub(crate) requests: AtomicU64,
    /// Allocations reserved.
    pub(crate) reservations: AtomicU64,
    /// Bytes the stream's clients hold, exact at every moment (`live.rs`).
    pub(crate) live: Arc<LiveMeter>,
    /// Bytes reserved (the actor publishes before it answers).
    pub(crate) bytes_reserved: AtomicU64,
    /// Peak bytes reserved.
    pub(crate) peak_bytes_reserved: AtomicU64,
    /// Bytes its storage gave back that still wait behind fences for the
    /// stream's work (the actor publishes; the coordinator's idle tick
    /// asks a quiet stream to look again while any do).
    pub(crate) bytes_in_reclaim: AtomicU64,
    /// Allocations moved.
    pub(crate) relocated: AtomicU64,
    /// Idle cleanups.
    pub(crate) idle_cleanups: AtomicU64,
    /// Settles.
    pub(crate) settles: AtomicU64,
    /// Its handles' hot caches.
    pub(crate) hot: HotCaches,
    /// Cached allocations taken back.
    pub(crate) hot_taken_back: AtomicU64,
    /// Requests served in place.
    pub(crate) served_in_place: AtomicU64,
    /// Allocations lent to other streams' requests.
    pub(crate) lent: AtomicU64,
    /// Allocations its clients borrowed from other streams.
    pub(crate) borrowed: AtomicU64,
    /// Requests sent to the inbox and not yet served from it: while any
    /// is, a client sends rather than serves in place, so a client's
    /// requests are served in the order it made them (`in_place.rs`).
    /// Wake-ups do not count: they carry no client's request, and the
    /// control traffic they are sent for is drained by every turn.
    pub(crate) queued: AtomicU64,
    /// [`stamp`](Self::stamp) when the stream last gave back all it could
    /// (`u64::MAX`: never): until it serves a request or its clients
    /// release bytes, a round cannot win anything more from it.
    gave_back_at: AtomicU64,
}

/// Add `by` to a counter only the stream's actor writes: a load and a
/// store, no read-modify-write (readers only ever see whole values).
pub(crate) fn bump(counter: &AtomicU64, by: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

impl StreamShared {
    pub(crate) fn new(stream: StreamId, live: Arc<LiveMeter>) -> Self {
        Self {
            stream,
            live,
            state: AtomicU64::new(RUNNING),
            failure: Mutex::new(None),
            exited: AtomicBool::new(false),
            leftovers: Mutex::new(None),
            requests: AtomicU64::new(0),
            reservations: AtomicU64::new(0),
            bytes_reserved: AtomicU64::new(0),
            peak_bytes_reserved: AtomicU64::new(0),
            bytes_in_reclaim: AtomicU64::new(0),
            relocated: AtomicU64::new(0),
            idle_cleanups: AtomicU64::new(0),
            settles: AtomicU64::new(0),
            served_in_place: AtomicU64::new(0),
            lent: AtomicU64::new(0),
            borrowed: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            gave_back_at: AtomicU64::new(u64::MAX),
            hot: HotCaches::default(),
            hot_taken_back: AtomicU64::new(0),
        }
    }

    /// How other streams name this stream's device stream when its work
    /// uses their memory: `named`, its storage's own (a CUDA stream), or
    /// else its id (a storage that models its device takes any).
    pub(crate) fn user_stream(&self, named: Option<UserStream>) -> UserStream {
        named.unwrap_or(UserStream(u64::from(self.stream.0)))
    }

    /// The bytes the stream holds beyond what its clients hold: what it
    /// could give back at most (exact: releases count as they happen).
    pub(crate) fn unused_at_most(&self) -> u64 {
        if self.gave_back_at.load(Ordering::Acquire) == self.stamp() {
            // What it holds beyond its clients' bytes is the fragmentation
            // its last give-back (cleanup and compaction) could not undo.
            return 0;
        }
        self.bytes_reserved
            .load(Ordering::Acquire)
            .saturating_sub(self.live.live())
    }

    /// Changes whenever the stream serves a request or its clients give
    /// anything back (each only grows, so their sum does too).
    fn stamp(&self) -> u64 {
        self.requests
            .load(Ordering::Acquire)
            .wrapping_add(self.live.returns())
    }

    /// The stream just gave back all a round can win from it.
    pub(crate) fn gave_back_all(&self) {
        self.gave_back_at.store(self.stamp(), Ordering::Release);
    }

    /// Bytes the stream's clients hold now.
    pub(crate) fn bytes_in_use(&self) -> u64 {
        self.live.live()
    }

    /// Changes whenever its clients give anything back (only grows).
    pub(crate) fn returns(&self) -> u64 {
        self.live.returns()
    }

    pub(crate) fn is_running(&self) -> bool {
        self.state.load(Ordering::Acquire) == RUNNING
    }

    /// A turn on the actor panicked (`actor::guarded`).
    pub(crate) fn has_failed(&self) -> bool {
        self.state.load(Ordering::Acquire) == FAILED
    }

    pub(crate) fn set_stopping(&self) {
        let _ = self
            .state
            .compare_exchange(RUNNING, STOPPING, Ordering::AcqRel, Ordering::Acquire);
    }

    pub(crate) fn set_stopped(&self) {
        let _ = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                (state != FAILED).then_some(STOPPED)
            });
    }

    /// What a request to a stream no longer running is refused with.
    pub(crate) fn refusal(&self) -> ServiceError {
        match self.state() {
            StreamState::Failed(message) => ServiceError::StreamFailed {
                stream: self.stream,
                message,
            },
            _ => ServiceError::StreamStopped(self.stream),
        }
    }

    pub(crate) fn set_failed(&self, message: String) {
        *self.failure.lock() = Some(message);
        self.state.store(FAILED, Ordering::Release);
    }

    /// The actor leaves: it says so first, then refuses what waits in its
    /// inbox and hands the inbox over (see `leftovers`), under the lock a
    /// caller refusing leftovers takes. A caller checks the flag after its
    /// send (both sides `SeqCst`: a store then a load on each side, so at
    /// least one of them sees the other): either the flag was not yet set
    /// and this drain finds the request, or the caller sees the flag and
    /// refuses what is left itself.
    pub(crate) fn set_exited(&self, inbox: Box<dyn Refuse>, refusal: &ServiceError) {
        self.exited.store(true, Ordering::SeqCst);
        let mut leftovers = self.leftovers.lock();
        inbox.refuse_all(refusal);
        *leftovers = Some(inbox);
    }

    /// Refuse every request left in the inbox of an actor that left.
    pub(crate) fn refuse_leftovers(&self, error: &ServiceError) {
        if let Some(inbox) = self.leftovers.lock().as_ref() {
            inbox.refuse_all(error);
        }
    }

    pub(crate) fn has_exited(&self) -> bool {
        self.exited.load(Ordering::SeqCst)
    }

    pub(crate) fn state(&self) -> StreamState {
        match self.state.load(Ordering::Acquire) {
            RUNNING => StreamState::Running,
            STOPPING => StreamState::Stopping,
            STOPPED => StreamState::Stopped,
            _ => StreamState::Failed(
                self.failure
                    .lock()
                    .clone()
                    .unwrap_or_else(|| "panicked".into()),
            ),
        }
    }

    pub(crate) fn stats(&self) -> StreamStats {
        let (hot_hits, hot_misses) = self.hot.counts();
        StreamStats {
            stream: self.stream,
            state: self.state(),
            requests: self.requests.load(Ordering::Relaxed),
            reservations: self.reservations.load(Ordering::Relaxed),
            bytes_in_use: self.bytes_in_use(),
            bytes_reserved: self.bytes_reserved.load(Ordering::Relaxed),
            peak_bytes_reserved: self.peak_bytes_reserved.load(Ordering::Relaxed),
            relocated: self.relocated.load(Ordering::Relaxed),
            idle_cleanups: self.idle_cleanups.load(Ordering::Relaxed),
            settles: self.settles.load(Ordering::Relaxed),
            hot_hits,
            hot_misses,
            hot_taken_back: self.hot_taken_back.load(Ordering::Relaxed),
            served_in_place: self.served_in_place.load(Ordering::Relaxed),
            lent: self.lent.load(Ordering::Relaxed),
            borrowed: self.borrowed.load(Ordering::Relaxed),
        }
    }
}
