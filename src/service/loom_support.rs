//! Hooks for the loom models in `loom-tests/`: a stream's real actor and
//! handle, made by the Supervisor's own `registry::wire`, without the
//! supervisor's threads, and the actor driven one step at a time from a
//! loom thread. Compiled only under `--cfg streamalloc_loom`.

use super::actor::SharedActor;
use super::actor::{ActorTiming, StreamActor};
use super::coordinator::{Coordinator, CoordinatorSeat, Subscribers, Timers};
use super::device::{DeviceShared, Notice};
use super::error::ServiceError;
use super::events::{Events, SupervisorEvent};
use super::handle::StreamHandle;
use super::headroom::Headroom;
use super::message::{ActorTurn, Pending, Request};
use super::protocol::{Allocations, Reply};
use super::wiring::{Wiring, wire};
use crate::memory::{
    Allocation, AllocationMode, Cleanup, MemoryConfig, MemoryError, MemoryManager, PageUpdate,
    RelocationError, RelocationReason, RelocationReport, StreamId,
};
use crate::storage::{DeviceBudget, DeviceStorage, VirtualStorage};
use crate::sync::channel::{self, Receiver};
use crate::sync::{Arc, Mutex};
use std::time::Duration;

/// A stream's actor with its inbox, outside any thread.
#[derive(Debug)]
pub struct ActorUnderTest {
    seat: Arc<SharedActor>,
    inbox: Receiver<Request>,
}

/// The actor's manager for as long as the model holds the actor's turn.
#[allow(missing_debug_implementations)]
pub struct MemoryTurn<'a>(loom::sync::MutexGuard<'a, Option<StreamActor>>);

impl std::ops::Deref for MemoryTurn<'_> {
    type Target = MemoryManager<Box<dyn DeviceStorage>>;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("the stream has not ended").manager()
    }
}

impl std::ops::DerefMut for MemoryTurn<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        ActorTurn::memory(self.0.as_mut().expect("the stream has not ended"))
    }
}

/// The real handle and actor of one stream over `storage`, with no spinning
/// and no idle tick (time is not modelled); every request goes to the
/// actor's thread.
pub fn stream_on(
    storage: Box<dyn DeviceStorage>,
    config: MemoryConfig,
    inbox_capacity: usize,
) -> (StreamHandle, ActorUnderTest) {
    stream_wired(storage, config, model_wiring(inbox_capacity))
}

/// [`stream_on`] whose clients serve their own requests while the actor is
/// free (`in_place.rs`), as the service's default does.
pub fn stream_serving_in_place(
    storage: Box<dyn DeviceStorage>,
    config: MemoryConfig,
    inbox_capacity: usize,
) -> (StreamHandle, ActorUnderTest) {
    let wiring = Wiring {
        serve_in_place: true,
        ..model_wiring(inbox_capacity)
    };
    stream_wired(storage, config, wiring)
}

fn stream_wired(
    storage: Box<dyn DeviceStorage>,
    config: MemoryConfig,
    wiring: Wiring,
) -> (StreamHandle, ActorUnderTest) {
    let device = Arc::new(DeviceShared::new(None, None, false));
    let (seat, inbox, entry) = wire(&device, StreamId(0), storage, config, None, wiring);
    // A lone actor ends when its handles go: the device keeps no entry.
    (entry.handle, ActorUnderTest { seat, inbox })
}

/// How the models' streams run: no spinning and no idle tick (time is not
/// modelled).
fn model_wiring(inbox_capacity: usize) -> Wiring {
    Wiring {
        timing: ActorTiming {
            spin: 0,
            pin_wait: Duration::ZERO,
        },
        inbox_capacity,
        hot_cache: true,
        refill_ahead: true,
        serve_in_place: false,
        wake_for_timers: true,
    }
}

impl ActorUnderTest {
    /// Run `f` on the actor in a turn of the model's own.
    fn with<R>(&self, f: impl FnOnce(&mut StreamActor) -> R) -> R {
        f(self.seat.turn().as_mut().expect("the stream has not ended"))
    }

    /// Receive one request and serve it in the actor's turn, as its thread
    /// does; `false` once the stream stopped or every handle is gone.
    pub fn step(&mut self) -> bool {
        match self.inbox.recv() {
            Ok(request) => {
                let (flow, jobs) = self.with(|actor| {
                    let flow = actor.handle(request, &self.inbox);
                    (flow, actor.take_lend_jobs())
                });
                super::lending::lend_for(&self.seat, jobs);
                flow == super::actor::Flow::Continue
            }
            Err(_) => false,
        }
    }

    /// The actor's whole loop, as its thread runs it.
    pub fn run(self) {
        super::in_place::run(self.seat, self.inbox)
    }

