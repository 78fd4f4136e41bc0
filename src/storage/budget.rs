//! The device budget: one per device, shared by every stream's storage.
//!
//! A page is allocated only after the budget grants its bytes, and the bytes
//! go back only once the storage has really freed the page (after its
//! flush). So the bytes all storages of a device hold never exceed the
//! budget, whatever the interleaving: a grant is one CAS that checks and
//! adds together.
//!
//! The budget also keeps the device's *exchange*: physical handles one
//! stream's storage passed on, unmapped and not released, for the stream
//! whose growth its give-back was for to adopt (`loose.rs`). Their bytes
//! stay held (granted) while they wait there: they move between storages,
//! never through the budget.

use super::{
    DeviceStorage, DriverOps, LooseHandle, Resource, StorageError, StorageHandle, StorageId,
    UseFence, UserStream,
};
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Arc, Mutex};

/// Bytes a device may hold, and how many are granted now.
#[derive(Debug)]
pub struct DeviceBudget {
    /// The most bytes that may be granted at once.
    limit: u64,
    /// Bytes granted now, grants whose allocation is still under way
    /// included (what the limit is checked against).
    granted: AtomicU64,
    /// Bytes of grants whose allocation succeeded (what the peak follows:
    /// a grant the storage then refuses never counts).
    held: AtomicU64,
    /// The most bytes held at once.
    peak: AtomicU64,
    /// Granules the device's storages have mapped now (`DriverOps`).
    granules: AtomicU64,
    /// The most granules mapped at once across the device's storages.
    peak_granules: AtomicU64,
    /// Handles passed on by one storage for another to adopt, oldest
    /// first: held, mapped nowhere.
    exchange: Mutex<Vec<LooseHandle>>,
}

impl DeviceBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            granted: AtomicU64::new(0),
            held: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            granules: AtomicU64::new(0),
            peak_granules: AtomicU64::new(0),
            exchange: Mutex::new(Vec::new()),
        }
    }

    /// A budget of `fraction` (0..=1) of a device of `total` bytes (for
    /// CUDA: `CudaStorage::device_memory().1`).
    pub fn fraction_of(total: u64, fraction: f64) -> Self {
        Self::new((total as f64 * fraction.clamp(0.0, 1.0)) as u64)
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes granted now.
    pub fn granted(&self) -> u64 {
        self.granted.load(Ordering::SeqCst)
    }

    /// Bytes of grants whose allocation succeeded and that are not given
    /// back yet: what the device's storages hold.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }

    /// The most bytes held at once: grants whose allocation succeeded.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::SeqCst)
    }

    /// The most granules the device's storages had mapped at once (what a
    /// driver must map at least once, however well it keeps them).
    pub fn peak_granules_mapped(&self) -> u64 {
        self.peak_granules.load(Ordering::SeqCst)
    }

    /// Bytes of the handles waiting in the exchange (held, mapped
    /// nowhere).
    pub fn bytes_passed_on(&self) -> u64 {
        (self.exchange.lock().iter()).fold(0, |sum, handle| sum.saturating_add(handle.bytes()))
    }

    /// Put `handles` in the exchange.
    fn pass_on(&self, handles: Vec<LooseHandle>) {
        if !handles.is_empty() {
            self.exchange.lock().extend(handles);
        }
    }

    /// Take every handle out of the exchange.
    fn take_passed_on(&self) -> Vec<LooseHandle> {
        std::mem::take(&mut *self.exchange.lock())
    }

    /// A storage's mapped granules went from `before` to `after`.
    fn granules_moved(&self, before: u64, after: u64) {
        let (up, down) = (after.saturating_sub(before), before.saturating_sub(after));
        if up > 0 {
            let now = self
                .granules
                .fetch_add(up, Ordering::SeqCst)
                .saturating_add(up);
            self.peak_granules.fetch_max(now, Ordering::SeqCst);
        } else if down > 0 {
            self.granules.fetch_sub(down, Ordering::SeqCst);
        }
    }

    /// Grant `bytes` if they fit under the limit, and count them as held at
    /// once (for a caller that holds the bytes as soon as they are granted).
    pub fn try_grant(&self, bytes: u64) -> bool {
        let granted = self.try_reserve(bytes);
        if granted {
            self.commit(bytes);
        }
        granted
    }

    /// Reserve `bytes` under the limit for an allocation about to be made;
    /// [`commit`](Self::commit) them once it succeeded, or
    /// [`give_back`](Self::give_back) them once it failed.
    fn try_reserve(&self, bytes: u64) -> bool {
        let mut granted = self.granted.load(Ordering::SeqCst);
        loop {
            let Some(after) = granted
                .checked_add(bytes)
                .filter(|after| *after <= self.limit)
            else {
                return false;
            };
            match self.granted.compare_exchange_weak(
                granted,
                after,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(now) => granted = now,
            }
        }
    }

    /// The allocation of `bytes` reserved earlier succeeded.
    fn commit(&self, bytes: u64) {
        // The limit bounds every grant, so held + bytes fits.
        let held = self
            .held
            .fetch_add(bytes, Ordering::SeqCst)
            .saturating_add(bytes);
        self.peak.fetch_max(held, Ordering::SeqCst);
    }

    /// Give back `bytes` granted (and held) earlier.
    pub fn give_back(&self, bytes: u64) {
        let before = self.held.fetch_sub(bytes, Ordering::SeqCst);
        debug_assert!(before >= bytes, "gave back more than was held");
        self.release(bytes);
    }

    /// Give back a reservation whose allocation failed (never held).
    fn release(&self, bytes: u64) {
        let before = self.granted.fetch_sub(bytes, Ordering::SeqCst);
        debug_assert!(before >= bytes, "gave back more than was granted");
    }
}

