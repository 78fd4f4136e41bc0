//! Budget grants: three streams' storages allocate against one device
//! budget at once. The bytes they hold together never pass the budget, and
//! every byte comes back once they free and flush.
//!
//! Fails when `DeviceBudget::try_grant` checks and adds in two steps (a load
//! then a store) instead of one CAS.

#![cfg(streamalloc_loom)]

mod common;

use common::run_model;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use streamalloc::storage::{BudgetedStorage, DeviceBudget, DeviceStorage, VirtualStorage};

const LIMIT: u64 = 10_000;
const PAGE: u64 = 6_000;

#[test]
fn grants_never_overshoot_and_nothing_is_lost() {
    run_model("budget grants", || {
        let budget = Arc::new(DeviceBudget::new(LIMIT));
        let held = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (budget, held) = (budget.clone(), held.clone());
                loom::thread::spawn(move || {
                    let mut storage = BudgetedStorage::new(VirtualStorage::new(), budget);
                    if let Ok(page) = storage.allocate(PAGE) {
                        let now = held.fetch_add(PAGE, Ordering::SeqCst) + PAGE;
                        assert!(
                            now <= LIMIT,
                            "storages hold {now} bytes of a {LIMIT} budget"
                        );
                        held.fetch_sub(PAGE, Ordering::SeqCst);
                        storage.deallocate(page.id);
                        storage.flush();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(budget.granted(), 0, "a grant was lost");
        assert!(budget.peak() <= LIMIT);
    });
}

/// A storage of 4 KiB granules drawing on `budget`.
fn granular(budget: Arc<DeviceBudget>) -> BudgetedStorage<VirtualStorage> {
    BudgetedStorage::new(VirtualStorage::with_granule(Some(GRANULE)), budget)
}

const GRANULE: u64 = 4096;

/// Handles passed on while another stream takes them (`storage/loose.rs`):
/// two givers each give back a one-granule handle and pass it on while
/// the asker takes what waits, maps two granules and lets the rest go.
/// Every handle passed on is mapped once or released once, and the
/// device's bytes are what its storages hold, whatever the interleaving.
///
/// Fails when the exchange is appended to in two steps (the handles read
/// under one lock, written back under another): a pass-on between them is
/// lost, and its bytes stay granted with no storage holding them.
#[test]
fn every_handle_passed_on_is_taken_once() {
    run_model("handles passed on", || {
        let budget = Arc::new(DeviceBudget::new(u64::MAX));
        let givers: Vec<_> = (0..2)
            .map(|_| {
                let budget = budget.clone();
                loom::thread::spawn(move || {
                    let mut storage = granular(budget);
                    let range = storage.reserve_range(16 * GRANULE).unwrap();
                    let first = range.sub_range(0, GRANULE).unwrap();
                    storage.map(&first).unwrap();
                    storage.hold_spares(true);
                    storage.unmap(&first);
                    storage.flush();
                    storage.pass_spares_on();
                    storage.hold_spares(false);
                    // Kept alive: a storage that drops takes what waits.
                    storage
                })
            })
            .collect();
        let mut asker = granular(budget.clone());
        let range = asker.reserve_range(16 * GRANULE).unwrap();
        asker.take_passed_on();
        asker
            .map(&range.sub_range(0, 2 * GRANULE).unwrap())
            .unwrap();
        asker.release_spares();
        let givers: Vec<_> = givers.into_iter().map(|t| t.join().unwrap()).collect();
        // What was passed on after the asker looked: taken now, unused.
        asker.take_passed_on();
        asker.release_spares();
        let ops = asker.driver_ops();
        let handed: u64 = givers
            .iter()
            .map(|giver| giver.driver_ops().handles_handed_over)
            .sum();
        assert_eq!(handed, 2);
        assert_eq!(
            ops.handles_adopted + ops.handles_released,
            handed,
            "each handle passed on mapped or released once: {ops:?}"
        );
        assert_eq!(ops.handles_adopted + ops.handles_created, 2);
        assert_eq!(budget.bytes_passed_on(), 0);
        let held: u64 = givers.iter().map(|giver| giver.bytes_allocated()).sum();
        assert_eq!(budget.held(), held + asker.bytes_allocated());
        assert_eq!(budget.held(), 2 * GRANULE);
    });
}
