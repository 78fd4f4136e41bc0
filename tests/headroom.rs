//! The device headroom: a stream that would grow the device past its
//! headroom gets cached pages back first (its own, then the others'), and
//! growth is never refused for it.

use streamalloc::memory::StreamId;
use streamalloc::service::{
    Events, Headroom, ServiceConfig, StreamHandle, Supervisor, SupervisorEvent,
};

mod common;
use common::MIB;

fn device(headroom: Option<Headroom>) -> Supervisor {
    Supervisor::virtual_device(ServiceConfig {
        headroom,
        ..common::quiet()
    })
}

/// Reserve 48 MiB in 1 MiB pieces on `stream`, drop them all, and wait for
/// the stream to have processed the drops: 48 MiB of pages stay cached.
fn cache_48_mib(stream: &StreamHandle) {
    drop(stream.reserve_many(&[MIB; 48]).unwrap());
    stream.report().unwrap();
    assert!(stream.stats().bytes_reserved >= 48 * MIB);
    assert_eq!(stream.stats().bytes_in_use, 0);
}

/// Whether `events` holds one that `want`s. The coordinator emits a
/// round's events before it sends the `Retry` that answers the request,
/// so once the request is answered they are there: no waiting.
fn saw(events: &Events, want: impl Fn(&SupervisorEvent) -> bool) -> bool {
    events.drain().iter().any(want)
}

#[test]
fn a_growing_stream_gets_the_others_cache_back_first() {
    let device = device(Some(Headroom::default()));
    let events = device.events();
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    cache_48_mib(&a);

    let big = b.reserve(40 * MIB).unwrap();
    assert_eq!(big.size(), 40 * MIB);
    a.report().unwrap();
    assert!(
        a.stats().bytes_reserved < 8 * MIB,
        "a gave its cache back: {:?}",
        a.stats()
    );
    // The device never held much more than the most it had live (48 MiB).
    let peak = device.device_stats().peak_bytes_reserved;
    assert!(peak <= 48 * MIB + Headroom::default().slack, "peak {peak}");
    assert!(saw(&events, |e| matches!(
        e,
        SupervisorEvent::HeadroomReached {
            stream: StreamId(1),
            requested,
        } if *requested == 40 * MIB
    )));
    device.shutdown();
}

#[test]
fn without_headroom_every_stream_keeps_its_cache() {
    let device = device(None);
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    cache_48_mib(&a);

    let _big = b.reserve(40 * MIB).unwrap();
    a.report().unwrap();
    assert!(a.stats().bytes_reserved >= 48 * MIB);
    assert!(device.device_stats().peak_bytes_reserved >= 88 * MIB);
    device.shutdown();
}

#[test]
fn a_lone_stream_trims_its_own_cache_and_is_never_refused() {
    let device = device(Some(Headroom::default()));
    let a = device.stream(StreamId(0)).unwrap();
    cache_48_mib(&a);

    // No room among the cached 1 MiB holes: the cache goes, then the page
    // comes, although nobody could give anything back.
    let big = a.reserve(40 * MIB).unwrap();
    assert_eq!(big.size(), 40 * MIB);
    // The cache went before the page (grown with a quarter to spare) came.
    a.report().unwrap();
    let reserved = a.stats().bytes_reserved;
    assert!(
        reserved <= 48 * MIB + Headroom::default().slack,
        "reserved {reserved}"
    );
    // And what fits in the room held is served from it, headroom or not.
    drop(big);
    a.report().unwrap();
    let again = a.reserve(40 * MIB).unwrap();
    a.report().unwrap();
    assert_eq!(a.stats().bytes_reserved, reserved);
    drop(again);
    device.shutdown();
}

#[test]
fn the_headroom_is_the_larger_of_its_fraction_and_its_slack() {
    let headroom = Headroom {
        fraction: 0.05,
        slack: 8 * MIB,
    };
    assert!(!headroom.exceeded(108 * MIB, 100 * MIB));
    assert!(headroom.exceeded(108 * MIB + 1, 100 * MIB));
    assert!(!headroom.exceeded(1050 * MIB, 1000 * MIB));
    assert!(headroom.exceeded(1050 * MIB + 1, 1000 * MIB));
}
