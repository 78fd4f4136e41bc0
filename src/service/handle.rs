//! `StreamHandle`: what a client holds to talk to a stream.
//!
//! Each method builds a request and waits for the answer, blocking
//! (`reserve`) or as a future (`reserve_async`, usable from tokio without
//! blocking a worker). A blocking call whose stream has nothing queued is
//! served in place, on the caller's thread in the actor's turn
//! (`in_place.rs`); otherwise, and for every async call, the request goes
//! on the stream's bounded inbox to the actor's thread. Two things need no round
//! trip: dropping an allocation (the release queue) and resolving one
//! ([`StreamHandle::resolve`] pins the address the allocation publishes).
//!
//! Each clone is one client: allocation windows opened on a clone
//! ([`StreamHandle::window`]) apply to the reserves made through that clone
//! only, and each reserve carries its caller's mode to the actor.

use super::error::ServiceError;
use super::hot::{AHEAD_WHEN_LEFT, HotCache};
use super::message::{ActorTurn, Job, Pending, Request, job};
use super::protocol::{Allocations, Answer, Reply, ShutdownReport, Sizes};
use super::shared::{StreamShared, StreamState, StreamStats};
use crate::memory::{
    Allocation, AllocationCell, AllocationMode, PageUpdate, Pinned, PinnedRef, StreamId,
};
use crate::storage::Resource;
use crate::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use crate::sync::channel::{Sender, TrySendError};
use crate::sync::reply::{AdaptiveSpin, ReplyCell};
use crate::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a caller waiting for an answer looks whether the actor left.
const EXIT_POLL: Duration = Duration::from_millis(10);

/// Where a just-pinned allocation's bytes are, as its cell publishes them;
/// address 0 when the actor must be asked. Under the pin no move can start,
/// and a move that ended before the pin published its new address first
/// (the handshake of `docs/service.md`, "Resolve").
fn published(cell: &AllocationCell) -> Resource {
    let addr = cell.addr.load(Ordering::SeqCst);
    let len = if addr == 0 {
        0
    } else {
        cell.len.load(Ordering::Acquire)
    };
    Resource { addr, len }
}

/// The actor's half of `resolve`: pin under its exclusive access.
fn pin_on_actor(
    allocation: Allocation,
) -> impl FnOnce(&mut dyn ActorTurn) -> Result<Pinned, ServiceError> + Send + 'static {
    move |actor: &mut dyn ActorTurn| Ok(actor.memory().pin(&allocation)?)
}

/// The one allocation of a single-size reservation.
fn one(batch: Result<Allocations, ServiceError>) -> Result<Allocation, ServiceError> {
    batch.map(|mut batch| batch.pop().expect("one size, one allocation"))
}

/// What every clone of a handle shares.
#[derive(Debug)]
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
}

/// A stream's actor as a client serving its own request sees it
/// (`in_place.rs`): it serves the request in the actor's turn, or hands it
/// back to be sent.
pub(crate) trait ServeInPlace: Send + Sync + std::fmt::Debug {
    /// Serve `request` on this thread, or hand it back.
    fn serve_in_place(&self, request: Request, connection: &Connection) -> Result<(), Request>;
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

/// A client's handle to one stream: `Clone + Send + Sync`.
#[derive(Debug)]
pub struct StreamHandle {
    /// Shared by every clone.
    pub(crate) connection: Arc<Connection>,
    /// This client's open windows, innermost last: (token, mode).
    windows: Mutex<Vec<(u64, AllocationMode)>>,
    /// How many are open: a reserve outside every window reads this, not
    /// the lock.
    open_windows: AtomicU64,
    /// This client's hot allocations (`hot.rs`), listed on the stream.
    hot: Arc<HotCache>,
    /// The next window token.
    next_window: AtomicU64,
    /// The reply cell for reservations, kept for the next call: a fresh
    /// cell per call is a heap block that the actor's thread would often
    /// free, and cross-thread frees are what a busy client pays most for in
    /// glibc's allocator.
    replies: ReplySlot,
}

/// A reservation's answer.
type Batch = Result<Allocations, ServiceError>;
/// One kept reply cell, taken and put back without a lock: a swap to take
/// it (a second concurrent call on the same clone finds the slot empty and
/// makes a cell of its own), a CAS from null to put it back (the loser's box
/// is dropped). The box is reused, so keeping costs no allocation after the
/// first call.
#[derive(Debug, Default)]
struct ReplySlot(AtomicPtr<ReplyCell<Batch>>);

impl ReplySlot {
    fn take(&self) -> Option<Box<ReplyCell<Batch>>> {
        let raw = self.0.swap(std::ptr::null_mut(), Ordering::Acquire);
        // SAFETY: a non-null slot holds a box `put` leaked, and the swap
        // made this thread its only owner.
        (!raw.is_null()).then(|| unsafe { Box::from_raw(raw) })
    }

