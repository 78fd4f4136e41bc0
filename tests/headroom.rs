//! The device headroom: a stream that would grow the device past its
//! headroom gets cached pages back first (its own, then the others'), and
//! growth is never refused for it.

use streamalloc::clock::ManualClock;
use streamalloc::memory::StreamId;
use streamalloc::memory::{Cleanup, MemoryConfig, MemoryConfiguration};
use streamalloc::replay::{ReplayReport, Replayer};
use streamalloc::service::{
    Events, Headroom, ServiceConfig, StreamHandle, Supervisor, SupervisorEvent,
};
use streamalloc::trace::{TraceAction, TraceEvent};

mod common;
use common::{KIB, Lcg, MIB};

/// A device whose streams do not lend to each other: these tests are of
/// the rounds that give memory back (`tests/lending.rs` has those that
/// lend first).
fn device(headroom: Option<Headroom>) -> Supervisor {
    Supervisor::virtual_device(ServiceConfig {
        headroom,
        lend_across_streams: false,
        ..common::quiet()
    })
}

/// A device as [`device`] makes, under a budget of 1 GiB where `budget`
/// (far above what the tests hold: only the policies that look at it
/// change).
fn device_budgeted(headroom: Option<Headroom>, budget: bool) -> Supervisor {
    Supervisor::virtual_device(ServiceConfig {
        headroom,
        budget: budget.then_some(1 << 30),
        lend_across_streams: false,
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

/// What a round's giver gives back goes to the asker whole: the giver
/// unmaps its physical handles without releasing them, and the asker's
/// growth maps them where it would have created handles
/// (`storage/loose.rs`).
#[test]
fn a_round_hands_the_givers_handles_to_the_asker() {
    let device = device(Some(Headroom::default()));
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    cache_48_mib(&a);
    let before = a.report().unwrap().driver;

    let big = b.reserve(40 * MIB).unwrap();
    let gave = a.report().unwrap().driver;
    let took = b.report().unwrap().driver;
    let handed = gave.handles_handed_over - before.handles_handed_over;
    assert!(handed > 0, "a handed its handles over: {gave:?}");
    assert_eq!(
        gave.handles_released, before.handles_released,
        "a released none of them"
    );
    assert!(took.handles_adopted > 0, "b mapped them: {took:?}");
    assert!(took.handles_adopted <= handed);
    // b mapped 40 MiB: what it did not adopt it created.
    assert_eq!(
        took.handle_granules_adopted + took.handle_granules_created,
        20,
        "{took:?}"
    );
    // Those b did not map went back once it was served: the device holds
    // what its streams hold.
    let stats = device.device_stats();
    assert_eq!(
        stats.bytes_reserved,
        a.stats().bytes_reserved + b.stats().bytes_reserved
    );
    assert!(stats.peak_bytes_reserved <= 48 * MIB + Headroom::default().slack);
    drop(big);
    device.shutdown();
}

/// A stream whose trim gives back less than its growth needs parks for
/// the others' round holding what the trim gave back: at its `Retry` the
/// growth maps those handles again, beside the ones the round handed
/// over, and creates only what both lack (released before the round, it
/// created all of its own afresh). Under a budget it releases them first.
#[test]
fn an_asker_keeps_what_its_trim_gave_back_through_the_round() {
    for budget in [false, true] {
        asker_through_a_round(budget);
    }
}

fn asker_through_a_round(budget: bool) {
    let device = device_budgeted(Some(Headroom::default()), budget);
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    // 48 MiB live at once, then all of it cached: within the headroom.
    let held_a = a.reserve_many(&[MIB; 32]).unwrap();
    let held_b = b.reserve_many(&[MIB; 16]).unwrap();
    drop((held_a, held_b));
    let before = a.report().unwrap().driver;
    b.report().unwrap();

    // 56 MiB: more than a's whole cache, so its trim cannot serve it and
    // it asks b for the rest.
    let big = a.reserve(56 * MIB).unwrap();
    let after = a.report().unwrap().driver;
    let gave = b.report().unwrap().driver;
    assert!(gave.handles_handed_over > 0, "b handed over: {gave:?}");
    let grew = |field: fn(&streamalloc::storage::DriverOps) -> u64| field(&after) - field(&before);
    let mapped_again = grew(|ops| ops.handle_granules_moved + ops.handle_granules_adopted);
    let created = grew(|ops| ops.handle_granules_created);
    assert_eq!(mapped_again + created, 28, "56 MiB mapped: {after:?}");
    if budget {
        // a's 16 released before the round, and created again.
        assert_eq!(created, 20, "under a budget: {after:?}");
        assert_eq!(grew(|ops| ops.handle_granules_released), 16, "{after:?}");
    } else {
        // a's 16 granules and b's 8 mapped again: 4 created.
        assert_eq!(created, 4, "a created only what neither held: {after:?}");
        assert_eq!(grew(|ops| ops.handle_granules_released), 0, "{after:?}");
    }
    // The device never held more than the most live, past its headroom;
    // and once served, what its streams hold.
    let stats = device.device_stats();
    assert!(
        stats.peak_bytes_reserved <= 56 * MIB + Headroom::default().slack,
        "{stats:?}"
    );
    assert_eq!(
        stats.bytes_reserved,
        a.stats().bytes_reserved + b.stats().bytes_reserved
    );
    drop(big);
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

/// A random load of one stream (1 KiB..8 MiB, about a hundred live): the
/// trace's events, and its allocations' ids.
fn random_load(events: u64) -> Vec<TraceEvent> {
    let mut random = Lcg(0x2545_f491_4f6c_dd1d);
    let mut next = move || random.next() >> 33;
    let (mut trace, mut live, mut time) = (Vec::new(), Vec::new(), 0);
    for id in 0..events {
        time += 1_000;
        if live.len() > 100 || (live.len() > 60 && next() % 2 == 0) {
            let (gone, size) = live.swap_remove(next() as usize % live.len());
            trace.push(TraceEvent::new(time, 1, TraceAction::Free, gone, size));
        } else {
            let size = KIB + next() % (8 * MIB);
            trace.push(TraceEvent::new(time, 1, TraceAction::Alloc, id, size));
            live.push((id, size));
        }
    }
    trace
}

/// Replay `events` (and, if `other`, one allocation of 1 MiB on a second
/// stream first, held to the end); its report.
fn replay(events: &[TraceEvent], other: bool) -> ReplayReport {
    replay_cutting_handles(events, other, Shares::default())
}

/// A stream past the headroom whose free room could hold its request once
/// compacted: one with others on its device compacts the whole stream for
/// them, one alone does not (whatever it gathered would serve nobody) and
/// lets its growth move only what that request needs
/// (`serve_within_headroom`): far fewer copies, the peak no higher. (Two
/// thirds of the copies before a stream with others kept its room after
/// each reservation, `trim_to_headroom`; about as many as alone when the
/// lone stream compacted the whole stream too.)
#[test]
fn a_lone_stream_past_the_headroom_moves_only_what_its_requests_need() {
    let events = random_load(6_000);
    let alone = replay(&events, false);
    let with_another = replay(&events, true);
    let copies = |report: &ReplayReport| report.driver.ops.copies;
    assert!(
        copies(&alone) * 4 < copies(&with_another) * 3,
        "{} copies alone, {} with another stream",
        copies(&alone),
        copies(&with_another)
    );
    assert!(
        alone.reserved_over_live <= 1.05,
        "alone: {} of peak live",
        alone.reserved_over_live
    );
    assert_eq!(alone.failures + with_another.failures, 0);
}

/// A stream past the headroom gives its free granules back (and, with
/// others on its device, compacts) before it grows; what it gives back
/// stays as spare physical handles until the request is served, and the
/// growth moves them where it maps instead of creating handles
/// (`serve_within_headroom`, `DeviceStorage::hold_spares`).
#[test]
fn a_stream_moves_what_its_trim_gave_back_to_its_growth() {
    let events = random_load(6_000);
    for other in [false, true] {
        let ops = replay(&events, other).driver.ops;
        // More than a tenth of the handles unmapped were moved (one in
        // fifty alone when the trim's went at once).
        assert!(
            ops.handles_moved * 10 > ops.unmaps,
            "another stream: {other}; {} of {} unmapped handles moved",
            ops.handles_moved,
            ops.unmaps
        );
    }
}

/// A round for a stream growing past the headroom asks the others for
/// what it lacks: a giver that holds more free gives back twice that and
/// keeps the rest mapped for its own next reservations, and the device
/// stays within its headroom.
#[test]
fn a_giver_keeps_what_the_asker_does_not_lack() {
    let device = device(Some(Headroom::default()));
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    cache_48_mib(&a);
    // 48 MiB was the most live at once: 16 more would take the device
    // 16 MiB past it, less the headroom's slack.
    let lacks = 16 * MIB - Headroom::default().slack;
    let wanted = b.reserve(16 * MIB).unwrap();
    a.report().unwrap();
    let kept = a.stats().bytes_reserved;
    assert!(
        kept >= 48 * MIB - 2 * lacks && kept < 48 * MIB,
        "a gave back twice what b lacked, not its whole cache: kept {kept}"
    );
    let peak = device.device_stats().peak_bytes_reserved;
    assert!(peak <= 48 * MIB + Headroom::default().slack, "peak {peak}");
    drop(wanted);
}

/// A round past the headroom wakes the streams holding the most room
/// they do not use, only as many as the asker lacks: the roomiest gives,
/// and a stream with less room keeps its cache.
#[test]
fn a_round_asks_the_roomiest_stream_first_and_no_more_than_it_takes() {
    let device = device(Some(Headroom::default()));
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    let c = device.stream(StreamId(2)).unwrap();
    // 72 MiB live at once, then all of it cached: 48 on a, 24 on b.
    let held = (
        a.reserve_many(&[MIB; 48]).unwrap(),
        b.reserve_many(&[MIB; 24]).unwrap(),
    );
    drop(held);
    for stream in [&a, &b] {
        stream.report().unwrap();
        assert_eq!(stream.stats().bytes_in_use, 0);
    }
    let cached_b = b.stats().bytes_reserved;
    assert!(cached_b >= 24 * MIB);
    // 16 MiB more would take the device 16 MiB past its peak live, less
    // the headroom's slack: a alone holds that much unused.
    let wanted = c.reserve(16 * MIB).unwrap();
    a.report().unwrap();
    b.report().unwrap();
    assert!(
        a.stats().bytes_reserved < 48 * MIB,
        "the roomiest gave back: a kept {}",
        a.stats().bytes_reserved
    );
    assert_eq!(b.stats().bytes_reserved, cached_b, "b was not asked");
    drop(wanted);
}

/// A stream growing past the headroom asks for a round even where the
/// others hold less unused room than its request: what they hold is what
/// the device is past its headroom by, and growing without the round
/// kept it all (a held-out 2-stream serving trace held 1.063 of its
/// peak live that way).
#[test]
fn a_round_wins_back_room_smaller_than_the_request() {
    let device = device(Some(Headroom::default()));
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    // 48 MiB live on a, then 16 of it cached: 32 live, 16 unused.
    let mut held = a.reserve_many(&[MIB; 48]).unwrap();
    drop(held.split_off(32));
    a.report().unwrap();
    assert_eq!(a.stats().bytes_in_use, 32 * MIB);
    // 24 MiB on b: 56 live, against 72 held had b grown without a round.
    let grown = b.reserve(24 * MIB).unwrap();
    a.report().unwrap();
    let peak = device.device_stats().peak_bytes_reserved;
    assert!(
        peak <= 56 * MIB + Headroom::default().slack,
        "a gave its unused room back before b grew: peak {peak}"
    );
    drop((held, grown));
}

/// The shares of a range physical handles are cut at: every stream's,
/// and that of streams that share a device.
#[derive(Clone, Copy, Default)]
struct Shares {
    alone: Option<u64>,
    shared: Option<u64>,
}

/// [`replay`], with the streams cutting their physical handles as
/// `shares` say.
fn replay_cutting_handles(events: &[TraceEvent], other: bool, shares: Shares) -> ReplayReport {
    let mut replayer = Replayer::new(|_| {
        Supervisor::virtual_device(ServiceConfig {
            clock: ManualClock::shared(),
            handle_share: shares.alone,
            shared_handle_share: shares.shared,
            ..ServiceConfig::default()
        })
    });
    if other {
        let theirs = TraceEvent::new(0, 2, TraceAction::Alloc, u64::MAX, MIB);
        replayer.event(&theirs).unwrap();
    }
    for event in events {
        replayer.event(event).unwrap();
    }
    replayer.finish().unwrap()
}

/// Granules a physical handle the replay created covered, on average.
fn granules_per_handle(report: &ReplayReport) -> f64 {
    let ops = report.driver.ops;
    ops.handle_granules_created as f64 / ops.handles_created as f64
}

/// That `larger` mapped more granules a physical handle than `than`, by
/// more than 30 %.
fn assert_larger_handles(larger: &ReplayReport, than: &ReplayReport, context: &str) {
    assert!(
        granules_per_handle(larger) > 1.3 * granules_per_handle(than),
        "{context}{:.2} granules a handle, against {:.2}",
        granules_per_handle(larger),
        granules_per_handle(than)
    );
}

/// `ServiceConfig::shared_handle_share`: a stream that shares its device
/// maps its memory in larger physical handles (fewer driver calls for the
/// granules it maps); a lone stream keeps the storage's own.
#[test]
fn streams_that_share_a_device_map_larger_handles_when_told() {
    let events = random_load(6_000);
    let shared = replay_cutting_handles(&events, true, Shares::default());
    let told = Shares {
        shared: Some(8),
        ..Shares::default()
    };
    let larger = replay_cutting_handles(&events, true, told);
    assert_larger_handles(&larger, &shared, "");
    let alone = replay_cutting_handles(&events, false, Shares::default());
    let told = replay_cutting_handles(&events, false, told);
    assert_eq!(
        told.driver.ops, alone.driver.ops,
        "a lone stream keeps its handles"
    );
    assert_eq!(told.peak_reserved_bytes, alone.peak_reserved_bytes);
}

/// `ServiceConfig::handle_share`: every stream maps in larger physical
/// handles, from its first map, and gives them back in fewer driver
/// calls; streams that share the device take it too unless told their
/// own.
#[test]
fn streams_map_larger_handles_when_told() {
    let events = random_load(6_000);
    let every = Shares {
        alone: Some(8),
        ..Shares::default()
    };
    for other in [false, true] {
        let default = replay_cutting_handles(&events, other, Shares::default());
        let larger = replay_cutting_handles(&events, other, every);
        assert_larger_handles(&larger, &default, &format!("another stream: {other}; "));
        assert!(
            larger.driver.ops.handles_released < default.driver.ops.handles_released,
            "fewer handles given back"
        );
        assert!(larger.driver.modeled_ns < default.driver.modeled_ns);
    }
    // Told their own, streams that share the device keep it.
    let both = Shares {
        alone: Some(8),
        shared: Some(64),
    };
    assert_eq!(
        replay_cutting_handles(&events, true, both).driver.ops,
        replay_cutting_handles(&events, true, Shares::default())
            .driver
            .ops,
    );
}

/// A stream that shares its device cuts its physical handles at a share
/// of the most its range held: memory that comes back after it went maps
/// in handles as long as those it went in, which the handles given back
/// and handed over between the streams fit. A lone stream cuts at a share
/// of what its range holds once mapped.
#[test]
fn a_stream_that_shares_its_device_keeps_its_handle_lengths() {
    for (shared, budget) in [(false, false), (true, false), (true, true)] {
        let device = device_budgeted(None, budget);
        let a = device.stream(StreamId(0)).unwrap();
        let other = shared.then(|| device.stream(StreamId(1)).unwrap());
        let base = a.reserve(MIB).unwrap();
        // 256 granules held: one in 64 of them is 4 a handle.
        drop(a.reserve(510 * MIB).unwrap());
        a.cleanup(Cleanup::Explicit).unwrap();
        let before = a.report().unwrap().driver;
        assert!(a.stats().bytes_reserved <= 8 * MIB, "{:?}", a.stats());
        let again = a.reserve(64 * MIB).unwrap();
        let after = a.report().unwrap().driver;
        let handles = after.handles_created - before.handles_created;
        let granules = after.handle_granules_created - before.handle_granules_created;
        assert_eq!(granules, 32, "shared: {shared}");
        // Under a budget, the cut follows what the range holds.
        if shared && !budget {
            assert!(handles * 3 <= granules, "{handles} handles for {granules}");
        } else {
            assert_eq!(handles, granules, "a handle a granule");
        }
        drop((base, again, other));
        device.shutdown();
    }
}

/// Past its headroom by a granule's rounding, a device whose stream serves
/// a reservation from the room it caches: a stream of expandable arenas
/// keeps that room for a round to hand over when another stream grows; a
/// stream of pages, which no round hands over, gives its empty pages back
/// after answering (`trim_to_headroom`), and so do arenas under a budget.
#[test]
fn arenas_keep_their_room_past_the_headroom_and_pages_trim_it() {
    for (arenas, budget) in [(true, false), (false, false), (true, true)] {
        let pools = if arenas {
            MemoryConfiguration::Expandable
        } else {
            MemoryConfiguration::Adaptive
        };
        let device = Supervisor::virtual_device(ServiceConfig {
            headroom: Some(Headroom {
                fraction: 0.0,
                slack: 0,
            }),
            memory: MemoryConfig::with_pools(pools),
            budget: budget.then_some(1 << 30),
            ..common::quiet()
        });
        let a = device.stream(StreamId(0)).unwrap();
        let b = device.stream(StreamId(1)).unwrap();
        // 33 MiB live at most; b's MiB holds a granule (a page) of more,
        // so the device holds more than that once a's 32 are cached: past
        // a headroom of nothing.
        let b_small = b.reserve(MIB + 4096).unwrap();
        drop(a.reserve_many(&[8 * MIB; 4]).unwrap());
        a.report().unwrap();
        let cached = a.stats().bytes_reserved;
        assert!(cached >= 32 * MIB, "arenas {arenas}: {:?}", a.stats());
        // Served from a's cache: no growth, no round.
        let one = a.reserve(MIB).unwrap();
        a.report().unwrap();
        let kept = a.stats().bytes_reserved;
        if arenas && !budget {
            assert_eq!(kept, cached, "arenas keep their room");
        } else {
            assert!(kept < cached / 2, "pages trim: {kept} of {cached}");
        }
        drop((one, b_small));
        device.shutdown();
    }
}