/// A storage whose pages are granted by a shared [`DeviceBudget`] first.
#[derive(Debug)]
pub struct BudgetedStorage<S: DeviceStorage> {
    /// The storage that holds the pages.
    inner: S,
    /// The device's budget.
    budget: Arc<DeviceBudget>,
}

impl<S: DeviceStorage> BudgetedStorage<S> {
    /// `inner`, drawing on `budget`.
    pub fn new(inner: S, budget: Arc<DeviceBudget>) -> Self {
        Self { inner, budget }
    }

    /// The budget it draws on.
    pub fn budget(&self) -> &Arc<DeviceBudget> {
        &self.budget
    }
}

impl<S: DeviceStorage> BudgetedStorage<S> {
    /// Reserve `bytes` of the budget for an allocation or a map about to
    /// be made. Refused, while bytes this storage gave back still wait
    /// behind fences: the last try before running out waits for them.
    /// `bytes` says how many, asked again after a drain (a map's granules
    /// that were on their way back are gone then); the bytes reserved.
    fn reserve(&mut self, bytes: impl Fn(&S) -> u64) -> Result<u64, StorageError> {
        let asked = bytes(&self.inner);
        if self.budget.try_reserve(asked) {
            return Ok(asked);
        }
        // Handles still waiting in the exchange (passed on for a round
        // that ended without them: its episode timed out) are held
        // memory no stream maps: adopted here, the map may use them, and
        // what it cannot goes back with the spares below.
        if self.budget.bytes_passed_on() > 0 {
            self.take_passed_on();
            let asked = bytes(&self.inner);
            if self.budget.try_reserve(asked) {
                return Ok(asked);
            }
        }
        // Spare handles the map could not move go back before it creates
        // any; here, before the grant, where their bytes are what it lacks.
        if self.inner.bytes_spare() > 0 {
            self.settle(S::release_spares);
            let asked = bytes(&self.inner);
            if self.budget.try_reserve(asked) {
                return Ok(asked);
            }
        }
        if self.inner.bytes_in_reclaim() > 0 {
            self.drain();
            let asked = bytes(&self.inner);
            if self.budget.try_reserve(asked) {
                return Ok(asked);
            }
        }
        let bytes = bytes(&self.inner);
        Err(StorageError::OutOfMemory {
            requested: bytes,
            held: self.budget.granted(),
            capacity: self.budget.limit(),
        })
    }

    /// Run `give_back` on the storage, and give the budget the bytes it
    /// freed.
    fn settle(&mut self, give_back: impl FnOnce(&mut S)) {
        let before = self.inner.bytes_allocated();
        let granules = self.inner.driver_ops().granules_mapped();
        give_back(&mut self.inner);
        let freed = before.saturating_sub(self.inner.bytes_allocated());
        self.budget.give_back(freed);
        self.budget
            .granules_moved(granules, self.inner.driver_ops().granules_mapped());
    }
}

impl<S: DeviceStorage> DeviceStorage for BudgetedStorage<S> {
    // Address space costs nothing (`reserve_range`): only mapped bytes are
    // granted. Unmapped bytes go back when the storage has let them go.
    forward_to_inner!(inner: alignment, deallocate, resource, write, read, copy, slide);
    forward_to_inner!(inner: bytes_allocated, granule, reserve_range, unmap, driver_ops);
    forward_to_inner!(inner: bytes_in_reclaim, bytes_stranded, bytes_a_map_adds);
    forward_to_inner!(inner: whole_handles, first_handle_end, hold_spares, bytes_spare);
    forward_to_inner!(inner: set_handle_cut, hand_over_spares, adopt_handles);
    forward_to_inner!(inner: stream_name, fence_uses, uses_done, wait_uses, order_for);
    forward_to_inner!(inner: order_after);

