//! What a device's streams share: the budget, the registry the
//! out-of-memory breakdown reads, and the way to tell the supervisor's
//! coordinator things (an unbounded channel: telling never blocks).

use super::error::{OutOfMemoryReport, StreamUsage};
use super::events::SupervisorEvent;
use super::headroom::Headroom;
use super::registry::{Registry, StreamEntry};
use crate::clock::{ManualClock, SharedClock};
use crate::memory::{LiveBytes, StreamId};
use crate::saturating::SaturatingSum;
use crate::storage::{DeviceBudget, HandleCut};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::channel::Sender;
use crate::sync::{Arc, Mutex};
use std::collections::BTreeMap;
use std::time::Duration;

/// What actors and the supervisor tell the coordinator.
#[derive(Debug)]
pub(crate) enum Notice {
    /// A stream could not get a page (or would grow past the headroom)
    /// and parked a request.
    Short {
        /// The stream.
        stream: StreamId,
        /// Bytes of the request.
        requested: u64,
        /// Not short but about to grow past the device's headroom: the
        /// bytes the device would hold past it with this request grown
        /// (what the others are asked to give); `None` when short.
        lacks: Option<u64>,
    },
    /// A stream answered a `GiveBack`.
    GaveBack {
        /// The stream.
        stream: StreamId,
        /// The episode it answers.
        episode: u64,
        /// Bytes it returned to the device.
        freed: u64,
    },
    /// Pass on to subscribers.
    Event(SupervisorEvent),
    /// Run the timers now, then say so on `done`: `Supervisor::tick`'s,
    /// sent when a notice before it still waits (else it runs in place).
    Tick {
        /// Told once the tick ran.
        done: Sender<()>,
    },
    /// The supervisor is shutting down.
    Stop,
}

/// Shared by every stream of a device.
#[derive(Debug)]
pub(crate) struct DeviceShared {
    /// The device budget, if one is set.
    pub(crate) budget: Option<Arc<DeviceBudget>>,
    /// Meters the bytes every stream's storage holds (the budget when one
    /// is set, else an unlimited one): exact device totals and peak.
    pub(crate) meter: Arc<DeviceBudget>,
    /// The device's streams (`registry.rs`): the one registry.
    pub(crate) registry: Registry,
    /// To the coordinator; `None` when there is none (a lone actor in tests).
    pub(crate) notices: Option<Sender<Notice>>,
    /// Notices sent and not yet handled: while any is, `Supervisor::tick`
    /// sends its tick after them rather than running it in place
    /// (`coordinator.rs`, "Ticking in place").
    notices_waiting: AtomicU64,
    /// Whether short streams may ask the others for memory.
    pub(crate) recovery: bool,
    /// Bytes the clients of all streams hold, and the most at once: exact
    /// at every moment (`memory/live.rs`), so no decision depends on when
    /// a stream got round to its releases.
    pub(crate) live: Arc<LiveBytes>,
    /// How far reserved may run ahead of live before growth trims first.
    pub(crate) headroom: Option<Headroom>,
    /// The share of a range the physical handles of its streams are cut at
    /// (`ServiceConfig::handle_share`).
    pub(crate) handle_share: Option<u64>,
    /// The same for streams that share the device
    /// (`ServiceConfig::shared_handle_share`).
    pub(crate) shared_handle_share: Option<u64>,
    /// Streams past the headroom ask the others to serve them from their
    /// room first (`ServiceConfig::lend_across_streams`).
    pub(crate) lends: bool,
    /// The clock every time-driven policy reads (`clock.rs`).
    pub(crate) clock: SharedClock,
    /// Someone subscribed to the supervisor's events: only then do
    /// streams send the events nobody else acts on (a replay's thousands
    /// of out-of-memory answers would each wake the coordinator).
    pub(crate) watched: AtomicBool,
    /// The longest settle window any stream has now, nanoseconds (a
    /// stream's window grows while its settles prove early, `settle.rs`):
    /// `Supervisor::settled` waits two of it. Written by the coordinator.
    settle_window_ns: AtomicU64,
}

/// The device's totals across streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceStats {
    /// Bytes all streams' storages hold from the device now (pages not yet
    /// flushed included).
    pub bytes_reserved: u64,
    /// The most bytes held at once (exact: metered at allocation and flush).
    pub peak_bytes_reserved: u64,
    /// Bytes in use on all streams now.
    pub bytes_in_use: u64,
    /// The most bytes in use at once.
    pub peak_bytes_in_use: u64,
    /// The most granules the streams' storages had mapped at once.
    pub peak_granules_mapped: u64,
}

impl DeviceShared {
    /// Publish the longest settle window any stream has now.
    pub(crate) fn set_settle_window(&self, window: Duration) {
        let nanos = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        self.settle_window_ns.store(nanos, Ordering::Relaxed);
    }

    /// The longest settle window any stream had when the coordinator last
    /// looked (zero before it first did).
    pub(crate) fn settle_window(&self) -> Duration {
        Duration::from_nanos(self.settle_window_ns.load(Ordering::Relaxed))
    }

    pub(crate) fn new(
        budget: Option<Arc<DeviceBudget>>,
        notices: Option<Sender<Notice>>,
        recovery: bool,
    ) -> Self {
        let meter = budget
            .clone()
            .unwrap_or_else(|| Arc::new(DeviceBudget::new(u64::MAX)));
        Self {
            budget,
            meter,
            registry: Mutex::new(BTreeMap::new()),
            notices,
            notices_waiting: AtomicU64::new(0),
            settle_window_ns: AtomicU64::new(0),
            recovery,
            live: Arc::new(LiveBytes::new()),
            headroom: None,
            handle_share: None,
            shared_handle_share: None,
            lends: false,
            clock: ManualClock::shared(),
            watched: AtomicBool::new(false),
        }
    }

