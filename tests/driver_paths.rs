//! A replay prices the driver's operations by the path that asked for them
//! (`storage::DriverPaths`): the paths add up to the whole, a growth's maps
//! are the growth's, what goes back once the load fell is the settle's and
//! the idle cleanup's, what one stream gives another is the round's, and a
//! compaction's copies are the compaction's.

use serde_json::Value;
use streamalloc::clock::ManualClock;
use streamalloc::memory::{Cleanup, MemoryConfig, MemoryConfiguration, MemoryManager, PageUpdate};
use streamalloc::replay::Replayer;
use streamalloc::service::{ServiceConfig, Supervisor};
use streamalloc::storage::{DEFAULT_GRANULE, DeviceStorage, DriverOps, DriverPath, VirtualStorage};
use streamalloc::trace::{TraceAction, TraceEvent};

mod common;
use common::MIB;

const G: u64 = DEFAULT_GRANULE;

fn replay(events: &[TraceEvent]) -> Value {
    replay_lending(events, false)
}

/// A replay on the default service, streams past the headroom asking the
/// others to serve them from their room first where `lend` (off by
/// default).
fn replay_lending(events: &[TraceEvent], lend: bool) -> Value {
    let mut replayer = Replayer::new(|_| {
        Supervisor::virtual_device(ServiceConfig {
            clock: ManualClock::shared(),
            lend_across_streams: lend,
            ..ServiceConfig::default()
        })
    });
    for event in events {
        replayer.event(event).unwrap();
    }
    serde_json::to_value(replayer.finish().unwrap()).unwrap()
}

