//! The device budget and running short across streams: recovery through
//! another stream's cached pages, failure with a breakdown, two streams
//! short at once, waiting with a timeout, cancellation, scheduled
//! compaction, and events.

use std::sync::Arc;
use std::time::Duration;
use streamalloc::memory::StreamId;
use streamalloc::service::{ServiceConfig, ServiceError, Supervisor, SupervisorEvent};

mod common;
use common::{MIB, wait_for};

/// A device of `budget` bytes with no idle tick and no headroom, so cached
/// pages stay cached unless a short stream asks for them.
fn device(budget: u64) -> Supervisor {
    Supervisor::virtual_device(ServiceConfig {
        budget: Some(budget),
        settle: ServiceConfig::default().settle,
        ..common::quiet()
    })
}

#[test]
fn a_stream_recovers_through_another_streams_cached_pages() {
    let device = device(64 * MIB);
    let events = device.events();
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    drop(a.reserve_many(&[MIB; 48]).unwrap());
    assert!(
        a.stats().bytes_reserved >= 48 * MIB,
        "a keeps its pages cached"
    );
    // b needs more than the budget has left: a's cache must go back.
    let big = b.reserve(40 * MIB).unwrap();
    assert_eq!(big.size(), 40 * MIB);
    assert!(a.stats().bytes_reserved < 48 * MIB);
    let budget = device.budget().unwrap();
    assert!(budget.peak() <= budget.limit());
    assert!(wait_for(&events, |e| matches!(
        e,
        SupervisorEvent::RanShort {
            stream: StreamId(1),
            ..
        }
    )));
    assert!(wait_for(&events, |e| matches!(
        e,
        SupervisorEvent::Recovered {
            stream: StreamId(1),
            ..
        }
    )));
}

/// Under a full budget, what the giver hands over needs no grant: the
/// short stream maps the giver's physical handles, which the budget held
/// all along (`storage/loose.rs`), and the device never holds more than
/// its budget.
#[test]
fn a_short_stream_maps_the_handles_another_stream_hands_over() {
    let device = device(48 * MIB);
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    drop(a.reserve_many(&[MIB; 48]).unwrap());
    a.report().unwrap();
    let budget = device.budget().unwrap();
    assert_eq!(budget.granted(), 48 * MIB, "a's cache fills the budget");
    let big = b.reserve(40 * MIB).unwrap();
    let gave = a.report().unwrap().driver;
    let took = b.report().unwrap().driver;
    assert!(gave.handles_handed_over > 0, "{gave:?}");
    assert!(took.handles_adopted > 0, "{took:?}");
    assert_eq!(
        took.handle_granules_adopted + took.handle_granules_created,
        20
    );
    assert!(budget.peak() <= budget.limit());
    assert_eq!(budget.bytes_passed_on(), 0, "nothing left waiting");
    assert_eq!(
        budget.held(),
        a.stats().bytes_reserved + b.stats().bytes_reserved
    );
    drop(big);
}

#[test]
fn a_request_that_cannot_fit_fails_with_the_breakdown() {
    let device = device(64 * MIB);
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    let held = a.reserve_many(&[MIB; 40]).unwrap();
    let err = b.reserve(32 * MIB).unwrap_err();
    let ServiceError::OutOfMemory(report) = err else {
        panic!("{err:?}")
    };
    assert_eq!(report.stream, StreamId(1));
    assert_eq!(report.requested, 32 * MIB);
    assert_eq!(report.budget, Some(64 * MIB));
    assert_eq!(report.per_stream.len(), 2);
    let a_usage = report
        .per_stream
        .iter()
        .find(|u| u.stream == StreamId(0))
        .unwrap();
    assert_eq!(a_usage.in_use, 40 * MIB);
    assert!(
        report.to_string().contains("out of memory on stream 1"),
        "{report}"
    );
    // The stream is still usable for what fits.
    assert!(b.reserve(MIB).is_ok());
    drop(held);
}

