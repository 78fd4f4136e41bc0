//! A storage wrapper with a capacity and injected faults, for tests: it makes
//! "the device is full" and "the driver failed here" reproducible.

use super::{
    DeviceStorage, DriverOps, LooseHandle, Resource, StorageError, StorageHandle, StorageId,
    UseFence, UserStream,
};

/// Which operations a [`LimitedStorage`] fails on purpose. Counts are
/// 1-based over the storage's life: `fail_allocation(3)` fails the third
/// allocation attempt.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// Allocation attempts to fail.
    pub allocations: Vec<u64>,
    /// Copy attempts to fail.
    pub copies: Vec<u64>,
}

impl FaultPlan {
    /// No faults.
    pub fn none() -> Self {
        Self::default()
    }

    /// Also fail the `n`th allocation attempt.
    pub fn fail_allocation(mut self, n: u64) -> Self {
        self.allocations.push(n);
        self
    }

    /// Also fail the `n`th copy attempt.
    pub fn fail_copy(mut self, n: u64) -> Self {
        self.copies.push(n);
        self
    }
}

/// Wraps a storage with a byte capacity and a [`FaultPlan`].
#[derive(Debug)]
pub struct LimitedStorage<S> {
    /// The wrapped storage.
    inner: S,
    /// The most bytes it may hold (pending deallocations count, as on a device).
    capacity: u64,
    /// Faults to inject.
    faults: FaultPlan,
    /// Allocation attempts so far.
    allocations: u64,
    /// Copy attempts so far.
    copies: u64,
}

impl<S: DeviceStorage> LimitedStorage<S> {
    /// `inner` capped at `capacity` bytes, no faults.
    pub fn new(inner: S, capacity: u64) -> Self {
        Self {
            inner,
            capacity,
            faults: FaultPlan::none(),
            allocations: 0,
            copies: 0,
        }
    }

    /// Inject `faults` from now on.
    pub fn with_faults(mut self, faults: FaultPlan) -> Self {
        self.faults = faults;
        self
    }

    /// Change the capacity.
    pub fn set_capacity(&mut self, capacity: u64) {
        self.capacity = capacity;
    }

    /// Replace the fault plan (counts carry on).
    pub fn set_faults(&mut self, faults: FaultPlan) {
        self.faults = faults;
    }

    /// Allocation attempts so far (the count a [`FaultPlan`] refers to).
    pub fn allocation_attempts(&self) -> u64 {
        self.allocations
    }

    /// Copy attempts so far.
    pub fn copy_attempts(&self) -> u64 {
        self.copies
    }

    /// The wrapped storage.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S: DeviceStorage> DeviceStorage for LimitedStorage<S> {
    forward_to_inner!(inner: alignment, deallocate, flush, resource, write, read);
    forward_to_inner!(inner: bytes_allocated, granule, reserve_range, unmap);
    forward_to_inner!(inner: shares_a_budget, driver_ops, drain, bytes_in_reclaim, bytes_a_map_adds);
    forward_to_inner!(inner: bytes_stranded, whole_handles, first_handle_end);
    forward_to_inner!(inner: set_handle_cut);
    forward_to_inner!(inner: hold_spares, release_spares, bytes_spare);
    forward_to_inner!(inner: hand_over_spares, adopt_handles, pass_spares_on, take_passed_on);
    forward_to_inner!(inner: stream_name, fence_uses, uses_done, wait_uses, order_for);
    forward_to_inner!(inner: order_after);

    fn allocate(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        self.admit(size)?;
        self.inner.allocate(size)
    }

    fn copy(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        self.copies = self.copies.saturating_add(1);
        if self.faults.copies.contains(&self.copies) {
            return Err(StorageError::InjectedFault(format!(
                "copy #{} of {} bytes",
                self.copies, from.size
            )));
        }
        self.inner.copy(from, to)
    }

    /// A mapping is an allocation: counted, faulted and capped alike.
    fn map(&mut self, range: &StorageHandle) -> Result<(), StorageError> {
        self.admit(self.inner.bytes_a_map_adds(range))?;
        self.inner.map(range)
    }
}

impl<S: DeviceStorage> LimitedStorage<S> {
    /// Count an allocation (or mapping) of `size` bytes and refuse it if the
    /// plan says so or the cap would be passed.
    fn admit(&mut self, size: u64) -> Result<(), StorageError> {
        self.allocations = self.allocations.saturating_add(1);
        if self.faults.allocations.contains(&self.allocations) {
            return Err(StorageError::InjectedFault(format!(
                "allocation #{} of {size} bytes",
                self.allocations
            )));
        }
        let over = |inner: &S| inner.bytes_allocated().saturating_add(size) > self.capacity;
        if over(&self.inner) && self.inner.bytes_in_reclaim() > 0 {
            // What this storage gave back still waits behind fences: the
            // last try before running out waits for it.
            self.inner.drain();
        }
        let held = self.inner.bytes_allocated();
        if over(&self.inner) {
            return Err(StorageError::OutOfMemory {
                requested: size,
                held,
                capacity: self.capacity,
            });
        }
        Ok(())
    }
}
