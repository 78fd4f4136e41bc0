//! What every clone of a stream's handle shares: the inbox, the state the
//! actor publishes, and the actor itself for serving in place.

use super::super::device::DeviceShared;
use super::super::message::Request;
use super::super::shared::StreamShared;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use crate::sync::channel::{Sender, TrySendError};
use crate::sync::reply::AdaptiveSpin;

/// What every clone of a handle shares.
pub(crate) struct Connection {
    /// The stream's inbox.
    pub(crate) inbox: Sender<Request>,
    /// State and counters the actor publishes.
    pub(crate) shared: Arc<StreamShared>,
    /// The stream manager's identity (what its allocations carry).
    pub(crate) owner: u64,
    /// How long a caller spins for its answer before it parks, learned
    /// from the recent waits of every clone.
    pub(crate) spin: AdaptiveSpin,
    /// Whether handles keep hot caches.
    pub(crate) hot_cache: bool,
    /// Whether a hit that leaves a size running low asks for more without
    /// waiting.
    pub(crate) refill_ahead: bool,
    /// The stream's actor, for serving requests in place while its thread
    /// has nothing to do (`in_place.rs`); `None`: every request goes to
    /// the thread.
    pub(crate) actor: Option<Box<dyn ServeInPlace>>,
    /// The device, whose registry reaches the stream that lent an
    /// allocation to this one's clients (`StreamHandle::lender_of`). The
    /// registry holds this connection back while the stream is registered;
    /// its removal, or the device's shutdown, breaks that cycle.
    pub(crate) device: Arc<DeviceShared>,
}

/// A stream's actor as a client serving its own request sees it
/// (`in_place.rs`): it serves the request in the actor's turn, or hands it
/// back to be sent.
pub(crate) trait ServeInPlace: Send + Sync + std::fmt::Debug {
    /// Serve `request` on this thread, or hand it back.
    fn serve_in_place(&self, request: Request, connection: &Connection) -> Result<(), Request>;
}

impl std::fmt::Debug for Connection {
    /// Not the device: its registry holds this connection (a cycle).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("stream", &self.shared.stream)
            .field("owner", &self.owner)
            .field("hot_cache", &self.hot_cache)
            .field("refill_ahead", &self.refill_ahead)
            .field("in_place", &self.actor.is_some())
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Send on the inbox, waiting while it is full; counted as queued until
    /// the actor's thread has served it (`StreamShared::queued`).
    pub(crate) fn send(&self, request: Request) -> Result<(), Request> {
        self.counted(|| self.inbox.send(request))
    }

    /// [`send`](Self::send) without waiting: a full inbox refuses.
    pub(crate) fn try_send(&self, request: Request) -> Result<(), TrySendError<Request>> {
        self.counted(|| self.inbox.try_send(request))
    }

    /// Nudge the actor's thread to look at its control channel and its
    /// parked requests, never blocking (a full inbox means it is busy and
    /// looks soon anyway). Not counted as queued: a wake-up carries no
    /// client's request, so a client may serve in place before the thread
    /// gets to it, and that turn drains the control the wake-up is for.
    pub(crate) fn wake(&self) {
        let _ = self.inbox.try_send(Request::Wake);
    }

    /// Count a request as queued from before its send (so the send cannot
    /// be served before it counts), and not at all when the send fails.
    fn counted<E>(&self, send: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let queued = &self.shared.queued;
        queued.fetch_add(1, Ordering::Relaxed);
        send().inspect_err(|_| {
            queued.fetch_sub(1, Ordering::Relaxed);
        })
    }
}
