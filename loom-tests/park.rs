//! Park and wake with no lost wake-up: the actor runs its real loop on a
//! loom thread (a blocking receive, so it parks while its inbox is empty)
//! and two clients of the same stream reserve at once, each waiting in its
//! reply cell (`sync/reply.rs`): no spin (the models' streams spin zero
//! times), straight to the CAS that announces the waiter, then park. loom
//! tries every order of each client's announcement against the actor's
//! answer; a client that parks after its answer came, with nobody left to
//! unpark it, is a deadlock loom reports.
//!
//! Fails with its guard removed: when the waiter announces itself with a
//! plain store of `WAITING` instead of the CAS from `EMPTY` (an answer that
//! came first is overwritten and the client parks for good), and when the
//! sender unparks only on a load of the state taken before its swap (an
//! announcement between the two is missed). Each removal checked.

#![cfg(streamalloc_loom)]

mod common;

use common::{run_model, tiny_pages};
use streamalloc::service::loom_support::stream_on;
use streamalloc::storage::VirtualStorage;

#[test]
fn a_parked_client_is_woken_by_its_answer() {
    run_model("parked clients woken by their answers", || {
        let (handle, actor) = stream_on(Box::new(VirtualStorage::new()), tiny_pages(), 2);
        let actor = loom::thread::spawn(move || actor.run());
        let other = handle.clone();
        let client = loom::thread::spawn(move || {
            let allocation = other.reserve(512).expect("served");
            assert_eq!(allocation.size(), 512);
        });
        let allocation = handle.reserve(1024).expect("served");
        assert_eq!(allocation.size(), 1024);
        client.join().unwrap();
        drop(allocation);
        // The last handle gone, the actor's receive ends and so does it.
        drop(handle);
        actor.join().unwrap();
    });
}

#[test]
fn a_reply_cell_is_reused_across_requests() {
    // One client, two reserves in a row on the kept cell: the second wait
    // must not see the first answer's state, nor miss its own wake-up.
    run_model("a kept reply cell, two requests", || {
        let (handle, actor) = stream_on(Box::new(VirtualStorage::new()), tiny_pages(), 1);
        let actor = loom::thread::spawn(move || actor.run());
        let first = handle.reserve(256).expect("served");
        let second = handle.reserve(768).expect("served");
        assert_eq!((first.size(), second.size()), (256, 768));
        drop((first, second));
        drop(handle);
        actor.join().unwrap();
    });
}
