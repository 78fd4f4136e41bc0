//! Release racing cleanup: handles dropped on a client thread while the
//! actor runs an explicit cleanup. Nothing is lost: once the client is done
//! and the actor drains its queue, every page is back.
//!
//! Fails ("a release was lost", or loom's leaked-`Arc` check) when the
//! release queue's push publishes with a plain store instead of a CAS, or
//! when its drain takes the stack with a load and a store instead of one
//! swap: either way a cell pushed between the two is stranded.

#![cfg(streamalloc_loom)]

mod common;

use common::{run_model, tiny_pages};
use streamalloc::memory::Cleanup;
use streamalloc::service::loom_support::stream_on;
use streamalloc::storage::VirtualStorage;

#[test]
fn release_racing_cleanup_loses_nothing() {
    run_model("release racing cleanup", || {
        let (_handle, mut actor) = stream_on(Box::new(VirtualStorage::new()), tiny_pages(), 4);
        let a = actor.reserve(1024).unwrap();
        let b = actor.reserve(2048).unwrap();
        let client = loom::thread::spawn(move || {
            drop(a);
            drop(b);
        });
        actor.cleanup(Cleanup::Explicit);
        client.join().unwrap();
        actor.cleanup(Cleanup::Explicit);
        assert_eq!(actor.live_allocations(), 0, "a release was lost");
        assert_eq!(actor.bytes_allocated(), 0, "a page leaked");
    });
}
