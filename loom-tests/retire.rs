//! A stream ending while a client still holds a pin: the real manager's
//! `release_unpinned` and `retire` (what the actor's thread runs after a
//! shutdown) race the client's last unpin. The pinned page is returned only
//! after the pin drops, whoever comes last; and it is returned.
//!
//! Fails when `retire` lets go of its own hold before it stores what frees
//! the pages (the last unpin finds nothing to run: "a page left behind"),
//! or when the last unpin of an orphaned cell does not tell the keeper
//! (the same). "freed under a live pin" guards the other way round.

#![cfg(streamalloc_loom)]

mod common;

use common::{run_model, tiny_pages};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering};
use streamalloc::service::loom_support::stream_on;
use streamalloc::storage::{
    BudgetedStorage, DeviceBudget, DeviceStorage, Resource, StorageError, StorageHandle, StorageId,
    VirtualStorage,
};

/// A storage that notes when it returns pages to the device.
#[derive(Debug)]
struct Noting {
    inner: VirtualStorage,
    returned: Arc<AtomicBool>,
}

impl DeviceStorage for Noting {
    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }
    fn allocate(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        self.inner.allocate(size)
    }
    fn deallocate(&mut self, id: StorageId) {
        self.inner.deallocate(id)
    }
    fn flush(&mut self) {
        let before = self.inner.bytes_allocated();
        self.inner.flush();
        if self.inner.bytes_allocated() < before {
            self.returned.store(true, Ordering::SeqCst);
        }
    }
    fn resource(&mut self, handle: &StorageHandle) -> Result<Resource, StorageError> {
        self.inner.resource(handle)
    }
    fn write(&mut self, handle: &StorageHandle, data: &[u8]) -> Result<(), StorageError> {
        self.inner.write(handle, data)
    }
    fn read(&mut self, handle: &StorageHandle, out: &mut [u8]) -> Result<(), StorageError> {
        self.inner.read(handle, out)
    }
    fn copy(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        self.inner.copy(from, to)
    }
    fn bytes_allocated(&self) -> u64 {
        self.inner.bytes_allocated()
    }
}

#[test]
fn a_pinned_page_outlives_the_stream_until_its_pin_drops() {
    run_model("retire racing the last unpin", || {
        let returned = Arc::new(AtomicBool::new(false));
        let budget = Arc::new(DeviceBudget::new(1 << 20));
        let storage = BudgetedStorage::new(
            Noting {
                inner: VirtualStorage::new(),
                returned: returned.clone(),
            },
            budget.clone(),
        );
        let (handle, mut actor) = stream_on(Box::new(storage), tiny_pages(), 2);
        let pinned_allocation = actor.reserve(1024).unwrap();
        let pin = actor.memory().pin(&pinned_allocation).unwrap();
        drop(pinned_allocation);
        let seen = returned.clone();
        let client = loom::thread::spawn(move || {
            assert!(!seen.load(Ordering::SeqCst), "freed under a live pin");
            drop(pin);
        });
        actor.retire();
        client.join().unwrap();
        drop(handle);
        assert_eq!(budget.held(), 0, "a page left behind");
        assert!(returned.load(Ordering::SeqCst));
    });
}