/// `(path, calls, modeled ns)` of a report's `by_path`.
fn paths(driver: &Value) -> Vec<(String, u64, u64)> {
    (driver["by_path"].as_array().unwrap().iter())
        .map(|cost| {
            (
                cost["path"].as_str().unwrap().to_string(),
                cost["calls"].as_u64().unwrap(),
                cost["modeled_ns"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// `(path, granules mapped)` of a report's `by_path`.
fn granules_by_path(driver: &Value) -> Vec<(String, u64)> {
    (driver["by_path"].as_array().unwrap().iter())
        .map(|cost| {
            (
                cost["path"].as_str().unwrap().to_string(),
                cost["granules_mapped"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn on<'a>(paths: &'a [(String, u64, u64)], path: &str) -> Option<&'a (String, u64, u64)> {
    paths.iter().find(|(name, _, _)| name == path)
}

fn grow_and_free(stream: u64, ids: std::ops::Range<u64>, start: u64) -> Vec<TraceEvent> {
    let mut events: Vec<TraceEvent> = (ids.clone())
        .map(|id| TraceEvent::new(start + id * 1_000, stream, TraceAction::Alloc, id, G))
        .collect();
    events.extend(
        ids.map(|id| TraceEvent::new(start + 500_000 + id, stream, TraceAction::Free, id, G)),
    );
    events
}

/// One stream grows to 16 granules and frees them: the trace maps them on
/// the growth path, and only the load's fall gives them back, on the
/// settle's and the idle cleanup's.
#[test]
fn a_growth_maps_on_its_path_and_the_fall_gives_back_on_the_settles() {
    let report = replay(&grow_and_free(0, 0..16, 0));
    let (total, in_trace) = (paths(&report["driver"]), paths(&report["driver_in_trace"]));
    let sum = |paths: &[(String, u64, u64)]| -> (u64, u64) {
        (paths.iter()).fold((0, 0), |(calls, ns), (_, c, n)| (calls + c, ns + n))
    };
    for (key, paths) in [("driver", &total), ("driver_in_trace", &in_trace)] {
        let (calls, ns) = sum(paths);
        assert_eq!(calls, report[key]["calls"].as_u64().unwrap(), "{key}");
        assert_eq!(ns, report[key]["modeled_ns"].as_u64().unwrap(), "{key}");
        // The granules mapped by path: the growth's sixteen, nothing else.
        let granules = granules_by_path(&report[key]);
        let mapped = (granules.iter()).fold(0, |sum, (_, granules)| sum + granules);
        assert_eq!(mapped, report[key]["granules_mapped"].as_u64().unwrap());
        assert_eq!(mapped, 16, "{key}");
        assert!(granules.contains(&("growth".to_string(), 16)), "{key}");
    }
    let names: Vec<&str> = in_trace.iter().map(|(name, _, _)| name.as_str()).collect();
    assert_eq!(names, ["growth"], "up to the last event, only the growth");
    let growth = on(&total, "growth").unwrap();
    assert_eq!(
        growth,
        on(&in_trace, "growth").unwrap(),
        "none after the fall"
    );
    // The fall: every granule back (16 handles unmapped and released at
    // 28.5 us each, then the range), all of it on the paths a falling load
    // takes.
    let after: u64 = (total.iter())
        .filter(|(name, _, _)| name == "settle" || name == "idle")
        .map(|(_, _, ns)| ns)
        .sum();
    let ns = |key: &str| report[key]["modeled_ns"].as_u64().unwrap();
    assert_eq!(after, ns("driver") - ns("driver_in_trace"));
    assert!(after >= 16 * 28_500);
    assert!(on(&total, "round").is_none() && on(&total, "trim").is_none());
}

/// A second stream grows past the device's headroom once the first one's
/// load fell, the first not lending: the first gives its handles back on
/// the round's path, and the second maps them on its growth's.
#[test]
fn what_one_stream_gives_another_is_the_rounds() {
    let report = replay(&second_stream_after_first_fell());
    let streams = report["per_stream"].as_array().unwrap();
    let giver = paths(&streams[0]["driver"]);
    let taker = paths(&streams[1]["driver"]);
    let round = on(&giver, "round").expect("the first stream gave back in a round");
    assert!(round.1 > 0);
    assert!(on(&taker, "round").is_none(), "the taker gave nothing");
    assert!(on(&taker, "growth").is_some_and(|(_, calls, _)| *calls > 0));
    let ops: DriverOps = serde_json::from_value(report["driver"]["ops"].clone()).unwrap();
    assert!(
        ops.handles_adopted > 0,
        "the taker mapped what was handed over"
    );
    // What it adopted counts among the granules its growth mapped.
    let taken = granules_by_path(&streams[1]["driver"]);
    let grown = taken.iter().find(|(name, _)| name == "growth").unwrap().1;
    assert!(grown >= ops.handle_granules_adopted && grown >= 16);
    assert_eq!(
        grown,
        streams[1]["driver"]["granules_mapped"].as_u64().unwrap(),
        "the taker maps on its growth alone"
    );
}

/// The first stream's load rose and fell, then a second grows as far.
fn second_stream_after_first_fell() -> Vec<TraceEvent> {
    let mut events = grow_and_free(0, 0..16, 0);
    events.extend(
        (100..116u64).map(|id| TraceEvent::new(600_000 + id * 1_000, 1, TraceAction::Alloc, id, G)),
    );
    events
}

/// The same, the first stream lending: it serves the second from the room
/// it keeps mapped, on the lend path, and nothing is unmapped there or
/// mapped again here: the device maps its peak once.
#[test]
fn what_one_stream_lends_another_is_on_the_lend_path_and_maps_nothing() {
    let report = replay_lending(&second_stream_after_first_fell(), true);
    let streams = report["per_stream"].as_array().unwrap();
    let lender = paths(&streams[0]["driver"]);
    let lend = on(&lender, "lend").expect("the first stream lent");
    assert!(lend.1 > 0, "it ordered the second stream after its work");
    assert!(on(&lender, "round").is_none(), "it gave nothing back");
    let ops: DriverOps = serde_json::from_value(report["driver"]["ops"].clone()).unwrap();
    assert_eq!(ops.handles_adopted, 0, "nothing handed over");
    assert!(ops.stream_orders > 0);
    // The second stream grows within the headroom's slack (4 MiB: two
    // granules), and borrows past it: nothing more is mapped anywhere.
    let borrower = granules_by_path(&streams[1]["driver"]);
    let mapped: u64 = borrower.iter().map(|(_, granules)| granules).sum();
    assert_eq!(mapped, 2, "the second stream mapped its slack alone");
    assert_eq!(ops.granule_maps(), 16 + 2);
    let rounds = replay(&second_stream_after_first_fell());
    let moved: DriverOps = serde_json::from_value(rounds["driver"]["ops"].clone()).unwrap();
    assert!(moved.granule_maps() > ops.granule_maps() + 8);
}

/// A compaction's copies are on its path, an explicit cleanup's unmaps on
/// its own, and a reservation served from memory held asks nothing.
#[test]
fn a_managers_compaction_and_cleanup_count_on_their_paths() {
    let mut memory = MemoryManager::new(
        VirtualStorage::new(),
        MemoryConfig::with_pools(MemoryConfiguration::Expandable),
    );
    let mut held: Vec<_> = (0..64)
        .map(|_| memory.reserve(MIB, PageUpdate::Allow).unwrap())
        .collect();
    let grown = memory.storage().driver_paths();
    assert_eq!(
        grown.total(),
        DriverOps {
            peak_granules_mapped: 0,
            ..memory.storage().driver_ops()
        }
    );
    assert!(grown.on(DriverPath::Growth).maps > 0);
    // Served from what is held: no path asks anything more.
    drop(held.pop());
    held.push(memory.reserve(MIB, PageUpdate::Allow).unwrap());
    assert_eq!(memory.storage().driver_paths(), grown);
    // Every other allocation goes: the rest compacts.
    let kept: Vec<_> = held.drain(..).step_by(2).collect();
    memory.process_releases();
    memory.compact().unwrap();
    let compacted = memory.storage().driver_paths();
    assert!(compacted.on(DriverPath::Compaction).copies > 0);
    assert_eq!(
        compacted.on(DriverPath::Compaction).copies,
        memory.storage().driver_ops().copies,
        "every copy was the compaction's"
    );
    drop(kept);
    memory.cleanup(Cleanup::Explicit);
    let cleaned = memory.storage().driver_paths();
    assert!(cleaned.on(DriverPath::Cleanup).unmaps > 0);
    assert_eq!(
        cleaned.on(DriverPath::Serve),
        compacted.on(DriverPath::Serve),
        "the cleanup's give-back is its own"
    );
}
