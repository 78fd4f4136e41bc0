//! Lending between streams, with the real actors and coordinator on
//! threads of their own: stream A caches a page; then A and B each ask for
//! a page at once, on a device whose headroom allows no growth past what
//! it ever had live. Whoever comes first, both are answered (A from its
//! page or by growing, B from A's page, lent, or by growing), no page is
//! handed to both, and every byte comes back once the streams end.
//!
//! Fails (loom reports the deadlock) when a lender that cannot serve
//! answers no `Lent` notice, so that the round never goes on to the
//! givers and the asker is never retried (a lender asked on the room it
//! published, which its own request took meanwhile).

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
