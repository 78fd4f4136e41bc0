//! A stream ending while a client still holds a pin: the real manager's
//! `release_unpinned` and `retire` (what the actor's thread runs after a
//! shutdown) race the client's last unpin. The pinned page is returned only
//! after the pin drops, whoever comes last; and it is returned.
//!
//! Fails when `retire` lets go of its own hold before it stores what frees
//! the pages (the last unpin finds nothing to run: "a page left behind"),
//! or when the last unpin of an orphaned cell does not tell the keeper
//! (the same), and when the stream returns every page at its end whatever
//! is pinned, as it did before ("freed under a live pin").

#![cfg(streamalloc_loom)]

mod common;

use common::{run_model, tiny_pages};
use loom::sync::Arc;
use streamalloc::service::loom_support::stream_on;
use streamalloc::storage::{BudgetedStorage, DeviceBudget, VirtualStorage};

/// The page `tiny_pages` carves.
const PAGE: u64 = 4096;

#[test]
fn a_pinned_page_outlives_the_stream_until_its_pin_drops() {
    run_model("retire racing the last unpin", || {
        // The budget sees a page go back only once its storage freed it.
        let budget = Arc::new(DeviceBudget::new(1 << 20));
        let storage = BudgetedStorage::new(VirtualStorage::new(), budget.clone());
        let (handle, mut actor) = stream_on(Box::new(storage), tiny_pages(), 2);
        let pinned_allocation = actor.reserve(1024).unwrap();
        let pin = actor.memory().pin(&pinned_allocation).unwrap();
        drop(pinned_allocation);
        let held = budget.clone();
        let client = loom::thread::spawn(move || {
            assert_eq!(held.held(), PAGE, "freed under a live pin");
            drop(pin);
        });
        actor.retire();
        client.join().unwrap();
        drop(handle);
        assert_eq!(budget.held(), 0, "a page left behind");
    });
}
