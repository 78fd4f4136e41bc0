//! The driver's operations by the path that asked for them: a growth, a
//! compaction, a trim while serving, a round for another stream, a settle,
//! an idle cleanup... so a report says not only what memory cost the
//! driver but why (`docs/trace.md`, "The driver, by path").
//!
//! A storage counts every operation once ([`DriverOps`]); the memory layer
//! and the stream's actor name the path they are on
//! ([`DeviceStorage::set_driver_path`](super::DeviceStorage::set_driver_path))
//! and the storage's [`PathLedger`] gives what was counted between two
//! switches to the path that was on. Switches happen on the slow paths
//! only: a reservation served from held memory switches nothing, and
//! whatever no path claims (a trim after a reservation, a periodic
//! cleanup) is [`DriverPath::Serve`]'s.

use super::driver::{DriverCosts, DriverOps};
use serde::Serialize;
use std::fmt;

/// Why the driver was called.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverPath {
    /// Serving reservations and releases: the trims after a reservation
    /// and the periodic cleanups they run, and what a flush lets go on the
    /// way. What no other path claims.
    #[default]
    Serve,
    /// A reservation that grows: the maps of new memory (handles created,
    /// spares moved, handles adopted from another stream) and the spares
    /// it releases.
    Growth,
    /// What a growth gives back first to stay at its pool's level, and
    /// what a stream past its device's headroom trims before it grows.
    Trim,
    /// Moving allocations to spare a growth or to give memory back:
    /// copies, and the voids a slide maps and the granules it empties.
    Compaction,
    /// Memory given back for another stream's growth (a round past the
    /// headroom): handles unmapped, handed over or released.
    Round,
    /// Serving another stream's reservation from this one's room, in a
    /// round past the headroom instead of giving memory back: the
    /// releases and use fences looked at first, and the event that makes
    /// the other stream's work wait for this one's.
    Lend,
    /// Memory given back because the device is short of its budget, or
    /// before a request that ran out parks.
    Short,
    /// A stream whose load fell gives back the excess (`Settle`), its
    /// compaction and re-homing included.
    Settle,
    /// An idle stream's cleanup.
    Idle,
    /// An explicit cleanup (`Cleanup::Explicit`: the service's `cleanup`,
    /// PyTorch's empty cache) and the drain it ends with.
    Cleanup,
}

impl DriverPath {
    /// Every path, in report order.
    pub const ALL: [DriverPath; 10] = [
        DriverPath::Serve,
        DriverPath::Growth,
        DriverPath::Trim,
        DriverPath::Compaction,
        DriverPath::Round,
        DriverPath::Lend,
        DriverPath::Short,
        DriverPath::Settle,
        DriverPath::Idle,
        DriverPath::Cleanup,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            DriverPath::Serve => "serve",
            DriverPath::Growth => "growth",
            DriverPath::Trim => "trim",
            DriverPath::Compaction => "compaction",
            DriverPath::Round => "round",
            DriverPath::Lend => "lend",
            DriverPath::Short => "short",
            DriverPath::Settle => "settle",
            DriverPath::Idle => "idle",
            DriverPath::Cleanup => "cleanup",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for DriverPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A storage's operations, path by path. Their sum is what
/// [`DeviceStorage::driver_ops`](super::DeviceStorage::driver_ops) counts,
/// but for the peak (not a count, and in none of them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverPaths {
    ops: [DriverOps; DriverPath::ALL.len()],
}

impl DriverPaths {
    /// All of `ops` on `path`.
    pub fn all_on(path: DriverPath, ops: DriverOps) -> Self {
        let mut paths = Self::default();
        paths.ops[path.index()] = DriverOps {
            peak_granules_mapped: 0,
            ..ops
        };
        paths
    }

    /// What `path` asked.
    pub fn on(&self, path: DriverPath) -> &DriverOps {
        &self.ops[path.index()]
    }

    /// Each path with what it asked, in report order.
    pub fn iter(&self) -> impl Iterator<Item = (DriverPath, &DriverOps)> {
        DriverPath::ALL.into_iter().zip(&self.ops)
    }

    /// Every path's operations together (no peak).
    pub fn total(&self) -> DriverOps {
        (self.ops.iter()).fold(DriverOps::default(), |sum, ops| sum.combine(*ops))
    }

    /// The operations of two storages together, path by path.
    pub fn combine(mut self, other: Self) -> Self {
        for (mine, theirs) in self.ops.iter_mut().zip(other.ops) {
            *mine = mine.combine(theirs);
        }
        self
    }