    /// Into the budget's exchange: their bytes stay granted, as the
    /// device still holds them; the granules they leave unmapped are
    /// counted off the device's.
    fn pass_spares_on(&mut self) {
        let granules = self.inner.driver_ops().granules_mapped();
        let handles = self.inner.hand_over_spares();
        self.budget
            .granules_moved(granules, self.inner.driver_ops().granules_mapped());
        self.budget.pass_on(handles);
        // Anything the storage would not hand over goes as before.
        self.release_spares();
    }

    /// Out of the budget's exchange, with no grant: the device held their
    /// bytes all along. Any the storage refuses go back in.
    fn take_passed_on(&mut self) {
        let handles = self.budget.take_passed_on();
        if !handles.is_empty() {
            let refused = self.inner.adopt_handles(handles);
            self.budget.pass_on(refused);
        }
    }

    fn allocate(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        self.reserve(|_| size)?;
        match self.inner.allocate(size) {
            Ok(handle) => {
                self.budget.commit(size);
                Ok(handle)
            }
            Err(err) => {
                self.budget.release(size);
                Err(err)
            }
        }
    }

    fn flush(&mut self) {
        self.settle(S::flush);
    }

    fn drain(&mut self) {
        self.settle(S::drain);
    }

    fn release_spares(&mut self) {
        self.settle(S::release_spares);
    }

    /// The budget is the device's, shared by every stream's storage (an
    /// unlimited one refuses nothing).
    fn shares_a_budget(&self) -> bool {
        self.budget.limit() < u64::MAX || self.inner.shares_a_budget()
    }

    /// Granted before it is mapped, as a page is before it is allocated;
    /// granules taken back before they went were never given back to the
    /// budget, so only the bytes the map added are held anew.
    fn map(&mut self, range: &StorageHandle) -> Result<(), StorageError> {
        let asked = self.reserve(|inner| inner.bytes_a_map_adds(range))?;
        let granules = self.inner.driver_ops().granules_mapped();
        let before = self.inner.bytes_allocated();
        match self.inner.map(range) {
            Ok(()) => {
                // It created what it said it would (`asked`), after it
                // released the spares it did not move: those first, so the
                // peak counts no moment the storage never had.
                let after = self.inner.bytes_allocated();
                let released = before.saturating_add(asked).saturating_sub(after);
                self.budget.give_back(released);
                let added = after.saturating_sub(before.saturating_sub(released));
                debug_assert_eq!(added, asked, "a map adds what it said it would");
                self.budget.commit(added.min(asked));
                self.budget.release(asked.saturating_sub(added));
                self.budget
                    .granules_moved(granules, self.inner.driver_ops().granules_mapped());
                Ok(())
            }
            Err(err) => {
                // Refused: what was granted for it goes back, and so do
                // the bytes of what the storage gave up on the way (the
                // spares and adopted handles a refused map lets go).
                self.budget.release(asked);
                let after = self.inner.bytes_allocated();
                self.budget.give_back(before.saturating_sub(after));
                self.budget
                    .granules_moved(granules, self.inner.driver_ops().granules_mapped());
                Err(err)
            }
        }
    }
}

impl<S: DeviceStorage> Drop for BudgetedStorage<S> {
    fn drop(&mut self) {
        // Handles still waiting in the exchange go with the storage that
        // drops while they wait (a round's asker that stopped before its
        // retry): adopted, so they are released with what it holds.
        self.take_passed_on();
        // The inner storage frees whatever it still holds as it drops (a
        // failed stream's pages, say): those bytes go back to the budget.
        self.budget.give_back(self.inner.bytes_allocated());
        self.budget
            .granules_moved(self.inner.driver_ops().granules_mapped(), 0);
    }
}

#[cfg(all(test, not(streamalloc_loom)))]
mod tests {
    use super::*;
    use crate::storage::VirtualStorage;

    #[test]
    fn grants_never_pass_the_limit_and_come_back_after_flush() {
        let budget = Arc::new(DeviceBudget::new(10_000));
        let mut a = BudgetedStorage::new(VirtualStorage::new(), budget.clone());
        let mut b = BudgetedStorage::new(VirtualStorage::new(), budget.clone());
        let page = a.allocate(6000).unwrap();
        assert!(matches!(
            b.allocate(5000),
            Err(StorageError::OutOfMemory { .. })
        ));
        a.deallocate(page.id);
        assert_eq!(budget.granted(), 6000, "not back before the flush");
        a.flush();
        assert_eq!(budget.granted(), 0);
        let kept = b.allocate(5000).unwrap();
        drop(b);
        assert_eq!(
            budget.granted(),
            0,
            "a dropped storage gives its bytes back"
        );
        let _ = kept;
        assert_eq!(budget.peak(), 6000);
        assert_eq!(DeviceBudget::fraction_of(1000, 0.5).limit(), 500);
    }
}
