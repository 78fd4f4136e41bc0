//! Hooks for the loom models in `loom-tests/`: build a stream's real actor
//! and handle without a supervisor, and drive the actor one step at a time
//! from a loom thread. Compiled only under `--cfg streamalloc_loom`.

use super::actor::{ActorTiming, StreamActor};
use super::coordinator::{Coordinator, Links, StreamLink, Subscribers};
use super::device::{DeviceShared, Notice};
use super::error::ServiceError;
use super::handle::{Connection, StreamHandle};
use super::headroom::Headroom;
use super::message::{Allocations, Reply, Request};
use super::shared::StreamShared;
use crate::memory::{
    Allocation, AllocationMode, Cleanup, MemoryConfig, MemoryError, MemoryManager, PageUpdate,
    RelocationError, RelocationReason, RelocationReport, StreamId,
};
use crate::storage::{BudgetedStorage, DeviceBudget, DeviceStorage, VirtualStorage};
use crate::sync::channel::{self, Receiver, Sender};
use crate::sync::{Arc, Mutex};
use std::collections::HashMap;
use std::time::Duration;

/// A stream's actor with its inbox, outside any thread.
#[derive(Debug)]
pub struct ActorUnderTest {
    actor: StreamActor,
    inbox: Receiver<Request>,
}

/// The real handle and actor of one stream over `storage`, with no spinning
/// and no idle tick (time is not modelled).
pub fn stream_on(
    storage: Box<dyn DeviceStorage>,
    config: MemoryConfig,
    inbox_capacity: usize,
) -> (StreamHandle, ActorUnderTest) {
    let stream = StreamId(0);
    let memory = MemoryManager::for_stream(storage, config, stream);
    let shared = Arc::new(StreamShared::new(stream, memory.release_probe()));
    let (tx, rx) = channel::bounded(inbox_capacity);
    let (_control_tx, control_rx) = channel::unbounded();
    let device = Arc::new(DeviceShared::new(None, None, false));
    device.streams.lock().push(shared.clone());
    let connection = Arc::new(Connection {
        inbox: tx,
        shared: shared.clone(),
        owner: memory.owner_id(),
        spin: 0,
    });
    let timing = ActorTiming {
        spin: 0,
        idle_tick: None,
        pin_wait: Duration::ZERO,
    };
    (
        StreamHandle::new(connection),
        ActorUnderTest {
            actor: StreamActor::new(memory, shared, timing, device, control_rx),
            inbox: rx,
        },
    )
}

impl ActorUnderTest {
    /// Receive one request and serve it; `false` once the stream stopped or
    /// every handle is gone.
    pub fn step(&mut self) -> bool {
        match self.inbox.recv() {
            Ok(request) => self.actor.handle(request, &self.inbox) == super::actor::Flow::Continue,
            Err(_) => false,
        }
    }

    /// The actor's whole loop, as its thread runs it.
    pub fn run(self) {
        self.actor.run(self.inbox)
    }

    /// The manager the actor owns (what its own steps call).
    pub fn memory(&mut self) -> &mut MemoryManager<Box<dyn DeviceStorage>> {
        &mut self.actor.memory
    }

    /// Reserve directly on the actor's manager (setup before threads start).
    pub fn reserve(&mut self, size: u64) -> Result<crate::memory::Allocation, MemoryError> {
        self.actor
            .memory
            .reserve(size, crate::memory::PageUpdate::Allow)
    }

    /// End the stream as its thread does after a shutdown: return what no
    /// pin holds, then hand the manager to the pins.
    pub fn retire(mut self) {
        self.actor.memory.release_unpinned();
        let StreamActor { memory, .. } = self.actor;
        memory.retire();
    }

    /// Relocate as the actor's idle tick or a request would.
    pub fn relocate(
        &mut self,
        reason: RelocationReason,
    ) -> Result<RelocationReport, RelocationError> {
        self.actor.memory.relocate(reason)
    }

    /// Publish the counters handles and the coordinator read.
    pub fn publish(&self) {
        self.actor.publish()
    }

    /// Free what clients dropped, then publish the counters.
    pub fn process_and_publish(&mut self) {
        self.actor.memory.process_releases();
        self.actor.publish();
    }

    /// Run a cleanup as a request would.
    pub fn cleanup(&mut self, cleanup: Cleanup) {
        self.actor.memory.cleanup(cleanup)
    }

    /// Bytes the storage holds.
    pub fn bytes_allocated(&self) -> u64 {
        self.actor.memory.bytes_allocated()
    }

    /// Live allocations.
    pub fn live_allocations(&self) -> u64 {
        self.actor.memory.memory_report().usage().number_allocs
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
    /// The device budget.
    pub budget: Arc<DeviceBudget>,
}

/// The real coordinator with its notice channel.
#[derive(Debug)]
pub struct CoordinatorUnderTest {
    coordinator: Coordinator,
    notices: Receiver<Notice>,
}

impl CoordinatorUnderTest {
    /// The coordinator's loop (its tick never fires: time is not modelled).
    pub fn run(self) {
        self.coordinator
            .run(self.notices, Duration::from_secs(3600))
    }
}

/// Stops a [`CoordinatorUnderTest`].
#[derive(Debug)]
pub struct StopSignal(Sender<Notice>);

impl StopSignal {
    /// Ask the coordinator to return.
    pub fn stop(&self) {
        let _ = self.0.send(Notice::Stop);
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
    let budget = Arc::new(DeviceBudget::new(budget));
    let (notices_tx, notices_rx) = channel::unbounded();
    let links: Links = Arc::new(Mutex::new(HashMap::new()));
    let device = Arc::new(
        DeviceShared::new(Some(budget.clone()), Some(notices_tx.clone()), true)
            .with_headroom(headroom),
    );
    let mut out = Vec::new();
    for id in 0..streams {
        let stream = StreamId(id);
        let storage: Box<dyn DeviceStorage> = Box::new(BudgetedStorage::new(
            Box::new(VirtualStorage::new()) as Box<dyn DeviceStorage>,
            budget.clone(),
        ));
        let memory = MemoryManager::for_stream(storage, config.clone(), stream);
        let shared = Arc::new(StreamShared::new(stream, memory.release_probe()));
        device.streams.lock().push(shared.clone());
        let (tx, rx) = channel::bounded(4);
        let (control_tx, control_rx) = channel::unbounded();
        let handle = StreamHandle::new(Arc::new(Connection {
            inbox: tx,
            shared: shared.clone(),
            owner: memory.owner_id(),
            spin: 0,
        }));
        links.lock().insert(
            stream,
            StreamLink {
                control: control_tx,
                handle: handle.clone(),
            },
        );
        let timing = ActorTiming {
            spin: 0,
            idle_tick: None,
            pin_wait: Duration::ZERO,
        };
        let actor = StreamActor::new(memory, shared, timing, device.clone(), control_rx);
        out.push((handle, ActorUnderTest { actor, inbox: rx }));
    }
    let subscribers: Subscribers = Arc::new(Mutex::new(Vec::new()));
    DeviceUnderTest {
        streams: out,
        coordinator: CoordinatorUnderTest {
            coordinator: Coordinator::new(
                links,
                subscribers,
                None,
                Duration::from_secs(3600),
                None,
            ),
            notices: notices_rx,
        },
        stop: StopSignal(notices_tx),
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
    let request = Request::ReserveMany {
        sizes: sizes.into(),
        update: PageUpdate::Allow,
        mode: AllocationMode::Auto,
        wait: None,
        reply: Reply::Blocking(tx),
    };
    let _ = handle.connection.inbox.send(request);
    PendingAnswer(rx)
}
