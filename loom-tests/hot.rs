//! A hot cache taken back while its client reserves: the client's take and
//! the actor's take-back race for the same slots, and every cached
//! allocation goes to exactly one of them. The client gets a fresh
//! allocation either way (from the cache, or from the actor once the cache
//! is empty), and once everything is dropped every page is back.
//!
//! Fails (loom reports the cell's `Arc` dropped once too often, or "an
//! entry was taken twice") when a slot is emptied with a load and a store
//! instead of one swap, on either side: both sides then read the same
//! pointer and both turn it back into a handle.

#![cfg(streamalloc_loom)]

mod common;

use common::{run_model, tiny_pages};
use streamalloc::memory::Cleanup;
use streamalloc::service::loom_support::stream_on;
use streamalloc::storage::VirtualStorage;

#[test]
fn a_cache_taken_back_while_its_client_reserves_loses_nothing() {
    run_model("hot cache taken back while its client reserves", || {
        let (handle, mut actor) = stream_on(Box::new(VirtualStorage::new()), tiny_pages(), 4);
        actor.fill_hot(&handle, 1024, 2);
        let client = loom::thread::spawn(move || {
            let allocation = handle.reserve(1024).expect("served");
            assert_eq!(allocation.size(), 1024);
            drop(handle);
            allocation
        });
        actor.take_back_hot();
        // Serves the client's round trip if its cache was empty by then;
        // ends when its handle is gone.
        while actor.step() {}
        let allocation = client.join().unwrap();
        // Each entry went one way: to the client, back to the actor, or
        // back with the handle's end (uncounted); never two.
        let (hits, taken_back) = actor.hot_counts();
        assert!(
            hits <= 1 && hits + taken_back <= 2,
            "an entry was taken twice"
        );
        drop(allocation);
        actor.cleanup(Cleanup::Explicit);
        assert_eq!(actor.live_allocations(), 0, "a release was lost");
        assert_eq!(actor.bytes_allocated(), 0, "a page leaked");
    });
}
