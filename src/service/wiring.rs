//! The one function that puts a stream together: its manager, actor,
//! handle and registry entry, for `Supervisor::stream` and the loom models
//! alike.

use super::actor::SharedActor;
use super::actor::{ActorTiming, StreamActor};
use super::device::DeviceShared;
use super::handle::{Connection, ServeInPlace, StreamHandle};
use super::message::Request;
use super::registry::StreamEntry;
use super::shared::StreamShared;
use crate::memory::{LiveMeter, MemoryConfig, MemoryManager, StreamId};
use crate::storage::{BudgetedStorage, DeviceStorage};
use crate::sync::Arc;
use crate::sync::channel::{self, Receiver};
use crate::trace::TraceRecorder;

/// How a wired stream runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wiring {
    /// The actor's timing.
    pub(crate) timing: ActorTiming,
    /// Requests the inbox holds before senders wait.
    pub(crate) inbox_capacity: usize,
    /// Whether client handles keep hot caches (`hot.rs`).
    pub(crate) hot_cache: bool,
    /// Whether a hit that leaves a size running low asks for more without
    /// waiting (`hot.rs`, "refill ahead"); off on a manual clock, where a
    /// replay's figures must not depend on when the actor got to it.
    pub(crate) refill_ahead: bool,
    /// Whether a client serves its own request when the actor is free
    /// (`in_place.rs`).
    pub(crate) serve_in_place: bool,
    /// Whether what the timers send (settle, compact, idle) wakes the
    /// actor at once. Off on a manual clock: there `Supervisor::tick`
    /// follows the timers with a barrier on each stream in turn, which
    /// serves what they were told one stream after another; woken, the
    /// actors would serve it on their own threads at once, and a device
    /// peak that one stream's move (a map) and another's give-back (an
    /// unmap) make together would depend on which thread ran first.
    pub(crate) wake_for_timers: bool,
}

/// Put stream `id` together on `device`: its manager over `storage`
/// (metered by the device, and limited by its budget), its actor with its
/// inbox, and its entry (handle and control channel; no thread yet). The
/// caller runs the actor (`in_place::run(seat, inbox)`, on a thread of its
/// own) and registers the entry.
pub(crate) fn wire(
    device: &Arc<DeviceShared>,
    id: StreamId,
    storage: Box<dyn DeviceStorage>,
    memory: MemoryConfig,
    recorder: Option<&Arc<TraceRecorder>>,
    wiring: Wiring,
) -> (Arc<SharedActor>, Receiver<Request>, StreamEntry) {
    let storage: Box<dyn DeviceStorage> =
        Box::new(BudgetedStorage::new(storage, device.meter.clone()));
    let live = Arc::new(LiveMeter::new(device.live.clone()));
    let mut memory = MemoryManager::metered(storage, memory, id, Some(live.clone()));
    if let Some(recorder) = recorder {
        memory.set_observer(TraceRecorder::observer(recorder));
    }
    let shared = Arc::new(StreamShared::new(id, live));
    let owner = memory.owner_id();
    let (inbox_tx, inbox) = channel::bounded(wiring.inbox_capacity.max(1));
    let (control, control_rx) = channel::unbounded();
    let actor = StreamActor::new(
        memory,
        shared.clone(),
        wiring.timing,
        device.clone(),
        control_rx,
    );
    let seat = Arc::new(SharedActor::new(Some(actor)));
    let connection = Arc::new(Connection {
        inbox: inbox_tx,
        shared: shared.clone(),
        owner,
        spin: crate::sync::reply::AdaptiveSpin::new(wiring.timing.spin),
        // A recorded trace must show each reservation when its client made
        // it: a cache's spares are reserved ahead of their hits.
        hot_cache: wiring.hot_cache && recorder.is_none(),
        // Serving in place, a miss costs a lock; a refill ahead queued for
        // the thread would send the next miss on a round trip behind it.
        refill_ahead: wiring.refill_ahead && !wiring.serve_in_place,
        actor: wiring
            .serve_in_place
            .then(|| Box::new(seat.clone()) as Box<dyn ServeInPlace>),
        device: device.clone(),
    });
    let entry = StreamEntry {
        handle: StreamHandle::new(connection),
        control,
        lender: Box::new(seat.clone()),
        thread: None,
        wake_for_timers: wiring.wake_for_timers,
    };
    (seat, inbox, entry)
}