    /// Each path's calls and modeled time over `events` events, priced by
    /// `costs`, leaving out the paths that asked nothing. They add up to
    /// the price of the whole: copy time is rounded down to the
    /// nanosecond, and what the paths' roundings leave over goes to the
    /// path that copied most.
    pub fn priced(&self, events: u64, costs: &DriverCosts) -> Vec<PathCost> {
        let mut priced: Vec<(PathCost, u64)> = self
            .iter()
            .filter(|(_, ops)| ops.calls() > 0)
            .map(|(path, ops)| {
                let cost = PathCost {
                    path,
                    calls: ops.calls(),
                    modeled_ns: costs.price(ops),
                    us_per_event: 0.0,
                    granules_mapped: ops.granule_maps(),
                };
                (cost, ops.bytes_copied)
            })
            .collect();
        let summed = (priced.iter()).fold(0, |sum, (cost, _)| {
            u64::saturating_add(sum, cost.modeled_ns)
        });
        let left = costs.price(&self.total()).saturating_sub(summed);
        if let Some((cost, _)) = priced.iter_mut().max_by_key(|(_, copied)| *copied) {
            cost.modeled_ns = cost.modeled_ns.saturating_add(left);
        }
        (priced.into_iter())
            .map(|(cost, _)| PathCost {
                us_per_event: cost.modeled_ns as f64 / 1000.0 / events.max(1) as f64,
                ..cost
            })
            .collect()
    }
}

/// One path's share of the driver's time in a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathCost {
    /// The path.
    pub path: DriverPath,
    /// Driver calls it made.
    pub calls: u64,
    /// Their modeled time, nanoseconds.
    pub modeled_ns: u64,
    /// `modeled_ns` per trace event, microseconds.
    pub us_per_event: f64,
    /// Granules it mapped: handles created, spares moved and handles
    /// adopted from another stream, in granules (what the report's
    /// `granules_mapped` adds up over the paths).
    pub granules_mapped: u64,
}

/// Where a storage keeps its operations by path: the path on now, and what
/// each path had counted up to the last switch.
#[derive(Debug, Clone, Default)]
pub(crate) struct PathLedger {
    /// The path on now.
    on: DriverPath,
    /// The storage's count at the last switch.
    at_switch: DriverOps,
    /// What each path counted before the last switch.
    before: DriverPaths,
}

impl PathLedger {
    /// Switch to `path`, the storage having counted `now` so far: what was
    /// counted since the last switch goes to the path that was on, which
    /// is returned (for the caller to switch back to).
    pub(crate) fn switch(&mut self, now: &DriverOps, path: DriverPath) -> DriverPath {
        let was = std::mem::replace(&mut self.on, path);
        if was != path {
            let since = now.since(&self.at_switch);
            let ops = &mut self.before.ops[was.index()];
            *ops = ops.combine(since);
            self.at_switch = *now;
        }
        was
    }

    /// What each path counted, the storage having counted `now` so far.
    pub(crate) fn paths(&self, now: &DriverOps) -> DriverPaths {
        self.before
            .combine(DriverPaths::all_on(self.on, now.since(&self.at_switch)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_counted_between_switches_goes_to_the_path_that_was_on() {
        let mut ops = DriverOps::default();
        let mut ledger = PathLedger::default();
        ops.mapped(1, 1);
        assert_eq!(ledger.switch(&ops, DriverPath::Growth), DriverPath::Serve);
        ops.mapped(2, 4);
        let was = ledger.switch(&ops, DriverPath::Compaction);
        assert_eq!(was, DriverPath::Growth);
        ops.copied(10);
        ledger.switch(&ops, was);
        ops.mapped(1, 1);
        let paths = ledger.paths(&ops);
        assert_eq!(paths.on(DriverPath::Serve).handles_created, 1);
        assert_eq!(paths.on(DriverPath::Growth).handles_created, 3);
        assert_eq!(paths.on(DriverPath::Growth).handle_granules_created, 5);
        assert_eq!(paths.on(DriverPath::Compaction).copies, 1);
        assert_eq!(paths.on(DriverPath::Compaction).handles_created, 0);
        // The paths add up to the storage's count, but for the peak.
        assert_eq!(
            paths.total(),
            DriverOps {
                peak_granules_mapped: 0,
                ..ops
            }
        );
    }

    #[test]
    fn the_paths_prices_add_up_to_the_wholes_whatever_the_copies_round_to() {
        // Three bytes copied on each of two paths: 1.5 ns each at 2 bytes
        // a nanosecond, 3 in all, which each path alone rounds down to 1.
        let costs = DriverCosts {
            copy_bytes_per_us: 2_000,
            ..DriverCosts::FREE
        };
        let mut ops = DriverOps::default();
        let mut ledger = PathLedger::default();
        ops.copied(3);
        ledger.switch(&ops, DriverPath::Compaction);
        ops.copied(3);
        let paths = ledger.paths(&ops);
        let priced = paths.priced(1, &costs);
        let total = (priced.iter()).fold(0, |sum, cost| sum + cost.modeled_ns);
        assert_eq!(total, costs.price(&paths.total()));
        assert_eq!(total, 3);
    }

    #[test]
    fn a_path_that_asked_nothing_is_left_out_of_the_price() {
        let mut ops = DriverOps::default();
        ops.mapped(1, 1);
        let priced = DriverPaths::all_on(DriverPath::Growth, ops).priced(10, &DriverCosts::H200);
        assert_eq!(priced.len(), 1);
        assert_eq!(priced[0].path, DriverPath::Growth);
        assert_eq!(priced[0].calls, 3);
        // Create, map and grant access to one granule: 44.6 us over 10 events.
        assert_eq!(priced[0].modeled_ns, 44_600);
        assert!((priced[0].us_per_event - 4.46).abs() < 1e-9);
    }
}
