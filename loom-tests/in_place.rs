//! Serving in place (`service/in_place.rs`): the actor's thread runs its
//! real loop on a loom thread while two clients of the stream reserve, one
//! of them first sending a reservation through the inbox without waiting
//! for it. Each client's requests are served in the order it made them,
//! whoever takes the actor's turn: the one sent ahead lands below the one
//! served after it on the empty page, and nothing is lost or left hanging
//! (a client whose request nobody serves, or a thread parked for good, is
//! a deadlock loom reports).
//!
//! Fails ("served out of order") when a client serves in place while a
//! request of its own is still queued (the `queued` check in
//! `SharedActor::serve_in_place` removed; checked): the actor's thread can
//! have taken the sent request off the inbox, or not yet, when the client
//! takes the turn first.

#![cfg(streamalloc_loom)]

mod common;

use common::{run_model, tiny_pages};
use streamalloc::service::loom_support::{stream_serving_in_place, submit_reserve_many};
use streamalloc::storage::VirtualStorage;

#[test]
fn a_client_is_served_in_the_order_it_asked() {
    run_model("requests served in place, in each client's order", || {
        let (handle, actor) =
            stream_serving_in_place(Box::new(VirtualStorage::new()), tiny_pages(), 2);
        let actor = loom::thread::spawn(move || actor.run());
        let other = handle.clone();
        let client = loom::thread::spawn(move || {
            let allocation = other.reserve(512).expect("served");
            assert_eq!(allocation.size(), 512);
        });
        let sent = submit_reserve_many(&handle, vec![1024]);
        let after = handle.reserve(1024).expect("served");
        let mut sent = sent.wait().expect("served");
        let sent = sent.pop().expect("one size, one allocation");
        let addr = |allocation| {
            handle
                .try_resolve(allocation)
                .expect("its own stream")
                .expect("a published address")
                .addr()
        };
        assert!(addr(&sent) < addr(&after), "served out of order");
        client.join().unwrap();
        drop((sent, after));
        // The last handle gone, the actor's receive ends and so does it.
        drop(handle);
        actor.join().unwrap();
    });
}