    /// The manager the actor owns (what its own steps call), for as long
    /// as the returned turn lives.
    pub fn memory(&mut self) -> MemoryTurn<'_> {
        MemoryTurn(self.seat.turn_guard())
    }

    /// Put `count` allocations of `size` bytes, reserved for a hot cache
    /// as a miss's refill reserves them, into `handle`'s cache (setup).
    pub fn fill_hot(&mut self, handle: &StreamHandle, size: u64, count: usize) {
        let mut memory = self.memory();
        for _ in 0..count {
            let allocation = memory
                .reserve_for_cache(size, AllocationMode::Auto)
                .expect("a valid size")
                .unwrap_or_else(|| {
                    // No room held yet: grow for it, then hand it over unmetered.
                    let grown = memory
                        .reserve(size, crate::memory::PageUpdate::Allow)
                        .expect("room");
                    drop(grown);
                    memory.process_releases();
                    memory
                        .reserve_for_cache(size, AllocationMode::Auto)
                        .expect("a valid size")
                        .expect("the room just freed")
                });
            assert!(
                handle.hot_cache().offer(allocation).is_none(),
                "a free slot"
            );
        }
    }

    /// Take every hot cache of the stream back, as the actor does when it
    /// runs short, gives back, settles, idles or shuts down.
    pub fn take_back_hot(&mut self) {
        self.with(StreamActor::take_back_hot)
    }

    /// Allocations the stream's clients were served from their caches, and
    /// those the actor took back from them.
    pub fn hot_counts(&self) -> (u64, u64) {
        let stats = self.with(|actor| actor.shared().stats());
        (stats.hot_hits, stats.hot_taken_back)
    }

    /// Reserve directly on the actor's manager (setup before threads start).
    pub fn reserve(&mut self, size: u64) -> Result<crate::memory::Allocation, MemoryError> {
        self.memory()
            .reserve(size, crate::memory::PageUpdate::Allow)
    }

    /// End the stream as its thread does after a shutdown: return what no
    /// pin holds, then hand the manager to the pins.
    pub fn retire(self) {
        let actor = self.seat.turn().take().expect("the stream has not ended");
        actor.retire_manager();
    }

    /// Relocate as the actor's idle tick or a request would.
    pub fn relocate(
        &mut self,
        reason: RelocationReason,
    ) -> Result<RelocationReport, RelocationError> {
        self.memory().relocate(reason)
    }

    /// Publish the counters handles and the coordinator read.
    pub fn publish(&mut self) {
        self.with(|actor| ActorTurn::publish(actor))
    }

    /// Free what clients dropped, then publish the counters.
    pub fn process_and_publish(&mut self) {
        self.with(|actor| {
            ActorTurn::memory(actor).process_releases();
            ActorTurn::publish(actor);
        })
    }

    /// Run a cleanup as a request would.
    pub fn cleanup(&mut self, cleanup: Cleanup) {
        self.memory().cleanup(cleanup)
    }

    /// Bytes the storage holds.
    pub fn bytes_allocated(&self) -> u64 {
        self.with(|actor| ActorTurn::memory(actor).bytes_allocated())
    }

    /// Live allocations.
    pub fn live_allocations(&self) -> u64 {
        self.with(|actor| {
            ActorTurn::memory(actor)
                .memory_report()
                .usage()
                .number_allocs
        })
    }
}

/// A device of several streams with the real coordinator, outside any thread.
#[derive(Debug)]
pub struct DeviceUnderTest {
    /// Each stream's handle and actor.
    pub streams: Vec<(StreamHandle, ActorUnderTest)>,
    /// The coordinator, to run on its own thread.
    pub coordinator: CoordinatorUnderTest,
    /// Tells the coordinator to stop.
    pub stop: StopSignal,
    /// What the supervisor does with the coordinator: tick, tell, listen.
    pub supervisor: SupervisorSide,
    /// The device budget.
    pub budget: Arc<DeviceBudget>,
}

/// The real coordinator with its notice channel.
#[derive(Debug)]
pub struct CoordinatorUnderTest {
    seat: Arc<CoordinatorSeat>,
    notices: Receiver<Notice>,
}

impl CoordinatorUnderTest {
    /// The coordinator's loop (its own tick never fires: time is not
    /// modelled; [`SupervisorSide::tick`] runs the timers).
    pub fn run(self) {
        super::coordinator::run(self.seat, self.notices, Duration::from_secs(3600))
    }
}

/// The supervisor's side of the coordinator, as `Supervisor` uses it.
#[derive(Debug)]
pub struct SupervisorSide {
    seat: Arc<CoordinatorSeat>,
    device: Arc<DeviceShared>,
    subscribers: Subscribers,
}

impl SupervisorSide {
    /// `Supervisor::tick`'s run of the timers (`CoordinatorSeat::tick`):
    /// in place, or behind the notices sent before.
    pub fn tick(&self) {
        self.seat.tick();
    }

    /// Tell the coordinator that `stream` started, as `Supervisor::stream`
    /// does (a notice it passes on to subscribers).
    pub fn announce(&self, stream: StreamId) {
        self.device
            .notify(Notice::Event(SupervisorEvent::StreamStarted(stream)));
    }