    fn put(&self, reply: Box<ReplyCell<Batch>>) {
        let raw = Box::into_raw(reply);
        if self
            .0
            .compare_exchange(
                std::ptr::null_mut(),
                raw,
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_err()
        {
            // SAFETY: `raw` was leaked just above and stored nowhere.
            drop(unsafe { Box::from_raw(raw) });
        }
    }
}

impl Drop for ReplySlot {
    fn drop(&mut self) {
        drop(self.take());
    }
}

impl Clone for StreamHandle {
    /// A new client of the same stream, with no window open.
    fn clone(&self) -> Self {
        Self::new(self.connection.clone())
    }
}

/// An open allocation window: reserves through its handle use its mode
/// until it drops. Windows nest; the innermost open one decides.
#[derive(Debug)]
pub struct ModeWindow<'a> {
    /// The handle it belongs to.
    handle: &'a StreamHandle,
    /// Its token on the handle's stack.
    token: u64,
}

impl Drop for ModeWindow<'_> {
    fn drop(&mut self) {
        let mut windows = self.handle.windows.lock();
        windows.retain(|(token, _)| *token != self.token);
        self.handle
            .open_windows
            .store(windows.len() as u64, Ordering::Release);
    }
}

impl Drop for StreamHandle {
    /// The client is gone: what its hot cache held goes back.
    fn drop(&mut self) {
        self.connection.shared.hot.close(&self.hot);
    }
}

impl StreamHandle {
    pub(crate) fn new(connection: Arc<Connection>) -> Self {
        // Listed only where it may fill: the actor looks at every listed
        // cache before each growth.
        let hot = if connection.hot_cache {
            connection.shared.hot.open()
        } else {
            Arc::new(HotCache::new())
        };
        Self {
            connection,
            windows: Mutex::new(Vec::new()),
            open_windows: AtomicU64::new(0),
            hot,
            next_window: AtomicU64::new(0),
            replies: ReplySlot::default(),
        }
    }

    /// This client's hot cache (the loom models fill it).
    #[cfg(streamalloc_loom)]
    pub(crate) fn hot_cache(&self) -> &HotCache {
        &self.hot
    }

    /// The stream.
    pub fn stream(&self) -> StreamId {
        self.connection.shared.stream
    }

    /// The stream's counters, read without a round trip: as the actor
    /// published them after the last request it finished (a reply can come
    /// before its request's counters; once [`report`](Self::report)
    /// returns, they include everything before it).
    pub fn stats(&self) -> StreamStats {
        self.connection.shared.stats()
    }

