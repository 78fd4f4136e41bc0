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
