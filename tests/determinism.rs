//! One trace, one answer: replays on the trace's clock give the same
//! report every time (the timings aside), whatever else the machine is
//! doing, with and without a budget, on one stream and on several.

use streamalloc::clock::ManualClock;
use streamalloc::replay::{ReplayReport, Replayer};
use streamalloc::service::{Calls, ServiceConfig, Supervisor};
use streamalloc::trace::{TraceAction, TraceEvent};

mod common;
use common::{KIB, MIB};

/// A serving-like trace: `streams` streams, KV blocks that live long,
/// activations that live a few events, a load that rises and falls; times
/// a few microseconds apart (so the timers run many times along it).
fn serving_trace(streams: u64, events: usize, seed: u64) -> Vec<TraceEvent> {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = Vec::with_capacity(events);
    let mut live: Vec<(u64, u64, u64, usize)> = Vec::new(); // id, stream, size, until
    let mut time = 0u64;
    let mut id = 0u64;
    while out.len() < events {
        let now = out.len();
        time += 1_000 + next() % 40_000;
        // Free what is due (and, in the second half, more: the load falls).
        let falling = now > events * 2 / 3;
        if let Some(at) = live
            .iter()
            .position(|&(_, _, _, until)| until <= now || (falling && next() % 4 == 0))
        {
            let (gone, stream, size, _) = live.swap_remove(at);
            out.push(TraceEvent::new(time, stream, TraceAction::Free, gone, size));
            continue;
        }
        id += 1;
        let stream = next() % streams;
        let (size, life) = if next() % 3 == 0 {
            (2 * MIB, 200 + (next() % 2000) as usize)
        } else {
            (64 * KIB + next() % (6 * MIB), 1 + (next() % 30) as usize)
        };
        live.push((id, stream, size, now + life));
        out.push(TraceEvent::new(time, stream, TraceAction::Alloc, id, size));
    }
    out
}

fn replay(events: &[TraceEvent], budget: Option<u64>) -> ReplayReport {
    replay_with(events, budget, false)
}

fn replay_with(events: &[TraceEvent], budget: Option<u64>, hot_cache: bool) -> ReplayReport {
    let mut replayer = Replayer::new(|_| {
        Supervisor::virtual_device(ServiceConfig {
            budget,
            clock: ManualClock::shared(),
            calls: Calls {
                hot_cache,
                ..Calls::default()
            },
            ..ServiceConfig::default()
        })
    });
    for event in events {
        replayer.event(event).unwrap();
    }
    replayer.finish().unwrap()
}

/// The report as JSON, without its one timing (`ns_per_op`): the driver's
/// modeled time is priced from counts and must be the same too.
fn answer(report: &ReplayReport) -> serde_json::Value {
    let mut value = serde_json::to_value(report).unwrap();
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.retain(|key, _| key != "ns_per_op");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut value);
    value
}

/// Five replays, with a thread spinning all along (a busy core), all the
/// same; returns the first.
fn five_alike(events: &[TraceEvent], budget: Option<u64>) -> ReplayReport {
    let busy = common::BusyCore::start();
    let first = replay(events, budget);
    for run in 2..=5 {
        let again = replay(events, budget);
        assert_eq!(answer(&again), answer(&first), "replay {run} differs");
    }
    drop(busy);
    first
}

#[test]
fn a_multi_stream_trace_replays_the_same_every_time() {
    let events = serving_trace(4, 4_000, 7);
    let report = five_alike(&events, None);
    assert_eq!(report.streams, 4);
    assert!(report.relocated > 0 || report.settled_reserved_bytes > 0);
    // The driver's work is counted and priced the same on every run too.
    assert!(report.driver.ops.handles_created > 0);
    assert!(report.driver.modeled_ns > 0);
    assert_eq!(report.per_stream.len(), 4);
    let summed = report
        .per_stream
        .iter()
        .map(|s| s.driver.ops.handles_created)
        .sum::<u64>();
    assert_eq!(summed, report.driver.ops.handles_created);
}

#[test]
fn a_trace_that_does_not_fit_fails_the_same_way_every_time() {
    let events = serving_trace(4, 4_000, 11);
    let free = replay(&events, None);
    // Under its peak live bytes: it cannot fit.
    let report = five_alike(&events, Some(free.peak_live_bytes * 3 / 4));
    assert_eq!(report.fits, Some(false));
    assert!(report.failures > 0);
}

#[test]
fn a_single_stream_trace_replays_the_same_every_time() {
    let events = serving_trace(1, 3_000, 3);
    let free = five_alike(&events, None);
    // A budget just above what it needed: fits, the same way each time.
    let report = five_alike(&events, Some(free.peak_reserved_bytes));
    assert_eq!(report.fits, Some(true));
}

#[test]
fn a_replay_with_hot_caches_is_the_same_every_time() {
    let events = serving_trace(2, 3_000, 5);
    let first = replay_with(&events, None, true);
    for run in 2..=3 {
        let again = replay_with(&events, None, true);
        assert_eq!(answer(&again), answer(&first), "replay {run} differs");
    }
}
