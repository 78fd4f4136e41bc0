//! A hot cache taken back while its client reserves: the client's take and
//! the actor's take-back race for the same slots, and every cached
//! allocation goes to exactly one of them. The client gets a fresh
//! allocation either way (from the cache, or from the actor once the cache
//! is empty), and once everything is dropped every page is back.
//!
//! A second model races a refill ahead: the client's hit takes the last
//! entry, which sends the actor a request to refill without waiting, and
//! the client reserves again at once, from the refill if the actor got
//! there first, through a round trip if not. The actor's offer fills an
//! empty slot with a CAS from null while the client takes with a swap, so
//! each spare is handed out once or goes back with the handle. It fails
//! ("a release was lost") when a cache that ends does not give back what a
//! refill that came after its handle's end put in it.
//!
//! Fails (loom reports the cell's `Arc` dropped once too often, or "an
//! entry was taken twice") when a slot is emptied with a load and a store
//! instead of one swap, on either side: both sides then read the same
//! pointer and both turn it back into a handle.

#![cfg(streamalloc_loom)]

mod common;

use common::{run_model, tiny_arena, tiny_pages};
use streamalloc::memory::{Cleanup, PageUpdate};
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

#[test]
fn a_cache_refilled_ahead_while_its_client_reserves_loses_nothing() {
    run_model("hot cache refilled ahead while its client reserves", || {
        let (handle, mut actor) = stream_on(Box::new(VirtualStorage::new()), tiny_arena(), 4);
        // What the stream holds makes the cache's part (1/256 of it) room
        // for one entry of 64 bytes.
        let weights = actor
            .memory()
            .reserve(16 * 1024, PageUpdate::Allow)
            .unwrap();
        actor.fill_hot(&handle, 64, 1);
        let client = loom::thread::spawn(move || {
            // The last entry: a refill ahead goes to the actor.
            let first = handle.reserve(64).expect("served");
            // From the refill, or from a round trip.
            let second = handle.reserve(64).expect("served");
            assert!(!first.same(&second), "one entry handed out twice");
            drop(handle);
            (first, second)
        });
        // Serves the refill ahead and any round trip; ends when the handle
        // is gone (its end takes back what the cache still holds).
        while actor.step() {}
        let (first, second) = client.join().unwrap();
        let (hits, _) = actor.hot_counts();
        assert!((1..=2).contains(&hits), "{hits} hits");
        drop((first, second, weights));
        actor.cleanup(Cleanup::Explicit);
        assert_eq!(actor.live_allocations(), 0, "a release was lost");
        assert_eq!(actor.bytes_allocated(), 0, "a page leaked");
    });
}