    /// The coordinator's events from now on, as `Supervisor::events`.
    pub fn subscribe(&self) -> Events {
        let (events, received) = Events::channel();
        self.subscribers.lock().push(events);
        received
    }
}

/// Stops a [`CoordinatorUnderTest`] and lets go of the device's streams.
#[derive(Debug)]
pub struct StopSignal {
    device: Arc<DeviceShared>,
}

impl StopSignal {
    /// Ask the coordinator to return, and empty the device's registry (as
    /// `Supervisor::shutdown` drains it): the actors end once their
    /// callers' handles go too.
    pub fn stop(&self) {
        self.device.notify(Notice::Stop);
        drop(std::mem::take(&mut *self.device.registry.lock()));
    }
}

/// `streams` streams on virtual storages sharing a budget of `budget`
/// bytes, with the real coordinator.
pub fn device_on(streams: u32, config: MemoryConfig, budget: u64) -> DeviceUnderTest {
    device_with(streams, config, budget, None)
}

/// [`device_on`], growing under `headroom`.
pub fn device_with(
    streams: u32,
    config: MemoryConfig,
    budget: u64,
    headroom: Option<Headroom>,
) -> DeviceUnderTest {
    device_built(streams, config, budget, headroom, None, false)
}

/// [`device_with`], its streams past the headroom asking the others to
/// serve them from their room first (`ServiceConfig::lend_across_streams`).
pub fn device_lending(
    streams: u32,
    config: MemoryConfig,
    budget: u64,
    headroom: Option<Headroom>,
) -> DeviceUnderTest {
    device_built(streams, config, budget, headroom, None, true)
}

/// [`device_on`], whose coordinator asks a stream to compact at a tick once
/// its reserved bytes pass `threshold` times its bytes in use (and it
/// would win back 4 MiB).
pub fn device_compacting(
    streams: u32,
    config: MemoryConfig,
    budget: u64,
    threshold: f64,
) -> DeviceUnderTest {
    device_built(streams, config, budget, None, Some(threshold), false)
}

fn device_built(
    streams: u32,
    config: MemoryConfig,
    budget: u64,
    headroom: Option<Headroom>,
    compaction_threshold: Option<f64>,
    lends: bool,
) -> DeviceUnderTest {
    let budget = Arc::new(DeviceBudget::new(budget));
    let (notices_tx, notices_rx) = channel::unbounded();
    let device = Arc::new(
        DeviceShared::new(Some(budget.clone()), Some(notices_tx), true)
            .with_headroom(headroom)
            .with_lending(lends),
    );
    let mut out = Vec::new();
    for id in 0..streams {
        let stream = StreamId(id);
        let storage: Box<dyn DeviceStorage> = Box::new(VirtualStorage::new());
        // The device meters (and budgets) the storage, as for the Supervisor.
        let (seat, inbox, entry) = wire(
            &device,
            stream,
            storage,
            config.clone(),
            None,
            model_wiring(4),
        );
        let handle = entry.handle.clone();
        device.registry.lock().insert(stream, entry);
        out.push((handle, ActorUnderTest { seat, inbox }));
    }
    let subscribers: Subscribers = Arc::new(Mutex::new(Vec::new()));
    let seat = Arc::new(CoordinatorSeat::new(Coordinator::new(
        device.clone(),
        subscribers.clone(),
        compaction_threshold,
        Timers {
            clock: device.clock.clone(),
            episode_timeout: Duration::from_secs(3600),
            idle_tick: None,
        },
        None,
    )));
    DeviceUnderTest {
        streams: out,
        coordinator: CoordinatorUnderTest {
            seat: seat.clone(),
            notices: notices_rx,
        },
        stop: StopSignal {
            device: device.clone(),
        },
        supervisor: SupervisorSide {
            seat,
            device,
            subscribers,
        },
        budget,
    }
}

/// The answer to a request sent without waiting.
#[derive(Debug)]
pub struct PendingAnswer(Receiver<Result<Allocations, ServiceError>>);

impl PendingAnswer {
    /// Wait for it.
    pub fn wait(&self) -> Result<Vec<Allocation>, ServiceError> {
        self.0
            .recv()
            .unwrap_or(Err(ServiceError::StreamStopped(StreamId(0))))
            .map(Allocations::into_vec)
    }
}

/// Send a `reserve_many` without waiting for the answer.
pub fn submit_reserve_many(handle: &StreamHandle, sizes: Vec<u64>) -> PendingAnswer {
    let (tx, rx) = channel::bounded(1);
    let (update, mode) = (PageUpdate::Allow, AllocationMode::Auto);
    let reply = Reply::Channel(tx);
    let pending = Pending::new(sizes.into(), update, mode, None, 0, reply);
    let request = Request::ReserveMany(pending);
    let _ = handle.connection.send(request);
    PendingAnswer(rx)
}

/// Shut the stream down from a handle, as the supervisor does
/// (`StreamHandle::shutdown` is the crate's own).
pub fn shut_down(handle: &StreamHandle) -> Result<super::ShutdownReport, ServiceError> {
    handle.shutdown()
}
