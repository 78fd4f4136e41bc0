//! What a replay reports, per device and in total.

use crate::service::ServiceError;
use crate::storage::{DriverCosts, DriverOps, DriverPaths, DriverReport};
use serde::Serialize;
use std::collections::BTreeMap;

/// One stream of a replayed device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamReplay {
    /// The stream's index on its device (the service's `StreamId`).
    pub stream: u32,
    /// The stream as the trace names it.
    pub trace_stream: u64,
    /// Events of this stream (its allocations and frees).
    pub events: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Allocations this allocator could not serve.
    pub failures: u64,
    /// Frees of allocations this stream served.
    pub frees: u64,
    /// Bytes of the allocations it served.
    pub bytes_allocated: u64,
    /// Bytes of the allocations freed.
    pub bytes_freed: u64,
    /// Bytes the trace left live on this stream at its end.
    pub live_bytes: u64,
    /// Bytes its storage held once the load fell.
    pub reserved_bytes: u64,
    /// The most bytes live on this stream at once, per the trace.
    pub peak_live_bytes: u64,
    /// The most bytes this stream's storage held at once.
    pub peak_reserved_bytes: u64,
    /// Allocations it served from its room for other streams' requests
    /// past the headroom: in its reserved bytes, though another stream's
    /// (`docs/service.md`, "Serving another stream").
    pub lent: u64,
    /// Allocations of this stream's that another stream served so, from
    /// its room: in that stream's reserved bytes, not this one's.
    pub borrowed: u64,
    /// Its pools once the load fell: pages, bytes, peaks.
    pub pools: Vec<crate::simulate::PoolFigures>,
    /// What its storage asked of the driver (per event: of this stream's
    /// events).
    pub driver: DriverReport,
}

/// What a replay measured (of one device, or the total of several).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    /// The device this covers; `None` for the total of several.
    pub device: Option<u32>,
    /// Events replayed.
    pub events: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Frees of live allocations.
    pub frees: u64,
    /// Allocations this allocator could not serve (out of memory, too large).
    pub failures: u64,
    /// Why the first of those failed.
    pub first_failure: Option<String>,
    /// How many failed for each reason (`out of memory`, `too large`, ...).
    pub failure_reasons: BTreeMap<String, u64>,
    /// Failures the trace itself recorded.
    pub trace_failures: u64,
    /// Frees of pointers the trace never allocated (counted, not fatal).
    pub unknown_frees: u64,
    /// Pointers allocated again without a free: the old allocation is
    /// freed first (counted, not fatal).
    pub implicit_frees: u64,
    /// Streams in the trace.
    pub streams: usize,
    /// The most bytes live at once, per the trace (allocations this
    /// allocator refused included: the trace's figure, whatever the budget).
    pub peak_live_bytes: u64,
    /// The event (counted from 1 over the whole trace) after which the
    /// trace's live bytes were at their most: of this device, or, in the
    /// total of several, of all of them together.
    pub peak_live_event: u64,
    /// The most bytes of pages held at once, all streams.
    pub peak_reserved_bytes: u64,
    /// `peak_reserved_bytes / peak_live_bytes`.
    pub reserved_over_live: f64,
    /// What the recording allocator held at most (a PyTorch snapshot's
    /// reserved bytes), where the trace records it.
    pub recorded_peak_reserved_bytes: Option<u64>,
    /// `recorded_peak_reserved_bytes - peak_reserved_bytes`: what this
    /// allocator saves over the recorded one (negative: it needs more);
    /// `None` when any allocation failed (what it reserved then served
    /// less than the trace).
    pub saved_bytes: Option<i64>,
    /// Wall time per event, nanoseconds.
    pub ns_per_op: f64,
    /// Allocations moved by relocations.
    pub relocated: u64,
    /// Bytes the trace left live at its end (the load fell to this).
    pub settled_live_bytes: u64,
    /// Bytes of pages held once the streams settled after the trace, with
    /// no explicit cleanup (see [`Settle`](crate::service::Settle)).
    pub settled_reserved_bytes: u64,
    /// `settled_reserved_bytes / settled_live_bytes` (0 when nothing is
    /// left live).
    pub settled_reserved_over_live: f64,
    /// The device budget, if one was set.
    pub budget: Option<u64>,
    /// With a budget: whether every allocation the trace served was served.
    pub fits: Option<bool>,
    /// What the device's driver was asked, priced (the time a real GPU
    /// adds to `ns_per_op`, which a host replay does not pay), up to the
    /// streams' settling after the trace ended: what they gave back once
    /// the load fell included.
    pub driver: DriverReport,
    /// The same up to the trace's last event: `driver` less what the
    /// streams gave back after the load fell (per event, and beyond
    /// mapping the same peak once). A service that holds its peak
    /// unmaps it once, at the end; how much of `driver` that is shows
    /// here.
    pub driver_in_trace: DriverReport,
    /// Each stream's figures (empty in the total of several devices: each
    /// device has its own).
    pub per_stream: Vec<StreamReplay>,
    /// Per device, when the trace names more than one (the fields above are
    /// then their sums, and the ratios those of the sums).
    pub devices: Vec<ReplayReport>,
}

