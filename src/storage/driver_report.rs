//! A device's (or a stream's) driver operations priced: what
//! [`DriverOps`] counted, times a [`DriverCosts`] table, in all and by the
//! path that asked ([`DriverPaths`]), against what mapping the peak once
//! costs.

// Counts and costs are summed and multiplied: saturating, never wrapping.
#![allow(clippy::arithmetic_side_effects)]

use super::driver::{DriverCosts, DriverOps};
use super::driver_paths::{DriverPaths, PathCost};
use serde::Serialize;

/// What a device's (or a stream's) driver was asked, priced by a table of
/// per-call costs ([`DriverCosts`]): counts, not timings, so the same on
/// every run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DriverReport {
    /// Whose costs priced it (`NVIDIA H200` by default).
    pub costs: String,
    /// The operations, by kind.
    pub ops: DriverOps,
    /// Every driver call counted.
    pub calls: u64,
    /// Their modeled time, nanoseconds.
    pub modeled_ns: u64,
    /// `modeled_ns` per trace event, microseconds.
    pub modeled_us_per_event: f64,
    /// The modeled time beyond what mapping the peak granules once costs
    /// (the least any allocator of granules pays), per event, microseconds.
    pub beyond_peak_us_per_event: f64,
    /// Granules mapped, over the whole replay: those of handles created,
    /// of spare handles moved and of handles adopted from another stream.
    pub granules_mapped: u64,
    /// The most granules mapped at once.
    pub peak_granules_mapped: u64,
    /// `granules_mapped / peak_granules_mapped` (0 when none was mapped):
    /// how often each granule held at the peak was mapped again.
    pub mapped_over_peak: f64,
    /// Times the host waited for a stream.
    pub stream_waits: u64,
    /// The modeled time by the path that asked (a growth, a round, a
    /// settle...: [`DriverPath`](super::DriverPath)), those that asked
    /// nothing left out; empty where the paths were not kept.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_path: Vec<PathCost>,
    /// The operations by path that `by_path` prices (kept to add up
    /// reports of several devices).
    #[serde(skip)]
    pub paths: DriverPaths,
}

impl DriverReport {
    /// [`new`](Self::new) of the operations `paths` counted, with their
    /// time by path.
    pub fn by_path(
        paths: DriverPaths,
        peak_granules: u64,
        events: u64,
        costs: &DriverCosts,
    ) -> Self {
        Self {
            by_path: paths.priced(events, costs),
            paths,
            ..Self::new(paths.total(), peak_granules, events, costs)
        }
    }

    /// `ops` over `events` events, whose storages together had at most
    /// `peak_granules` mapped at once, priced by `costs`.
    pub fn new(mut ops: DriverOps, peak_granules: u64, events: u64, costs: &DriverCosts) -> Self {
        // Storages that peak apart: the peak is the one measured where they meet.
        ops.peak_granules_mapped = peak_granules;
        let modeled_ns = costs.price(&ops);
        let beyond = modeled_ns.saturating_sub(costs.map_once(peak_granules));
        let per_event = |ns: u64| ns as f64 / 1000.0 / events.max(1) as f64;
        let granules_mapped = ops.granule_maps();
        Self {
            costs: costs.name.to_string(),
            ops,
            calls: ops.calls(),
            modeled_ns,
            modeled_us_per_event: per_event(modeled_ns),
            beyond_peak_us_per_event: per_event(beyond),
            granules_mapped,
            peak_granules_mapped: peak_granules,
            mapped_over_peak: if peak_granules == 0 {
                0.0
            } else {
                granules_mapped as f64 / peak_granules as f64
            },
            stream_waits: ops.stream_waits,
            by_path: Vec::new(),
            paths: DriverPaths::default(),
        }
    }
}
