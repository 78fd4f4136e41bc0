//! Two streams short at once: each has a cached page, the budget holds two
//! pages, and both ask for two pages at the same moment. The real actors run
//! their loops, the real coordinator runs its loop; nobody deadlocks (loom
//! reports any), each request is served or fails with `OutOfMemory`, the
//! budget is never passed, and every byte comes back at the end.
//!
//! Fails when `StreamEntry::send` (`service/registry.rs`) sends control without
//! waking the actor (an actor blocked on its inbox never sees `GiveBack`, so
//! the episode, and the short stream's caller, wait forever).

#![cfg(streamalloc_loom)]

mod common;

use common::{caching_pages, run_wide_model, start};
use streamalloc::service::ServiceError;
use streamalloc::service::loom_support::{device_on, submit_reserve_many};

const PAGE: u64 = 4096;

#[test]
fn two_streams_short_at_once_are_served_or_fail_cleanly() {
    // Four threads with channels: one preemption keeps the model inside
    // CI's time; `LOOM_TWO_SHORT_PREEMPTIONS=2` runs the deeper search
    // (about eight minutes on two cores).
    run_wide_model(
        "two streams short at once",
        "LOOM_TWO_SHORT_PREEMPTIONS",
        || {
            let mut device = device_on(2, caching_pages(PAGE), 2 * PAGE);
            let budget = device.budget.clone();
            let (b_handle, mut b_actor) = device.streams.pop().unwrap();
            let (a_handle, mut a_actor) = device.streams.pop().unwrap();
            drop(a_actor.reserve(PAGE).unwrap());
            drop(b_actor.reserve(PAGE).unwrap());
            // Published, as an actor does before it answers: each sees
            // the other's cached page, so a round is worth asking for.
            a_actor.process_and_publish();
            b_actor.process_and_publish();
            assert_eq!(budget.granted(), 2 * PAGE, "both pages cached");

            let a_answer = submit_reserve_many(&a_handle, vec![PAGE, PAGE]);
            let b_answer = submit_reserve_many(&b_handle, vec![PAGE, PAGE]);
            let running = start(device.coordinator, device.stop, vec![a_actor, b_actor]);

            let mut served = 0;
            for answer in [a_answer.wait(), b_answer.wait()] {
                match answer {
                    Ok(batch) => {
                        served += 1;
                        assert_eq!(batch.len(), 2);
                    }
                    Err(ServiceError::OutOfMemory(report)) => {
                        assert_eq!(report.requested, 2 * PAGE)
                    }
                    Err(other) => panic!("unexpected {other:?}"),
                }
                assert!(budget.granted() <= 2 * PAGE);
            }
            assert!(served <= 1, "two pages each cannot both fit in two pages");
            running.end(vec![a_handle, b_handle]);
            assert!(budget.peak() <= 2 * PAGE);
            assert_eq!(budget.granted(), 0, "every byte back after the streams end");
        },
    );
}
