//! `StreamActor`: the thread that owns one stream's `MemoryManager`.
//!
//! It takes requests from its inbox one at a time, so the manager needs no
//! lock; releases arrive on the manager's release queue, which never blocks
//! a dropper. `handle` is the step function the loom models drive directly;
//! `run` is the loop around it: a short spin, then a blocking receive (with
//! a short poll only while a parked request waits for a deadline). Time is
//! the service's clock (`clock.rs`): the idle tick comes from the
//! coordinator (`Control::Idle`), never from a receive timing out, and
//! every counter a decision on another thread reads is published before
//! the answer goes out, so a caller that got its answer sees the stream as
//! it left it.

use super::device::{DeviceShared, Notice};
use super::error::ServiceError;
use super::events::SupervisorEvent;
use super::hot::HotCache;
use super::message::{Control, Request, ShutdownReport};
use super::shared::StreamShared;
use super::short::{Pending, PendingState};
use crate::memory::{AllocationMode, MemoryManager, RelocationNeed, RelocationReason};
use crate::storage::DeviceStorage;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use crate::sync::channel::{Receiver, RecvError};
use crate::sync::reply::AdaptiveSpin;
use std::collections::VecDeque;
use std::time::Duration;

/// Whether the loop goes on after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Keep serving.
    Continue,
    /// The stream shut down.
    Stop,
}

/// Timing knobs of an actor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActorTiming {
    /// Most receive attempts before blocking (a request/reply ping-pong is
    /// much faster when the actor has not parked yet).
    pub(crate) spin: u32,
    /// How long shutdown waits for pins to drop (on the service's clock).
    pub(crate) pin_wait: Duration,
}

/// The owner of one stream's pools.
pub(crate) struct StreamActor {
    /// The pools.
    pub(crate) memory: MemoryManager<Box<dyn DeviceStorage>>,
    /// What handles and the supervisor read.
    pub(crate) shared: Arc<StreamShared>,
    /// Timing.
    timing: ActorTiming,
    /// How long the actor spins for its next request before it parks.
    spin: AdaptiveSpin,
    /// What the device's streams share (budget, registry, coordinator).
    pub(crate) device: Arc<DeviceShared>,
    /// Control traffic from the coordinator.
    control: Receiver<Control>,
    /// Reservations waiting for memory, oldest first.
    pub(crate) parked: VecDeque<Pending>,
    /// A `Short` notice is out and its `Retry` has not come.
    pub(crate) short_pending: bool,
    /// When the last `Short` notice went out.
    pub(crate) last_ask: Option<Duration>,
}

/// How often an actor whose parked requests wait for a deadline (or for a
/// round's safety net) looks at the clock again.
const PARK_POLL: Duration = Duration::from_millis(2);

impl std::fmt::Debug for StreamActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamActor")
            .field("stream", &self.shared.stream)
            .finish_non_exhaustive()
    }
}

impl StreamActor {
    pub(crate) fn new(
        mut memory: MemoryManager<Box<dyn DeviceStorage>>,
        shared: Arc<StreamShared>,
        timing: ActorTiming,
        device: Arc<DeviceShared>,
        control: Receiver<Control>,
    ) -> Self {
        let clients = shared.clone();
        memory.set_growth_hook(
            super::hot::HOT_SHARE,
            Box::new(move || {
                let taken = clients.hot.take_back();
                super::shared::bump(&clients.hot_taken_back, taken);
                taken > 0
            }),
        );
        Self {
            memory,
            shared,
            spin: AdaptiveSpin::new(timing.spin),
            timing,
            device,
            control,
            parked: VecDeque::new(),
            short_pending: false,
            last_ask: None,
        }
    }

    /// The service's clock now.
    pub(crate) fn now(&self) -> Duration {
        self.device.clock.now()
    }

    /// Serve whatever control traffic is waiting.
    pub(crate) fn drain_control(&mut self) {
        while let Ok(control) = self.control.try_recv() {
            self.handle_control(control);
        }
    }

