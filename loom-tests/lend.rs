//! Lending between streams, with the real actors and coordinator on
//! threads of their own (`docs/service.md`, "Serving another stream").
//!
//! First: stream A caches a page; then A and B each ask for a page at
//! once, on a device whose headroom allows no growth past what it ever
//! had live. Whoever comes first, both are answered (A from its page or
//! by growing, B from A's page, lent, or by growing), no page is handed to
//! both, and every byte comes back once the streams end. Fails when the
//! lend jobs a turn leaves are not run by whoever ends it (the request
//! is never answered).
//!
//! Second: two streams lend to each other at once; fails (a deadlock)
//! when a job runs inside its asker's turn.

#![cfg(streamalloc_loom)]

mod common;

use common::{a_caches_a_page, caching_pages, run_wide_model, start, strict_headroom};
use streamalloc::service::loom_support::{device_lending, submit_reserve_many};

/// A page: large enough to be worth a round (at least 1 MiB).
const PAGE: u64 = 1 << 20;

#[test]
fn two_streams_asking_at_once_are_both_served_and_share_no_page() {
    run_wide_model("lending", "LOOM_LEND_PREEMPTIONS", || {
        // A budget far above what is used: only the headroom holds back.
        let strict = Some(strict_headroom());
        let mut device = device_lending(2, caching_pages(PAGE), 1 << 40, strict);
        let meter = device.budget.clone();
        let ((a_handle, a_actor), (b_handle, b_actor)) = a_caches_a_page(&mut device, PAGE);

        let a_answer = submit_reserve_many(&a_handle, vec![PAGE]);
        let b_answer = submit_reserve_many(&b_handle, vec![PAGE]);
        let running = start(device.coordinator, device.stop, vec![a_actor, b_actor]);

        let a_got = a_answer.wait().expect("growth is never refused");
        let b_got = b_answer.wait().expect("growth is never refused");
        let (a_id, b_id) = (a_got[0].id().unwrap(), b_got[0].id().unwrap());
        assert_ne!(a_id, b_id, "a page handed out twice");
        // Two pages live: the device holds two, never more.
        assert_eq!(meter.peak(), 2 * PAGE);
        drop((a_got, b_got));
        running.end(vec![a_handle, b_handle]);
        assert_eq!(meter.granted(), 0, "every byte back after the streams end");
    });
}

/// Two streams whose room is in pieces each ask, at once, for a block the
/// other's room seems to hold (enough bytes, never in one piece): each
/// job takes the other's turn while the other's job takes its own. Both
/// are refused, go on to a round and grow; neither waits for a turn the
/// other holds.
///
/// Fails (loom reports the deadlock) when a job runs inside its asker's
/// turn instead of after it: each stream then holds its own turn while
/// it waits for the other's.
#[test]
fn two_streams_lending_to_each_other_at_once_hold_one_turn_at_a_time() {
    run_wide_model("mutual lending", "LOOM_LEND_PREEMPTIONS", || {
        const MIB: u64 = 1 << 20;
        let strict = Some(strict_headroom());
        let mut device = device_lending(2, caching_pages(8 * MIB), 1 << 40, strict);
        let meter = device.budget.clone();
        let (b_handle, mut b_actor) = device.streams.pop().unwrap();
        let (a_handle, mut a_actor) = device.streams.pop().unwrap();
        let a_kept = room_in_pieces(&mut a_actor, MIB);
        let b_kept = room_in_pieces(&mut b_actor, MIB);

        let a_answer = submit_reserve_many(&a_handle, vec![4 * MIB]);
        let b_answer = submit_reserve_many(&b_handle, vec![4 * MIB]);
        let running = start(device.coordinator, device.stop, vec![a_actor, b_actor]);

        let a_got = a_answer.wait().expect("growth is never refused");
        let b_got = b_answer.wait().expect("growth is never refused");
        // No piece holds 4 MiB: each grew a page of its own, just large
        // enough (the device is past its headroom).
        assert_eq!(
            a_got[0].id().unwrap().stream,
            a_kept[0].0.id().unwrap().stream
        );
        assert_eq!(
            b_got[0].id().unwrap().stream,
            b_kept[0].0.id().unwrap().stream
        );
        assert_eq!(meter.granted(), 2 * 8 * MIB + 2 * 4 * MIB);
        drop((a_got, b_got, a_kept, b_kept));
        running.end(vec![a_handle, b_handle]);
        assert_eq!(meter.granted(), 0, "every byte back after the streams end");
    });
}

/// A page of 8 `unit`s holding two free blocks of 3 between pinned
/// allocations of 1 (pinned: no compaction makes them one): 6 units of
/// room, none of 4 in one piece. The pinned allocations, kept.
fn room_in_pieces(
    actor: &mut streamalloc::service::loom_support::ActorUnderTest,
    unit: u64,
) -> Vec<(streamalloc::memory::Allocation, streamalloc::memory::Pinned)> {
    let mut kept = Vec::new();
    let mut freed = Vec::new();
    for _ in 0..2 {
        freed.push(actor.reserve(3 * unit).unwrap());
        let one = actor.reserve(unit).unwrap();
        let pinned = actor.memory().pin(&one).unwrap();
        kept.push((one, pinned));
    }
    actor.publish();
    drop(freed);
    actor.process_and_publish();
    kept
}
