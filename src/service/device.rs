//! What a device's streams share: the budget, the registry the
//! out-of-memory breakdown reads, and the way to tell the supervisor's
//! coordinator things (an unbounded channel: telling never blocks).

use super::error::{OutOfMemoryReport, StreamUsage};
use super::events::SupervisorEvent;
use super::shared::StreamShared;
use crate::memory::StreamId;
use crate::storage::DeviceBudget;
use crate::sync::atomic::Ordering;
use crate::sync::channel::Sender;
use crate::sync::{Arc, Mutex};

/// What actors and the supervisor tell the coordinator.
#[derive(Debug)]
pub(crate) enum Notice {
    /// A stream could not get a page and parked a request.
    Short {
        /// The stream.
        stream: StreamId,
        /// Bytes of the request.
        requested: u64,
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
    /// The supervisor is shutting down.
    Stop,
}

/// Shared by every stream of a device.
#[derive(Debug)]
pub(crate) struct DeviceShared {
    /// The device budget, if one is set.
    pub(crate) budget: Option<Arc<DeviceBudget>>,
    /// Every stream's published state, for breakdowns.
    pub(crate) streams: Mutex<Vec<Arc<StreamShared>>>,
    /// To the coordinator; `None` when there is none (a lone actor in tests).
    pub(crate) notices: Option<Sender<Notice>>,
    /// Whether short streams may ask the others for memory.
    pub(crate) recovery: bool,
}

impl DeviceShared {
    /// Tell the coordinator (never blocks; dropped if it is gone).
    pub(crate) fn notify(&self, notice: Notice) {
        if let Some(notices) = &self.notices {
            let _ = notices.send(notice);
        }
    }

    /// Whether a coordinator can organise cross-stream recovery.
    pub(crate) fn has_coordinator(&self) -> bool {
        self.recovery && self.notices.is_some()
    }

    /// The breakdown for an out-of-memory answer.
    pub(crate) fn out_of_memory(&self, stream: StreamId, requested: u64) -> OutOfMemoryReport {
        let per_stream: Vec<_> = self
            .streams
            .lock()
            .iter()
            .map(|shared| StreamUsage {
                stream: shared.stream,
                reserved: shared.bytes_reserved.load(Ordering::Relaxed),
                in_use: shared.bytes_in_use.load(Ordering::Relaxed),
            })
            .collect();
        OutOfMemoryReport {
            stream,
            requested,
            budget: self.budget.as_ref().map(|budget| budget.limit()),
            reserved: per_stream.iter().map(|s| s.reserved).sum(),
            in_use: per_stream.iter().map(|s| s.in_use).sum(),
            per_stream,
        }
    }
}