    /// Open an allocation window on this client (see [`ModeWindow`]).
    pub fn window(&self, mode: AllocationMode) -> ModeWindow<'_> {
        let token = self.next_window.fetch_add(1, Ordering::Relaxed);
        let mut windows = self.windows.lock();
        windows.push((token, mode));
        self.open_windows
            .store(windows.len() as u64, Ordering::Release);
        drop(windows);
        ModeWindow {
            handle: self,
            token,
        }
    }

    /// The mode this client's innermost window puts in force.
    pub fn mode(&self) -> AllocationMode {
        if self.open_windows.load(Ordering::Acquire) == 0 {
            return AllocationMode::Auto;
        }
        self.windows
            .lock()
            .last()
            .map_or(AllocationMode::Auto, |(_, mode)| *mode)
    }

    /// The error for a stream that no longer answers: failed or stopped.
    fn terminal_error(&self) -> ServiceError {
        let shared = &self.connection.shared;
        // The actor sets its final state right after its loop ends; a
        // caller whose request went unanswered (dropped as a panicking
        // actor unwound) can see that first, and waits for the state:
        // yields, then sleeps, since the panic hook may be printing a
        // backtrace meanwhile (tens of milliseconds). Bounded, so a caller
        // never hangs on a state that never comes.
        for attempt in 0..1000 {
            if !shared.is_running() {
                break;
            }
            if attempt < 100 {
                crate::sync::thread::yield_now();
            } else {
                crate::sync::thread::sleep(Duration::from_millis(1));
            }
        }
        match shared.state() {
            StreamState::Failed(message) => ServiceError::StreamFailed {
                stream: shared.stream,
                message,
            },
            _ => ServiceError::StreamStopped(shared.stream),
        }
    }

    /// Send a request and block for its answer.
    pub(crate) fn call<T>(
        &self,
        make: impl FnOnce(Answer<T>) -> Request,
    ) -> Result<T, ServiceError> {
        self.send_and_wait(make, &mut ReplyCell::new())
            .unwrap_or_else(|| Err(self.terminal_error()))
    }

    /// [`call`](Self::call) for a reservation, on the reply cell kept from
    /// an earlier call when there is one.
    fn call_reserve(&self, make: impl FnOnce(Answer<Allocations>) -> Request) -> Batch {
        let mut cell = self.replies.take().unwrap_or_default();
        let answer = self.send_and_wait(make, &mut cell);
        self.replies.put(cell);
        answer.unwrap_or_else(|| Err(self.terminal_error()))
    }

    /// Send the request `make` builds around a sender of `cell`, and wait
    /// for its answer; `None` when the stream is gone and no answer will
    /// come.
    fn send_and_wait<T>(
        &self,
        make: impl FnOnce(Answer<T>) -> Request,
        cell: &mut ReplyCell<Result<T, ServiceError>>,
    ) -> Option<Result<T, ServiceError>> {
        let mut request = make(Reply::Waiter(cell.reply_to()));
        let shared = &self.connection.shared;
        if let Some(actor) = &self.connection.actor {
            match actor.serve_in_place(request, &self.connection) {
                Ok(()) => return self.wait_for(cell),
                Err(refused) => request = refused,
            }
        }
        if let Err(request) = self.connection.send(request) {
            // The stream is gone: the refused request answers its caller
            // itself (a bind's hands its reservation back that way).
            request.reject(self.terminal_error());
        } else if shared.has_exited() {
            // Sent past the actor's last look: ours is among the leftovers,
            // and refused it answers in the cell (`StreamShared::set_exited`).
            shared.refuse_leftovers(&self.terminal_error());
        }
        self.wait_for(cell)
    }

    /// The answer to the request sent with a sender of `cell`; `None`
    /// when the stream is gone and no answer will come.
    fn wait_for<T>(
        &self,
        cell: &mut ReplyCell<Result<T, ServiceError>>,
    ) -> Option<Result<T, ServiceError>> {
        let shared = &self.connection.shared;
        cell.wait(&self.connection.spin, EXIT_POLL, || {
            // A request that reached the inbox just as the actor left is
            // never answered; the exit flag says so, and refused from the
            // leftovers, ours answers before the wait gives up.
            let gone = shared.has_exited();
            if gone {
                shared.refuse_leftovers(&self.terminal_error());
            }
            gone
        })
    }

    /// Check that `allocation` belongs to this stream before sending it.
    pub(crate) fn own(&self, allocation: &Allocation) -> Result<(), ServiceError> {
        if allocation.cell.owner == self.connection.owner {
            return Ok(());
        }
        Err(ServiceError::WrongStream {
            owner: allocation.cell.stream,
            used_on: self.stream(),
        })
    }

    fn reserve_request(
        &self,
        sizes: Sizes,
        update: PageUpdate,
        wait: Option<Duration>,
    ) -> impl FnOnce(Answer<Allocations>) -> Request {
        self.reserve_request_caching(sizes, update, wait, 0)
    }

    /// [`reserve_request`](Self::reserve_request) whose last `for_cache`
    /// sizes are for this client's hot cache.
    fn reserve_request_caching(
        &self,
        sizes: Sizes,
        update: PageUpdate,
        wait: Option<Duration>,
        for_cache: usize,
    ) -> impl FnOnce(Answer<Allocations>) -> Request {
        let mode = self.mode();
        move |reply| Request::ReserveMany(Pending::new(sizes, update, mode, wait, for_cache, reply))
    }

    /// A clone of `allocation` to send, once it is checked to belong here.
    pub(crate) fn owned(&self, allocation: &Allocation) -> Result<Allocation, ServiceError> {
        self.own(allocation)?;
        Ok(allocation.clone())
    }

    /// The one generic call: run `op` on the actor's thread, against its
    /// manager, and wait for its answer (see `operations.rs`).
    pub(crate) fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut dyn ActorTurn) -> Result<T, ServiceError> + Send + 'static,
    ) -> Result<T, ServiceError> {
        self.call(|reply| job(self.stream(), op, reply))
    }

    /// Reserve `size` bytes in this client's mode. Outside every window,
    /// a size this client asked for lately may be served from its hot
    /// cache, on this thread with no round trip (`hot.rs`).
    pub fn reserve(&self, size: u64) -> Result<Allocation, ServiceError> {
        if !self.connection.hot_cache || self.open_windows.load(Ordering::Acquire) != 0 {
            return self.reserve_with(size, PageUpdate::Allow);
        }
        if let Some((allocation, left)) = self.hot.take(size) {
            if self.is_running() {
                if left <= AHEAD_WHEN_LEFT {
                    self.refill_ahead(size);
                }
                return Ok(allocation);
            }
            // Kept from before the stream stopped: the stream answers.
            drop(allocation);
        }
        self.reserve_missed(size)
    }

    /// A hit left few entries of `size` ([`AHEAD_WHEN_LEFT`]): ask the
    /// actor for more of it, and of every other size running low, without
    /// waiting (at most one such request out per cache), so that the next
    /// reserves of those sizes find some. The actor decides how many
    /// (`StreamActor::refill_hot`); a full inbox or a stopped stream drops
    /// the request, and the next miss refills as before.
    fn refill_ahead(&self, size: u64) {
        if !self.connection.refill_ahead || !self.hot.claim_ahead() {
            return;
        }
        let cache = self.hot.clone();
        let mode = self.mode();
        let request = Request::Run(Job::new(self.stream(), move |actor| {
            if let Ok(actor) = actor {
                actor.refill_hot(&cache, size, mode);
            }
            cache.ahead_done();
        }));
        // Refused, the job runs as refused and clears the claim.
        if self.connection.try_send(request).is_ok() && self.connection.shared.has_exited() {
            self.connection
                .shared
                .refuse_leftovers(&self.terminal_error());
        }
    }

    /// A reserve the hot cache could not serve: one round trip, which for
    /// a size missed lately also reserves a few more for the cache (none
    /// while a refill ahead is out: the two could pass the cache's part).
    fn reserve_missed(&self, size: u64) -> Result<Allocation, ServiceError> {
        let extra = if self.hot.missed(size) && !self.hot.ahead_out() {
            let shared = &self.connection.shared;
            let reserved = shared.bytes_reserved.load(Ordering::Acquire);
            self.hot
                .refill(size, reserved, shared.hot.refilling(&self.hot))
        } else {
            0
        };
        if extra == 0 {
            return self.reserve_with(size, PageUpdate::Allow);
        }
        let sizes: Sizes = std::iter::repeat_n(size, extra.saturating_add(1)).collect();
        let request = self.reserve_request_caching(sizes, PageUpdate::Allow, None, extra);
        match self.call_reserve(request) {
            Ok(mut batch) => {
                let first = batch.remove(0);
                for more in batch {
                    // Full (another thread of this clone filled it): back.
                    drop(self.hot.offer(more));
                }
                Ok(first)
            }
            // The extras asked too much of a short device: the one alone.
            Err(ServiceError::OutOfMemory(_)) => self.reserve_with(size, PageUpdate::Allow),
            Err(err) => Err(err),
        }
    }

    /// Reserve `size` bytes, changing pages only as far as `update` allows.
    pub fn reserve_with(&self, size: u64, update: PageUpdate) -> Result<Allocation, ServiceError> {
        one(self.call_reserve(self.reserve_request(smallvec::smallvec![size], update, None)))
    }

    /// Reserve `size` bytes, waiting up to `wait` for memory when the device
    /// is short (other streams' releases and cleanups are retried until
    /// then); `ServiceError::OutOfMemory` after that.
    pub fn reserve_timeout(&self, size: u64, wait: Duration) -> Result<Allocation, ServiceError> {
        one(self.call_reserve(self.reserve_request(
            smallvec::smallvec![size],
            PageUpdate::Allow,
            Some(wait),
        )))
    }

    /// Whether the stream is serving requests.
    pub(crate) fn is_running(&self) -> bool {
        self.connection.shared.is_running()
    }

    /// Whether the stream holds pages beyond its clients' bytes (exact:
    /// `StreamShared::unused_at_most`).
    pub(crate) fn may_give_back(&self) -> bool {
        self.connection.shared.unused_at_most() > 0
    }

    /// Wait until the actor has served everything sent before, its control
    /// traffic included, without counting as a request of its clients.
    pub(crate) fn barrier(&self) -> Result<(), ServiceError> {
        self.call(|reply| Request::Barrier { reply })
    }

    /// Reserve a batch in one round trip: all of them, or none and the error.
    pub fn reserve_many(&self, sizes: &[u64]) -> Result<Vec<Allocation>, ServiceError> {
        self.call_reserve(self.reserve_request(Sizes::from_slice(sizes), PageUpdate::Allow, None))
            .map(Allocations::into_vec)
    }

    /// Pin `allocation` and return its address, valid while the [`Pinned`]
    /// lives. Without a round trip when the allocation's address is
    /// published and no move is under way; otherwise the actor answers.
    pub fn resolve(&self, allocation: &Allocation) -> Result<Pinned, ServiceError> {
        match self.try_resolve(allocation)? {
            Some(pinned) => Ok(pinned),
            None => self.run(pin_on_actor(allocation.clone())),
        }
    }

    /// The lock-free half of [`resolve`](Self::resolve): `None` when the
    /// actor must be asked.
    pub fn try_resolve(&self, allocation: &Allocation) -> Result<Option<Pinned>, ServiceError> {
        self.own(allocation)?;
        let cell = &allocation.cell;
        if !Pinned::try_pin(cell) {
            return Ok(None);
        }
        let resource = published(cell);
        // Dropped unpublished, the pin is released (and a release that every
        // handle's going skipped meanwhile is queued again).
        let pinned = Pinned::new(Arc::clone(cell), resource);
        Ok((resource.addr != 0).then_some(pinned))
    }

    /// [`try_resolve`](Self::try_resolve) with a pin borrowed from
    /// `allocation` (a [`PinnedRef`] cannot outlive it): the cheapest way to
    /// the address, one CAS to pin and one decrement to unpin. `None` when
    /// the actor must be asked ([`resolve`](Self::resolve) then).
    pub fn try_resolve_ref<'a>(
        &self,
        allocation: &'a Allocation,
    ) -> Result<Option<PinnedRef<'a>>, ServiceError> {
        self.own(allocation)?;
        let cell = &**allocation.cell;
        if !Pinned::try_pin(cell) {
            return Ok(None);
        }
        let resource = published(cell);
        let pinned = PinnedRef::new(cell, resource);
        Ok((resource.addr != 0).then_some(pinned))
    }

    /// Ask the stream to shut down without waiting for its answer (what a
    /// cancelled awaitable shutdown leaves behind).
    #[cfg(not(streamalloc_loom))]
    pub(crate) fn shutdown_detached(&self) {
        let (tx, _rx) = crate::sync::channel::bounded(1);
        let _ = self.connection.send(Request::Shutdown {
            reply: Reply::Channel(tx),
        });
    }

    /// Shut the stream down: queued requests are refused, pins get a
    /// bounded wait, every page is returned. Later calls answer
    /// `StreamStopped`.
    pub fn shutdown(&self) -> Result<ShutdownReport, ServiceError> {
        self.call(|reply| Request::Shutdown { reply })
    }
}