    /// Serve one request.
    pub(crate) fn handle(&mut self, request: Request, inbox: &Receiver<Request>) -> Flow {
        if !matches!(request, Request::Wake | Request::Barrier { .. }) {
            super::shared::bump(&self.shared.requests, 1);
        }
        match request {
            Request::ReserveMany {
                sizes,
                update,
                mode,
                wait,
                for_cache,
                reply,
            } => self.serve_reserve(Pending {
                sizes,
                update,
                mode,
                for_cache,
                reply,
                deadline: wait.map(|wait| crate::clock::deadline(self.now(), wait)),
                state: PendingState::Serving,
            }),
            Request::Run(job) => job.run(Ok(self)),
            Request::Shutdown { reply } => {
                let report = self.shutdown(inbox);
                reply.send(Ok(report));
                return Flow::Stop;
            }
            Request::Wake => {}
            Request::Barrier { reply } => reply.send(Ok(())),
        }
        self.publish();
        Flow::Continue
    }

    /// No request for a whole tick: run the cleanup a reservation would,
    /// with the clock moved past every pool's period (an idle stream gives
    /// back what sits unused), and empty outdated pages.
    pub(crate) fn idle_tick(&mut self) {
        self.take_back_hot();
        self.memory.cleanup_idle();
        if self.memory.relocation_need() != RelocationNeed::None
            && let Ok(report) = self.memory.relocate(RelocationReason::Compaction)
        {
            super::shared::bump(&self.shared.relocated, report.moved);
        }
        super::shared::bump(&self.shared.idle_cleanups, 1);
        self.publish();
    }

    /// Stop: refuse what is queued, wait a bounded time for pins, return
    /// every page.
    pub(crate) fn shutdown(&mut self, inbox: &Receiver<Request>) -> ShutdownReport {
        self.shared.set_stopping();
        let stream = self.shared.stream;
        let mut rejected: u64 = 0;
        for pending in std::mem::take(&mut self.parked) {
            rejected = rejected.saturating_add(1);
            pending.answer(Err(ServiceError::StreamStopped(stream)));
        }
        while let Ok(request) = inbox.try_recv() {
            rejected = rejected.saturating_add(1);
            request.reject(ServiceError::StreamStopped(stream));
        }
        self.take_back_hot();
        self.wait_for_pins();
        let pinned_at_exit = self.memory.pinned_count();
        // Pages under a pin that outlived the wait stay until it drops
        // (`run` hands them to the pins as the thread ends).
        self.memory.release_unpinned();
        let bytes_left = self.memory.bytes_allocated();
        self.publish();
        self.shared.set_stopped();
        ShutdownReport {
            stream,
            rejected,
            pinned_at_exit,
            bytes_left,
        }
    }

