//! `StreamActor`: the owner of one stream's `MemoryManager`, and `run`,
//! the loop of the stream's thread.
//!
//! The long form: `docs/modules.md`, "`src/service/actor/mod.rs`".

mod control;
mod reserve;
mod short;
mod stream;
mod turn;

use reserve::Served;
use short::RunningShort;
use stream::Stream;
pub(crate) use turn::{SharedActor, guarded};

use super::device::{DeviceShared, Notice};
use super::error::ServiceError;
use super::events::SupervisorEvent;
use super::hot::HotCache;
use super::message::{ActorTurn, LendJob, Pending, Request};
use super::protocol::{Allocations, Control, ShutdownReport};
use super::shared::StreamShared;
use crate::memory::{AllocationMode, MemoryManager};
use crate::storage::DeviceStorage;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use crate::sync::channel::Receiver;
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

/// The owner of one stream's pools: the stream its policies work on, the
/// state of running short, and the coordinator's control traffic.
pub(crate) struct StreamActor {
    /// The pools and the shared state the policies read and publish.
    stream: Stream,
    /// Reservations parked for memory and the round asked for.
    short: RunningShort,
    /// Timing.
    timing: ActorTiming,
    /// Control traffic from the coordinator.
    control: Receiver<Control>,
}

impl std::fmt::Debug for StreamActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamActor")
            .field("stream", &self.stream.shared.stream)
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
        memory.set_cache_share(super::hot::HOT_SHARE);
        // Alone until the registry says otherwise (after its first growth):
        // its first maps are cut as a lone stream's.
        let handle_cut = device.handle_cut(true);
        if handle_cut != crate::storage::HandleCut::default() {
            memory.storage().set_handle_cut(handle_cut);
        }
        Self {
            stream: Stream {
                memory,
                shared,
                device,
                handle_cut,
            },
            short: RunningShort::default(),
            timing,
            control,
        }
    }

    /// Serve whatever control traffic is waiting (every turn does, before
    /// and after its request: a look first, as there rarely is any).
    pub(crate) fn drain_control(&mut self) {
        if self.control.is_empty() {
            return;
        }
        while let Ok(control) = self.control.try_recv() {
            self.handle_control(control);
        }
    }

    /// Serve one request taken off the inbox in this turn. It no longer
    /// counts as queued: no other turn comes between, so a client serving
    /// in place next is served after it. (A wake-up never counted.)
    pub(crate) fn handle(&mut self, request: Request, inbox: &Receiver<Request>) -> Flow {
        if !matches!(request, Request::Wake) {
            self.stream.shared.queued.fetch_sub(1, Ordering::Relaxed);
        }
        if let Request::Shutdown { reply } = request {
            super::shared::bump(&self.stream.shared.requests, 1);
            let report = self.shutdown(inbox);
            reply.send(Ok(report));
            return Flow::Stop;
        }
        self.serve(request);
        Flow::Continue
    }

    /// Serve any request but a shutdown (which needs the inbox and ends
    /// the loop: `handle`), on the actor's thread or in place.
    pub(crate) fn serve(&mut self, request: Request) {
        if !matches!(request, Request::Wake | Request::Barrier { .. }) {
            super::shared::bump(&self.stream.shared.requests, 1);
        }
        match request {
            Request::ReserveMany(mut pending) => {
                pending.start(|| self.stream.now());
                self.short.serve_reserve(&mut self.stream, pending);
            }
            Request::Run(job) => job.run(Ok(self)),
            Request::Shutdown { .. } => unreachable!("a shutdown is served by `handle`"),
            Request::Wake => {}
            Request::Barrier { reply } => reply.send(Ok(())),
        }
        self.stream.publish();
    }

    /// Stop: refuse what is queued, wait a bounded time for pins, return
    /// every page.
    pub(crate) fn shutdown(&mut self, inbox: &Receiver<Request>) -> ShutdownReport {
        self.stream.shared.set_stopping();
        let stream = self.stream.shared.stream;
        let mut rejected: u64 = 0;
        for pending in self.short.take_parked() {
            rejected = rejected.saturating_add(1);
            pending.answer(Err(ServiceError::StreamStopped(stream)));
        }
        while let Ok(request) = inbox.try_recv() {
            rejected = rejected.saturating_add(1);
            request.reject(ServiceError::StreamStopped(stream));
        }
        self.stream.take_back_hot();
        self.wait_for_pins();
        let pinned_at_exit = self.stream.memory.pinned_count();
        self.stream.memory.process_releases();
        let lent_at_exit = self.stream.memory.lent_out();
        // Pages under a pin that outlived the wait stay until it drops
        // (`run` hands them to the pins as the thread ends).
        self.stream.memory.release_unpinned();
        let bytes_left = self.stream.memory.bytes_allocated();
        self.stream.publish();
        self.stream.shared.set_stopped();
        ShutdownReport {
            stream,
            rejected,
            pinned_at_exit,
            lent_at_exit,
            bytes_left,
        }
    }

    /// Wait up to `pin_wait` on the service's clock for pins to drop, and
    /// for the clients of other streams to drop what this one lent them. A
    /// manual clock does not move while the actor waits (nor does time
    /// under loom): one look, then on.
    fn wait_for_pins(&mut self) {
        if self.stream.device.clock.as_manual().is_some() {
            return;
        }
        let deadline = crate::clock::deadline(self.stream.now(), self.timing.pin_wait);
        let held = |memory: &MemoryManager<_>| memory.pinned_count() > 0 || memory.lent_out() > 0;
        while held(&self.stream.memory) && self.stream.now() < deadline {
            crate::sync::thread::sleep(Duration::from_millis(1));
            self.stream.memory.process_releases();
        }
    }

    /// A client's refill ahead (`hot.rs`): spares of `size` and of every
    /// other size `cache` runs low on, as many as its part of the stream
    /// and its free slots allow now, each from the room held or from growth
    /// below the cache ceiling, as a miss's spares; none while the device
    /// is past its headroom or a recovery round is out, or once the cache's
    /// handle has ended.
    pub(crate) fn refill_hot(&mut self, cache: &HotCache, size: u64, mode: AllocationMode) {
        if self.short.round_out() || cache.is_closed() {
            return;
        }
        let caches = self.stream.shared.hot.refilling(cache);
        // Running low now, not when the client sent it: sizes that ran low
        // meanwhile missed without spares of their own (one refill is out).
        for size in cache.running_low(size) {
            let reserved = self.stream.memory.bytes_reserved();
            let count = cache.refill(size, reserved, caches);
            let wanted: smallvec::SmallVec<[u64; 32]> = std::iter::repeat_n(size, count).collect();
            if count == 0 || self.stream.over_headroom_for(&wanted, mode) {
                continue;
            }
            for _ in 0..count {
                let Ok(Some(spare)) = self.stream.memory.reserve_for_cache(size, mode) else {
                    break;
                };
                if let Some(unkept) = cache.offer(spare) {
                    // Filled meanwhile by its client's own refill: back now.
                    drop(unkept);
                    self.stream.memory.process_releases();
                    break;
                }
            }
        }
    }

    /// The stream's end, once its thread left the loop: every page no pin
    /// holds goes back (if every handle dropped), what is queued or parked
    /// is refused (`in_hand` too), the inbox is handed over to late
    /// callers, the supervisor is told, and the pages pins still hold go
    /// with the last pin (a failed stream's too: a pinned address never
    /// dangles).
    pub(crate) fn end(mut self, in_hand: Option<Request>, inbox: Receiver<Request>) {
        let shared = self.stream.shared.clone();
        if shared.is_running() {
            // Every handle dropped: only pins can reach the pages.
            self.stream.memory.release_unpinned();
            self.stream.publish();
        }
        // A failed stream stays failed.
        shared.set_stopped();
        let refusal = shared.refusal();
        let event = match &refusal {
            ServiceError::StreamFailed { stream, message } => SupervisorEvent::StreamFailed {
                stream: *stream,
                message: message.clone(),
            },
            _ => SupervisorEvent::StreamStopped(shared.stream),
        };
        // Refuse what is queued and hand the inbox over: a request sent after
        // that is refused by its own caller (`StreamShared::leftovers`).
        if let Some(request) = in_hand {
            request.reject(refusal.clone());
        }
        for pending in self.short.take_parked() {
            pending.answer(Err(refusal.clone()));
        }
        shared.set_exited(Box::new(inbox), &refusal);
        self.stream.device.notify(Notice::Event(event));
        self.stream.memory.retire();
    }

    /// The requests this turn leaves to be lent (`lending.rs`): whoever
    /// took the turn runs them once it is over.
    pub(crate) fn take_lend_jobs(&mut self) -> Vec<LendJob> {
        self.short.take_lend_jobs()
    }

    /// Answer `pending` with what a lender served (`lending.rs`).
    pub(crate) fn answer_borrowed(&mut self, pending: Pending, lent: Allocations) {
        self.stream.answer_borrowed(pending, lent);
    }

    /// No lender served `pending`: on as it would have gone without
    /// lending (a round, or growth).
    pub(crate) fn go_on_unlent(&mut self, pending: Pending) {
        if self.short.past_own_room(&mut self.stream, pending, false) == Served::Answered {
            self.stream.memory.release_spares();
        }
        self.stream.publish();
    }

    /// Tell the supervisor's subscribers.
    pub(crate) fn tell(&self, event: SupervisorEvent) {
        self.stream.device.tell(event);
    }

    /// What handles and the supervisor read.
    pub(crate) fn shared(&self) -> &Arc<StreamShared> {
        &self.stream.shared
    }

    /// How long its thread spins for a request before it parks.
    pub(crate) fn spin(&self) -> u32 {
        self.timing.spin
    }

    /// Take the clients' hot caches back, as the policies do (a loom
    /// model's step).
    #[cfg(streamalloc_loom)]
    pub(crate) fn take_back_hot(&mut self) {
        self.stream.take_back_hot();
    }

    /// The stream's pools, for a loom model to look at.
    #[cfg(streamalloc_loom)]
    pub(crate) fn manager(&self) -> &MemoryManager<Box<dyn DeviceStorage>> {
        &self.stream.memory
    }

    /// End as the stream's thread does after a shutdown, for a loom
    /// model: return what no pin holds, then hand the manager to the pins.
    #[cfg(streamalloc_loom)]
    pub(crate) fn retire_manager(self) {
        let mut memory = self.stream.memory;
        memory.release_unpinned();
        memory.retire();
    }

    /// Requests parked for memory now.
    pub(crate) fn parked(&self) -> usize {
        self.short.parked()
    }

    /// Whether the thread should poll its parked requests
    /// (`RunningShort::polls_parked`).
    pub(crate) fn polls_parked(&self) -> bool {
        self.short.polls_parked(&self.stream)
    }

    /// Try the parked requests again, between requests (`round_over`: as
    /// at the end of the stream's round).
    pub(crate) fn retry_parked(&mut self, round_over: bool) {
        self.short.retry_parked(&mut self.stream, round_over);
    }
}

impl ActorTurn for StreamActor {
    fn memory(&mut self) -> &mut MemoryManager<Box<dyn DeviceStorage>> {
        &mut self.stream.memory
    }

    fn shared(&self) -> &StreamShared {
        &self.stream.shared
    }

    fn refill_hot(&mut self, cache: &HotCache, size: u64, mode: AllocationMode) {
        StreamActor::refill_hot(self, cache, size, mode);
    }

    fn publish(&mut self) {
        self.stream.publish();
    }
}