    /// The same, on `clock`.
    pub(crate) fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The same, growing under `headroom`.
    pub(crate) fn with_headroom(mut self, headroom: Option<Headroom>) -> Self {
        self.headroom = headroom;
        self
    }

    /// The same, the physical handles of its streams cut at up to one
    /// `alone`th of a range, and of those that share it one `shared`th
    /// (`alone`'s where `None`; the storages' own where both are).
    pub(crate) fn with_handle_shares(mut self, alone: Option<u64>, shared: Option<u64>) -> Self {
        self.handle_share = alone;
        self.shared_handle_share = shared;
        self
    }

    /// The same, its streams past the headroom asking the others to serve
    /// them from their room first where `lends`.
    pub(crate) fn with_lending(mut self, lends: bool) -> Self {
        self.lends = lends;
        self
    }

    /// How a stream of this device cuts its later physical handles, alone
    /// on it or not (`Stream::fit_handle_cut` says why).
    pub(crate) fn handle_cut(&self, alone: bool) -> HandleCut {
        let share = if alone {
            self.handle_share
        } else {
            self.shared_handle_share.or(self.handle_share)
        };
        HandleCut {
            share_one_in: share.unwrap_or(crate::storage::HANDLE_SHARE_ONE_IN),
            of_most_held: !alone && self.budget.is_none(),
        }
    }

    /// Whether taking `page` bytes of new pages for `requested` bytes now
    /// would carry the device past its headroom (see `headroom.rs`). Live
    /// bytes count at their high-water mark: caching below the most the
    /// device ever had live costs no footprint. `spare`: bytes of spare
    /// handles the asking stream holds, which its growth moves rather than
    /// adds to (`DeviceStorage::hold_spares`).
    pub(crate) fn over_headroom(&self, requested: u64, page: u64, spare: u64) -> bool {
        self.headroom_excess(requested, page, spare) > 0
    }

    /// The bytes [`over_headroom`](Self::over_headroom) finds the device
    /// past its headroom by (0 within it).
    pub(crate) fn headroom_excess(&self, requested: u64, page: u64, spare: u64) -> u64 {
        self.headroom.map_or(0, |headroom| {
            let live = self
                .live
                .get()
                .saturating_add(requested)
                .max(self.live.peak());
            let granted = self.meter.granted().saturating_sub(spare);
            headroom.excess(granted.saturating_add(page), live)
        })
    }

    pub(crate) fn stats(&self) -> DeviceStats {
        DeviceStats {
            bytes_reserved: self.meter.held(),
            peak_bytes_reserved: self.meter.peak(),
            bytes_in_use: self.live.get(),
            peak_bytes_in_use: self.live.peak(),
            peak_granules_mapped: self.meter.peak_granules_mapped(),
        }
    }

    /// Bytes the streams other than `stream` hold beyond what their clients
    /// hold (exact: pages as published before each answer, live bytes as
    /// released): what a recovery round could win back at most.
    /// Whether `stream` shares the device with another stream now: room
    /// it gives back could serve someone else.
    pub(crate) fn has_others(&self, stream: StreamId) -> bool {
        self.registry.lock().keys().any(|&other| other != stream)
    }

    pub(crate) fn others_excess(&self, stream: StreamId) -> u64 {
        self.registry
            .lock()
            .values()
            .map(StreamEntry::shared)
            .filter(|shared| shared.stream != stream)
            .map(|shared| shared.unused_at_most())
            .saturating_sum()
    }

    /// Tell the coordinator (never blocks; dropped if it is gone). Counted
    /// from before the send until the coordinator has handled it, so a
    /// tick run in place cannot come before it.
    pub(crate) fn notify(&self, notice: Notice) {
        if let Some(notices) = &self.notices {
            self.notices_waiting.fetch_add(1, Ordering::Relaxed);
            if notices.send(notice).is_err() {
                self.notices_waiting.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// The coordinator handled a notice [`notify`](Self::notify) counted
    /// (under its turn's lock).
    pub(crate) fn notice_handled(&self) {
        self.notices_waiting.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether a notice waits for the coordinator (read under its lock).
    pub(crate) fn notices_waiting(&self) -> bool {
        self.notices_waiting.load(Ordering::Relaxed) > 0
    }

    /// Tell subscribers `event`, which nothing but them acts on: not sent
    /// when there are none.
    pub(crate) fn tell(&self, event: SupervisorEvent) {
        if self.watched.load(Ordering::Acquire) {
            self.notify(Notice::Event(event));
        }
    }

    /// Whether a coordinator can organise cross-stream recovery.
    pub(crate) fn has_coordinator(&self) -> bool {
        self.recovery && self.notices.is_some()
    }

    /// The breakdown for an out-of-memory answer.
    pub(crate) fn out_of_memory(
        &self,
        stream: StreamId,
        requested: u64,
        needed: Option<u64>,
    ) -> OutOfMemoryReport {
        let per_stream: Vec<_> = self
            .registry
            .lock()
            .values()
            .map(StreamEntry::shared)
            .map(|shared| StreamUsage {
                stream: shared.stream,
                reserved: shared.bytes_reserved.load(Ordering::Relaxed),
                in_use: shared.bytes_in_use(),
            })
            .collect();
        OutOfMemoryReport {
            stream,
            requested,
            needed,
            budget: self.budget.as_ref().map(|budget| budget.limit()),
            reserved: per_stream.iter().map(|s| s.reserved).saturating_sum(),
            in_use: per_stream.iter().map(|s| s.in_use).saturating_sum(),
            per_stream,
        }
    }
}
