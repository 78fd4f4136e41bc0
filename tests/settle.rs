//! Settling: a stream whose load fell gives back what it no longer needs,
//! without an explicit cleanup; one under steady load keeps its cache.
//! On a manual clock: time passes only as each test moves it, and the
//! supervisor's timers run only at `tick`, so every outcome is decided by
//! the policy, never by how fast the machine is.

use std::sync::Arc;
use std::time::Duration;
use streamalloc::clock::ManualClock;
use streamalloc::memory::{Allocation, StreamId};
use streamalloc::service::{ServiceConfig, Settle, StreamHandle, Supervisor, SupervisorEvent};

mod common;
use common::MIB;

const WINDOW: Duration = Duration::from_millis(200);
const TICK: Duration = Duration::from_millis(10);

fn device(settle: Option<Settle>) -> (Supervisor, Arc<ManualClock>) {
    let clock = ManualClock::shared();
    // Nothing else gives pages back: no idle tick, no compaction. Pages:
    // what settling moves and returns here are pages.
    let device = Supervisor::virtual_device(ServiceConfig {
        memory: streamalloc::memory::MemoryConfig::with_pools(
            streamalloc::memory::MemoryConfiguration::Adaptive,
        ),
        supervise_tick: TICK,
        settle,
        clock: clock.clone(),
        ..common::quiet()
    });
    (device, clock)
}

/// Let `span` pass, one tick at a time.
fn pass(device: &Supervisor, clock: &ManualClock, span: Duration) {
    let mut passed = Duration::ZERO;
    while passed < span {
        clock.advance(TICK);
        device.tick().unwrap();
        passed += TICK;
    }
}

fn settle() -> Option<Settle> {
    Some(Settle {
        window: WINDOW,
        ..Settle::default()
    })
}

/// 48 MiB in 1 MiB pieces; every twelfth is kept, so four sparse pages
/// stay behind the cached empty ones.
fn load_then_fall(stream: &StreamHandle) -> Vec<Allocation> {
    let all = stream.reserve_many(&[MIB; 48]).unwrap();
    let kept: Vec<_> = all.into_iter().step_by(12).collect();
    stream.report().unwrap();
    assert!(stream.stats().bytes_reserved >= 48 * MIB);
    assert_eq!(stream.stats().bytes_in_use, 4 * MIB);
    kept
}

#[test]
fn a_stream_whose_load_fell_gives_the_excess_back() {
    let (device, clock) = device(settle());
    let events = device.events();
    let stream = device.stream(StreamId(0)).unwrap();
    device.tick().unwrap(); // the stream is watched from now
    let kept = load_then_fall(&stream);

    // Not within the window: the load may come back.
    pass(&device, &clock, WINDOW - TICK);
    assert_eq!(stream.stats().settles, 0, "settled early");
    assert!(stream.stats().bytes_reserved >= 48 * MIB);
    // A window after it fell: settled, down to what the policy keeps.
    pass(&device, &clock, 2 * TICK);
    let limit = |in_use: u64| Settle::default().keep(in_use);
    let stats = stream.stats();
    assert_eq!(stats.settles, 1, "{stats:?}");
    assert!(
        stats.bytes_reserved <= limit(stats.bytes_in_use),
        "still {stats:?}"
    );
    assert!(events.drain().iter().any(|e| matches!(
        e,
        SupervisorEvent::SettleScheduled {
            stream: StreamId(0),
            ..
        }
    )));
    // The survivors moved, their handles still work.
    for allocation in &kept {
        assert_eq!(stream.resolve(allocation).unwrap().len(), MIB);
    }
    device.shutdown();
}

#[test]
fn without_settling_the_cache_stays() {
    let (device, clock) = device(None);
    let stream = device.stream(StreamId(0)).unwrap();
    let _kept = load_then_fall(&stream);
    pass(&device, &clock, WINDOW * 3);
    assert!(stream.stats().bytes_reserved >= 48 * MIB);
    assert_eq!(stream.stats().settles, 0);
    device.shutdown();
}

#[test]
fn a_stream_under_steady_load_keeps_its_cache() {
    let (device, clock) = device(settle());
    let stream = device.stream(StreamId(0)).unwrap();
    let mut held = stream.reserve_many(&[MIB; 48]).unwrap();
    for i in 0..(WINDOW * 4).as_millis() / TICK.as_millis() {
        // Churn one piece a tick: 47 to 48 MiB in use all along.
        held[i as usize % 48] = stream.reserve(MIB).unwrap();
        pass(&device, &clock, TICK);
    }
    // 48 MiB in use on 50 MiB of pages is more than the ratio allows, so
    // one settle is tried; the pages cannot shrink, and a settle that could
    // not get the stream below what it holds is not repeated (without that
    // memory: a relocation every window, three here).
    let stats = stream.stats();
    assert!(stats.settles <= 1, "{stats:?}");
    assert!(stats.bytes_reserved >= 48 * MIB, "{stats:?}");
    // Past what that settle left, the stream is told again: a burst of
    // 16 MiB that falls away is given back.
    let burst = stream.reserve_many(&[MIB; 16]).unwrap();
    drop(burst);
    stream.report().unwrap();
    assert!(stream.stats().bytes_reserved >= 64 * MIB);
    pass(&device, &clock, WINDOW + 2 * TICK);
    let after = stream.stats();
    assert_eq!(after.settles, stats.settles + 1, "{after:?}");
    assert!(after.bytes_reserved <= stats.bytes_reserved, "{after:?}");
    device.shutdown();
}

/// A load that dips for a window and a half and comes back, four times,
/// then falls for good: the settles the stream is told, with its window
/// doubling at most `backoff` times.
fn settles_over_dips(backoff: u32) -> (u64, u64) {
    let (device, clock) = device(Some(Settle {
        window: WINDOW,
        backoff,
        ..Settle::default()
    }));
    let stream = device.stream(StreamId(0)).unwrap();
    device.tick().unwrap();
    for _ in 0..4 {
        let load = stream.reserve_many(&[MIB; 48]).unwrap();
        pass(&device, &clock, WINDOW / 2);
        let kept: Vec<_> = load.into_iter().step_by(12).collect();
        pass(&device, &clock, WINDOW * 3 / 2);
        drop(kept);
    }
    let during = stream.stats().settles;
    // The load fell for good: given back within the longest window.
    let _kept = load_then_fall(&stream);
    pass(&device, &clock, WINDOW * (1 << backoff) + 2 * TICK);
    let stats = stream.stats();
    assert!(
        stats.bytes_reserved <= Settle::default().keep(stats.bytes_in_use),
        "{stats:?}"
    );
    device.shutdown();
    (during, stats.settles - during)
}

#[test]
fn a_stream_whose_settles_are_taken_back_waits_longer_before_the_next() {
    // On the policy's window alone, every dip is given back and mapped
    // again when the load comes back.
    let (every_dip, _) = settles_over_dips(0);
    assert_eq!(every_dip, 4);
    // Taken back within two windows, the first settle doubles the
    // stream's window past the dips: none of them is given back again.
    let (dips, fall) = settles_over_dips(3);
    assert_eq!(dips, 1);
    // And a load that falls for good is still given back.
    assert_eq!(fall, 1);
}