#[test]
fn two_streams_short_at_once_never_deadlock() {
    for _ in 0..5 {
        let device = Arc::new(device(64 * MIB));
        let a = device.stream(StreamId(0)).unwrap();
        let b = device.stream(StreamId(1)).unwrap();
        drop(a.reserve_many(&[MIB; 30]).unwrap());
        drop(b.reserve_many(&[MIB; 30]).unwrap());
        let threads: Vec<_> = [a, b]
            .into_iter()
            .map(|stream| std::thread::spawn(move || stream.reserve(40 * MIB).map(|x| x.size())))
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let served = results.iter().filter(|r| r.is_ok()).count();
        assert!(served >= 1, "{results:?}");
        for result in &results {
            match result {
                Ok(size) => assert_eq!(*size, 40 * MIB),
                Err(ServiceError::OutOfMemory(_)) => {}
                Err(other) => panic!("unexpected {other:?}"),
            }
        }
        let budget = device.budget().unwrap();
        assert!(budget.peak() <= budget.limit());
    }
}

#[test]
fn reserve_waits_for_memory_up_to_its_timeout() {
    let clock = streamalloc::clock::ManualClock::shared();
    let device = Supervisor::virtual_device(ServiceConfig {
        budget: Some(64 * MIB),
        clock: clock.clone(),
        ..common::quiet()
    });
    let events = device.events();
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    let held = a.reserve_many(&[MIB; 50]).unwrap();
    // Times out while a holds everything, once its wait has passed on the
    // service's clock (which moves only here).
    let waiter = {
        let b = b.clone();
        std::thread::spawn(move || b.reserve_timeout(32 * MIB, Duration::from_millis(100)))
    };
    assert!(wait_for(&events, |e| matches!(
        e,
        SupervisorEvent::RanShort {
            stream: StreamId(1),
            ..
        }
    )));
    clock.advance(Duration::from_millis(100));
    let err = waiter.join().unwrap().unwrap_err();
    assert!(matches!(err, ServiceError::OutOfMemory(_)), "{err:?}");
    // Served once a lets go.
    let waiter = std::thread::spawn(move || b.reserve_timeout(32 * MIB, Duration::from_secs(5)));
    assert!(wait_for(&events, |e| matches!(
        e,
        SupervisorEvent::RanShort {
            stream: StreamId(1),
            ..
        }
    )));
    drop(held);
    a.cleanup(streamalloc::memory::Cleanup::Explicit).unwrap();
    let served = waiter.join().unwrap().unwrap();
    assert_eq!(served.size(), 32 * MIB);
}

#[test]
fn a_cancelled_wait_releases_what_it_was_served() {
    let device = device(64 * MIB);
    let events = device.events();
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    let held = a.reserve_many(&[MIB; 50]).unwrap();
    {
        let future = std::pin::pin!(b.reserve_timeout_async(32 * MIB, Duration::from_secs(5)));
        let waker = std::task::Waker::noop();
        assert!(
            future
                .poll(&mut std::task::Context::from_waker(waker))
                .is_pending()
        );
    } // dropped while parked (or about to be: parked once it asks)
    assert!(wait_for(&events, |e| matches!(
        e,
        SupervisorEvent::RanShort {
            stream: StreamId(1),
            ..
        }
    )));
    drop(held);
    a.cleanup(streamalloc::memory::Cleanup::Explicit).unwrap();
    // Served on one of its polls (to nobody: the answer drops, and with
    // it the allocation), then the report processes that release.
    assert!(wait_for(&events, |e| matches!(
        e,
        SupervisorEvent::Recovered {
            stream: StreamId(1),
            ..
        }
    )));
    assert_eq!(b.report().unwrap().usage().number_allocs, 0);
    assert_eq!(b.stats().reservations, 1);
}