#[cfg(not(streamalloc_loom))]
mod nonblocking {
    //! The async forms: the same requests, answered on a flume channel the
    //! caller awaits. Cancel-safe: a future dropped after its request went
    //! out drops the answer when it comes, which releases what it held.

    use super::*;

    /// Yields once to the executor (used while the inbox is full).
    struct YieldNow(bool);

    impl std::future::Future for YieldNow {
        type Output = ();
        fn poll(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<()> {
            if self.0 {
                return std::task::Poll::Ready(());
            }
            self.0 = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    }

    impl StreamHandle {
        pub(crate) async fn call_async<T>(
            &self,
            make: impl FnOnce(Answer<T>) -> Request,
        ) -> Result<T, ServiceError> {
            let (tx, rx) = crate::sync::async_channel::bounded(1);
            let mut request = make(Reply::Async(tx));
            loop {
                let shared = &self.connection.shared;
                match self.connection.try_send(request) {
                    Ok(()) => {
                        if shared.has_exited() {
                            // As in `send_and_wait`: refused, ours answers.
                            shared.refuse_leftovers(&self.terminal_error());
                        }
                        break;
                    }
                    Err(TrySendError::Full(back)) => {
                        if shared.has_exited() {
                            // Nobody serves this inbox: refused here.
                            back.reject(self.terminal_error());
                            break;
                        }
                        request = back;
                        YieldNow(false).await;
                    }
                    Err(TrySendError::Disconnected(back)) => {
                        back.reject(self.terminal_error());
                        break;
                    }
                }
            }
            match rx.recv_async().await {
                Ok(answer) => answer,
                Err(_) => Err(self.terminal_error()),
            }
        }

        /// [`run`](Self::run), awaited.
        pub(crate) async fn run_async<T: Send + 'static>(
            &self,
            op: impl FnOnce(&mut dyn ActorTurn) -> Result<T, ServiceError> + Send + 'static,
        ) -> Result<T, ServiceError> {
            self.call_async(|reply| job(self.stream(), op, reply)).await
        }

        /// [`reserve`](Self::reserve), awaited.
        pub async fn reserve_async(&self, size: u64) -> Result<Allocation, ServiceError> {
            one(self
                .call_async(self.reserve_request(
                    smallvec::smallvec![size],
                    PageUpdate::Allow,
                    None,
                ))
                .await)
        }

        /// [`reserve_timeout`](Self::reserve_timeout), awaited. Cancel-safe:
        /// an allocation served after the future was dropped is released.
        pub async fn reserve_timeout_async(
            &self,
            size: u64,
            wait: Duration,
        ) -> Result<Allocation, ServiceError> {
            let request =
                self.reserve_request(smallvec::smallvec![size], PageUpdate::Allow, Some(wait));
            one(self.call_async(request).await)
        }

        /// [`reserve_many`](Self::reserve_many), awaited.
        pub async fn reserve_many_async(
            &self,
            sizes: &[u64],
        ) -> Result<Vec<Allocation>, ServiceError> {
            let request = self.reserve_request(Sizes::from_slice(sizes), PageUpdate::Allow, None);
            self.call_async(request).await.map(Allocations::into_vec)
        }

        /// [`resolve`](Self::resolve), awaited when the actor must answer.
        pub async fn resolve_async(&self, allocation: &Allocation) -> Result<Pinned, ServiceError> {
            match self.try_resolve(allocation)? {
                Some(pinned) => Ok(pinned),
                None => self.run_async(pin_on_actor(allocation.clone())).await,
            }
        }

        /// [`reserve_with`](Self::reserve_with), awaited.
        pub async fn reserve_with_async(
            &self,
            size: u64,
            update: PageUpdate,
        ) -> Result<Allocation, ServiceError> {
            one(self
                .call_async(self.reserve_request(smallvec::smallvec![size], update, None))
                .await)
        }

        /// [`shutdown`](Self::shutdown), awaited.
        pub async fn shutdown_async(&self) -> Result<ShutdownReport, ServiceError> {
            self.call_async(|reply| Request::Shutdown { reply }).await
        }
    }
}
