//! Hooks for the loom models in `loom-tests/`: build a stream's real actor
//! and handle without a supervisor, and drive the actor one step at a time
//! from a loom thread. Compiled only under `--cfg streamalloc_loom`.

use super::actor::{ActorTiming, StreamActor};
use super::handle::{Connection, StreamHandle};
use super::message::Request;
use super::shared::StreamShared;
use crate::memory::{
    Cleanup, MemoryConfig, MemoryError, MemoryManager, RelocationError, RelocationReason,
    RelocationReport, StreamId,
};
use crate::storage::DeviceStorage;
use crate::sync::Arc;
use crate::sync::channel::{self, Receiver};
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
    let shared = Arc::new(StreamShared::new(stream));
    let (tx, rx) = channel::bounded(inbox_capacity);
    let (_control_tx, control_rx) = channel::unbounded();
    let device = Arc::new(super::device::DeviceShared {
        budget: None,
        streams: crate::sync::Mutex::new(vec![shared.clone()]),
        notices: None,
        recovery: false,
    });
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

    /// Relocate as the actor's idle tick or a request would.
    pub fn relocate(
        &mut self,
        reason: RelocationReason,
    ) -> Result<RelocationReport, RelocationError> {
        self.actor.memory.relocate(reason)
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