#[test]
fn bytes_held_never_exceed_the_budget_under_load() {
    let device = Arc::new(device(96 * MIB));
    let threads: Vec<_> = (0..4u32)
        .map(|i| {
            let stream = device.stream(StreamId(i % 3)).unwrap();
            std::thread::spawn(move || {
                let mut live = Vec::new();
                for j in 0..200u64 {
                    match stream.reserve(MIB / 2 + (j * 7919 + u64::from(i)) % (4 * MIB)) {
                        Ok(a) => live.push(a),
                        Err(ServiceError::OutOfMemory(_)) => live.clear(),
                        Err(other) => panic!("{other:?}"),
                    }
                    if live.len() > 8 {
                        live.remove(0);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let budget = device.budget().unwrap();
    assert!(
        budget.peak() <= budget.limit(),
        "{} > {}",
        budget.peak(),
        budget.limit()
    );
    for report in device.shutdown() {
        assert_eq!(report.unwrap().bytes_left, 0);
    }
    assert_eq!(budget.granted(), 0, "every byte went back to the budget");
}

#[test]
fn the_supervisor_schedules_compaction_past_the_threshold() {
    // Pages: the threshold weighs what pages hold against what is carved.
    let device = Supervisor::host(ServiceConfig {
        compaction_threshold: Some(1.5),
        memory: streamalloc::memory::MemoryConfig::with_pools(
            streamalloc::memory::MemoryConfiguration::Adaptive,
        ),
        ..common::quiet()
    });
    let events = device.events();
    let stream = device.stream(StreamId(0)).unwrap();
    let all = stream.reserve_many(&[300 * 1024; 96]).unwrap();
    let kept: Vec<_> = all.into_iter().step_by(4).collect();
    stream.report().unwrap(); // processes the releases
    let before = stream.stats().bytes_reserved;
    // A stream started just before the tick: its notice may still wait
    // for the coordinator's thread, and the tick must come after it
    // (whether it runs in place or behind it as a notice).
    let _other = device.stream(StreamId(1)).unwrap();
    // One tick of the timers: scheduled, and done when `tick` returns.
    device.tick().unwrap();
    let seen = events.drain();
    let at = |event: SupervisorEvent| seen.iter().position(|seen| *seen == event);
    let scheduled = at(SupervisorEvent::CompactionScheduled(StreamId(0))).expect("scheduled");
    let started = at(SupervisorEvent::StreamStarted(StreamId(1))).expect("told");
    assert!(
        started < scheduled,
        "the tick overtook a notice sent before it: {seen:?}"
    );
    assert!(
        stream.stats().bytes_reserved < before,
        "compaction gave nothing back"
    );
    assert!(stream.stats().relocated > 0);
    drop(kept);
}

#[test]
fn lifecycle_events_are_reported() {
    let device = Supervisor::host(ServiceConfig::default());
    let events = device.events();
    let stream = device.stream(StreamId(4)).unwrap();
    drop(stream);
    device.remove_stream(StreamId(4)).unwrap();
    assert!(wait_for(&events, |e| *e
        == SupervisorEvent::StreamStarted(StreamId(4))));
    assert!(wait_for(&events, |e| *e
        == SupervisorEvent::StreamStopped(StreamId(4))));
}

#[test]
fn a_stream_that_gave_back_all_it_could_is_asked_again_once_a_pin_lets_go() {
    let device = device(64 * MIB);
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    let held = a.reserve(40 * MIB).unwrap();
    let pin = a.resolve(&held).unwrap();
    drop(held); // released, but the pin keeps its page
    // a is asked, gives back what it can (nothing: the page is pinned).
    let err = b.reserve(40 * MIB).unwrap_err();
    assert!(matches!(err, ServiceError::OutOfMemory(_)), "{err:?}");
    // The pin lets go: the page is free to give, so a must be asked again
    // (its clients gave something back since its last give-back).
    drop(pin);
    let served = b.reserve(40 * MIB).unwrap();
    assert_eq!(served.size(), 40 * MIB);
}