impl ReplayReport {
    pub(super) fn empty(device: Option<u32>, budget: Option<u64>) -> Self {
        Self {
            device,
            events: 0,
            allocations: 0,
            frees: 0,
            failures: 0,
            first_failure: None,
            failure_reasons: BTreeMap::new(),
            trace_failures: 0,
            unknown_frees: 0,
            implicit_frees: 0,
            streams: 0,
            peak_live_bytes: 0,
            peak_live_event: 0,
            peak_reserved_bytes: 0,
            reserved_over_live: 0.0,
            recorded_peak_reserved_bytes: None,
            saved_bytes: None,
            ns_per_op: 0.0,
            relocated: 0,
            settled_live_bytes: 0,
            settled_reserved_bytes: 0,
            settled_reserved_over_live: 0.0,
            budget,
            fits: None,
            driver: DriverReport::new(DriverOps::default(), 0, 0, &DriverCosts::FREE),
            driver_in_trace: DriverReport::new(DriverOps::default(), 0, 0, &DriverCosts::FREE),
            per_stream: Vec::new(),
            devices: Vec::new(),
        }
    }

    /// Fill the ratios and the comparison from the totals.
    pub(super) fn derive(&mut self) {
        self.reserved_over_live = ratio(self.peak_reserved_bytes, self.peak_live_bytes);
        self.settled_reserved_over_live =
            ratio(self.settled_reserved_bytes, self.settled_live_bytes);
        // What a replay that refused allocations reserved is not what the
        // trace needed: nothing is said saved then.
        self.saved_bytes = self
            .recorded_peak_reserved_bytes
            .filter(|_| self.failures == 0)
            .map(|recorded| {
                saturating_i64(i128::from(recorded) - i128::from(self.peak_reserved_bytes))
            });
        if self.budget.is_some() {
            self.fits = Some(self.failures == 0);
        }
    }

    /// The sum of per-device reports, their driver operations priced by
    /// `costs`.
    pub(super) fn total(devices: Vec<ReplayReport>, costs: &DriverCosts) -> ReplayReport {
        let mut total = ReplayReport::empty(None, None);
        let sum_opt = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        for d in &devices {
            total.events += d.events;
            total.allocations += d.allocations;
            total.frees += d.frees;
            total.failures += d.failures;
            total.first_failure = total
                .first_failure
                .take()
                .or_else(|| d.first_failure.clone());
            total.trace_failures += d.trace_failures;
            total.unknown_frees += d.unknown_frees;
            total.implicit_frees += d.implicit_frees;
            total.streams += d.streams;
            total.peak_live_bytes += d.peak_live_bytes;
            total.peak_reserved_bytes += d.peak_reserved_bytes;
            total.recorded_peak_reserved_bytes = sum_opt(
                total.recorded_peak_reserved_bytes,
                d.recorded_peak_reserved_bytes,
            );
            total.relocated += d.relocated;
            total.settled_live_bytes += d.settled_live_bytes;
            total.settled_reserved_bytes += d.settled_reserved_bytes;
            total.budget = sum_opt(total.budget, d.budget);
        }
        total.ns_per_op = devices.first().map_or(0.0, |d| d.ns_per_op);
        let paths = |of: fn(&ReplayReport) -> &DriverReport| {
            (devices.iter()).fold(DriverPaths::default(), |paths, d| {
                paths.combine(of(d).paths)
            })
        };
        // Devices are apart: their peaks add up.
        let peak = devices.iter().map(|d| d.driver.peak_granules_mapped).sum();
        total.driver = DriverReport::by_path(paths(|d| &d.driver), peak, total.events, costs);
        total.driver_in_trace =
            DriverReport::by_path(paths(|d| &d.driver_in_trace), peak, total.events, costs);
        total.derive();
        total.devices = devices;
        total
    }
}

/// What a failed reservation is counted as.
pub(super) fn failure_reason(err: &ServiceError) -> &'static str {
    use crate::memory::MemoryError;
    use crate::storage::StorageError;
    match err {
        ServiceError::OutOfMemory(_)
        | ServiceError::Memory(MemoryError::Storage(StorageError::OutOfMemory { .. })) => {
            "out of memory"
        }
        ServiceError::Memory(MemoryError::TooLarge { .. }) => "larger than the largest page",
        ServiceError::Memory(MemoryError::Storage(_)) => "refused by the storage",
        _ => "refused by the manager",
    }
}

/// `reserved / live`, 0 when nothing is live.
fn ratio(reserved: u64, live: u64) -> f64 {
    if live == 0 {
        0.0
    } else {
        reserved as f64 / live as f64
    }
}

fn saturating_i64(value: i128) -> i64 {
    i64::try_from(value).unwrap_or(if value < 0 { i64::MIN } else { i64::MAX })
}
