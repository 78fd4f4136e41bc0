//! Settling: a stream whose load fell gives back what it no longer needs,
//! without an explicit cleanup; one under steady load keeps its cache.

use std::time::{Duration, Instant};
use streamalloc::memory::{Allocation, StreamId};
use streamalloc::service::{ServiceConfig, Settle, StreamHandle, Supervisor, SupervisorEvent};

mod common;
use common::MIB;

const WINDOW: Duration = Duration::from_millis(200);

fn device(settle: Option<Settle>) -> Supervisor {
    // Nothing else gives pages back: no idle tick, no compaction.
    Supervisor::virtual_device(ServiceConfig {
        supervise_tick: Duration::from_millis(10),
        settle,
        ..common::quiet()
    })
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

/// Poll the stream's published counters until `done` or a deadline.
fn eventually(stream: &StreamHandle, done: impl Fn(u64, u64) -> bool) -> bool {
    let deadline = Instant::now() + WINDOW * 20;
    while Instant::now() < deadline {
        let stats = stream.stats();
        if done(stats.bytes_reserved, stats.bytes_in_use) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn a_stream_whose_load_fell_gives_the_excess_back() {
    let device = device(settle());
    let events = device.events();
    let stream = device.stream(StreamId(0)).unwrap();
    let kept = load_then_fall(&stream);

    let limit = |in_use: u64| (in_use as f64 * 1.10) as u64 + Settle::default().slack;
    assert!(
        eventually(&stream, |reserved, in_use| reserved <= limit(in_use)),
        "still {:?}",
        stream.stats()
    );
    assert!(stream.stats().settles >= 1);
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
    let device = device(None);
    let stream = device.stream(StreamId(0)).unwrap();
    let _kept = load_then_fall(&stream);
    std::thread::sleep(WINDOW * 3);
    stream.report().unwrap();
    assert!(stream.stats().bytes_reserved >= 48 * MIB);
    assert_eq!(stream.stats().settles, 0);
    device.shutdown();
}

#[test]
fn a_stream_under_steady_load_keeps_its_cache() {
    let device = device(settle());
    let stream = device.stream(StreamId(0)).unwrap();
    let mut held = stream.reserve_many(&[MIB; 48]).unwrap();
    let until = Instant::now() + WINDOW * 4;
    let mut i = 0;
    while Instant::now() < until {
        // Churn one piece at a time: 47 to 48 MiB in use all along.
        held[i % 48] = stream.reserve(MIB).unwrap();
        i += 1;
        std::thread::sleep(Duration::from_micros(200));
    }
    stream.report().unwrap();
    assert_eq!(stream.stats().settles, 0, "{:?}", stream.stats());
    device.shutdown();
}
