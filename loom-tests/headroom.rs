//! A headroom round: stream A caches a page it no longer uses, stream B
//! needs a page, and the device may hold no more than it ever had live. The
//! real actors run their loops and the real coordinator runs its loop: B's
//! request is parked, A gives its page back, B is served, and the device
//! never holds two pages at once.
//!
//! Fails ("the device held two pages") when `serve_within_headroom` grows
//! at once instead of parking for the round, and deadlocks (loom reports
//! it) when a request parked for the headroom is not retried on `Retry`.

#![cfg(streamalloc_loom)]

mod common;

use common::{a_caches_a_page, caching_pages, run_wide_model, start, strict_headroom};
use streamalloc::service::loom_support::{device_with, submit_reserve_many};

/// A page: large enough to be worth a round (at least 1 MiB).
const PAGE: u64 = 1 << 20;

#[test]
fn a_growing_stream_gets_another_streams_cache_back_first() {
    run_wide_model("a headroom round", "LOOM_HEADROOM_PREEMPTIONS", || {
        // A budget far above what is used: only the headroom holds back.
        let strict = Some(strict_headroom());
        let mut device = device_with(2, caching_pages(PAGE), 1 << 40, strict);
        let meter = device.budget.clone();
        let ((a_handle, a_actor), (b_handle, b_actor)) = a_caches_a_page(&mut device, PAGE);

        let b_answer = submit_reserve_many(&b_handle, vec![PAGE]);
        let running = start(device.coordinator, device.stop, vec![a_actor, b_actor]);

        let batch = b_answer.wait().expect("growth is never refused");
        assert_eq!(batch.len(), 1);
        assert_eq!(meter.peak(), PAGE, "the device held two pages");
        drop(batch);
        running.end(vec![a_handle, b_handle]);
        assert_eq!(meter.granted(), 0, "every byte back after the streams end");
    });
}
