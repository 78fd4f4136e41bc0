//! A round ends on answers: stream A is short, stream B caches the page A
//! needs, and the budget holds one page. The real actors run their loops,
//! the real coordinator runs its loop: the coordinator asks B, B gives its
//! page back and answers, and only then is A told to retry — so A is
//! served on every interleaving (no timeout decides anything: time is not
//! modelled, the clock never moves).
//!
//! Fails ("A failed though B's page was there to give") when a round ends
//! before every stream it asked has answered (`Coordinator::start_next`
//! finishing a round at once; checked). The actor's timed poll is not
//! modelled (a receive with a timeout is a receive under loom), so the
//! rule that a request waiting for its round is not answered on a poll is
//! held by `tests/determinism.rs` instead.

#![cfg(streamalloc_loom)]

mod common;

use common::{caching_pages, run_wide_model, start};
use streamalloc::service::loom_support::{device_on, submit_reserve_many};

const PAGE: u64 = 4096;

#[test]
fn a_round_ends_only_when_every_stream_asked_has_answered() {
    run_wide_model(
        "a round ends on answers",
        "LOOM_ANSWERS_PREEMPTIONS",
        || {
            let mut device = device_on(2, caching_pages(PAGE), PAGE);
            let budget = device.budget.clone();
            let (b_handle, mut b_actor) = device.streams.pop().unwrap();
            let (a_handle, a_actor) = device.streams.pop().unwrap();
            // B had a page live, then cached it: the budget is full.
            drop(b_actor.reserve(PAGE).unwrap());
            b_actor.process_and_publish();
            assert_eq!(budget.granted(), PAGE, "B caches the only page");

            let a_answer = submit_reserve_many(&a_handle, vec![PAGE]);
            let running = start(device.coordinator, device.stop, vec![a_actor, b_actor]);

            let batch = a_answer
                .wait()
                .expect("A failed though B's page was there to give");
            assert_eq!(batch.len(), 1);
            assert!(budget.peak() <= PAGE);
            drop(batch);
            running.end(vec![a_handle, b_handle]);
            assert_eq!(budget.granted(), 0, "every byte back after the streams end");
        },
    );
}