    /// Wait up to `pin_wait` on the service's clock for pins to drop. A
    /// manual clock does not move while the actor waits (nor does time
    /// under loom): one look, then on.
    fn wait_for_pins(&mut self) {
        if self.device.clock.as_manual().is_some() {
            return;
        }
        let deadline = crate::clock::deadline(self.now(), self.timing.pin_wait);
        while self.memory.pinned_count() > 0 && self.now() < deadline {
            crate::sync::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Take back every allocation the stream's clients keep in their hot
    /// caches (`hot.rs`): swapped out of their slots without their threads,
    /// dropped here, processed as releases at once.
    pub(crate) fn take_back_hot(&mut self) {
        let taken = self.shared.hot.take_back();
        if taken > 0 {
            super::shared::bump(&self.shared.hot_taken_back, taken);
            self.memory.process_releases();
        }
    }

    /// A client's refill ahead (`hot.rs`): spares of `size` and of every
    /// other size `cache` runs low on, as many as its part of the stream
    /// and its free slots allow now, each from the room held or from growth
    /// below the cache ceiling, as a miss's spares; none while the device
    /// is past its headroom or a recovery round is out, or once the cache's
    /// handle has ended.
    pub(crate) fn refill_hot(&mut self, cache: &HotCache, size: u64, mode: AllocationMode) {
        if self.short_pending || cache.is_closed() {
            return;
        }
        let caches = self.shared.hot.refilling(cache);
        // Running low now, not when the client sent it: sizes that ran low
        // meanwhile missed without spares of their own (one refill is out).
        for size in cache.running_low(size) {
            let reserved = self.memory.bytes_reserved();
            let count = cache.refill(size, reserved, caches);
            let wanted: smallvec::SmallVec<[u64; 32]> = std::iter::repeat_n(size, count).collect();
            if count == 0 || self.over_headroom_for(&wanted, mode) {
                continue;
            }
            for _ in 0..count {
                let Ok(Some(spare)) = self.memory.reserve_for_cache(size, mode) else {
                    break;
                };
                if let Some(unkept) = cache.offer(spare) {
                    // Filled meanwhile by its client's own refill: back now.
                    drop(unkept);
                    self.memory.process_releases();
                    break;
                }
            }
        }
    }

    /// Publish what handles and the other streams' decisions read without
    /// a round trip: the pages held (bytes in use are counted as they
    /// change, `memory/live.rs`). The actor is the only writer: plain
    /// stores, and none when nothing changed.
    pub(crate) fn publish(&mut self) {
        let reserved = self.memory.bytes_reserved();
        // Its own last store: what it published is what the counter holds.
        if reserved == self.shared.bytes_reserved.load(Ordering::Relaxed) {
            return;
        }
        self.shared
            .bytes_reserved
            .store(reserved, Ordering::Release);
        if reserved > self.shared.peak_bytes_reserved.load(Ordering::Relaxed) {
            self.shared
                .peak_bytes_reserved
                .store(reserved, Ordering::Relaxed);
        }
    }

    /// The loop: serve until shut down or every handle is gone; a panic
    /// marks the stream failed (its clients get `StreamFailed`, never a hang).
    pub(crate) fn run(mut self, inbox: Receiver<Request>) {
        let shared = self.shared.clone();
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.serve(&inbox);
        }));
        match served {
            Ok(()) => {
                if shared.is_running() {
                    // Every handle dropped: only pins can reach the pages.
                    self.memory.release_unpinned();
                    self.publish();
                }
                shared.set_stopped();
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "the stream actor panicked".into());
                shared.set_failed(message);
            }
        }
        let event = match shared.state() {
            super::shared::StreamState::Failed(message) => SupervisorEvent::StreamFailed {
                stream: shared.stream,
                message,
            },
            _ => SupervisorEvent::StreamStopped(shared.stream),
        };
        // Refuse what is queued and hand the inbox over: a request sent
        // after that is refused by its own caller (`StreamShared::leftovers`).
        let refusal = match shared.state() {
            super::shared::StreamState::Failed(message) => ServiceError::StreamFailed {
                stream: shared.stream,
                message,
            },
            _ => ServiceError::StreamStopped(shared.stream),
        };
        for pending in std::mem::take(&mut self.parked) {
            pending.answer(Err(refusal.clone()));
        }
        shared.set_exited(inbox, &refusal);
        self.device.notify(Notice::Event(event));
        // Last: the pages pins still hold go with the last pin (a failed
        // stream's too: a pinned address never dangles).
        let StreamActor { memory, .. } = self;
        memory.retire();
    }

    fn serve(&mut self, inbox: &Receiver<Request>) {
        while let Some(request) = self.next(inbox) {
            self.drain_control();
            if self.handle(request, inbox) == Flow::Stop {
                return;
            }
            self.drain_control();
        }
    }

    /// The next request, `None` once every sender is gone: a short
    /// adaptive spin (`sync/reply.rs`), then a blocking receive, which
    /// parks the thread until a sender wakes it, so an idle stream costs
    /// no CPU.
    fn next(&mut self, inbox: &Receiver<Request>) -> Option<Request> {
        // Releases are not taken while waiting: which of a client's drops
        // would land before the next request would then be a race, and
        // placement (and so a replay) would differ from run to run. Every
        // request takes them first, all at once.
        let mut received = None;
        self.spin.spin(|| match inbox.try_recv() {
            Ok(request) => {
                received = Some(Some(request));
                true
            }
            Err(RecvError::Disconnected) => {
                received = Some(None);
                true
            }
            Err(RecvError::Empty) => false,
        });
        if let Some(received) = received {
            return received;
        }
        loop {
            self.drain_control();
            let received = if self.polls_parked() {
                inbox.recv_timeout(PARK_POLL)
            } else {
                inbox.recv()
            };
            match received {
                Ok(request) => return Some(request),
                Err(RecvError::Disconnected) => return None,
                Err(RecvError::Empty) => self.retry_parked(false),
            }
        }
    }
}
