//! Methods that several storages implement alike, written once: what a
//! wrapping storage passes to the storage it wraps unchanged
//! (`BudgetedStorage`, `LimitedStorage`), and `copy` and `slide` for a
//! storage that moves overlapping bytes in one call (`HostStorage`,
//! `VirtualStorage`).

/// Implement the named `DeviceStorage` methods by calling the same method
/// of the field `$inner`: `forward_to_inner!(inner: alignment, granule);`
/// inside an `impl DeviceStorage`.
macro_rules! forward_to_inner {
    ($inner:ident: $($method:ident),+ $(,)?) => {
        $(forward_to_inner!(@one $inner $method);)+
    };
    (@one $inner:ident alignment) => {
        fn alignment(&self) -> u64 {
            self.$inner.alignment()
        }
    };
    (@one $inner:ident deallocate) => {
        fn deallocate(&mut self, id: StorageId) {
            self.$inner.deallocate(id)
        }
    };
    (@one $inner:ident flush) => {
        fn flush(&mut self) {
            self.$inner.flush()
        }
    };
    (@one $inner:ident drain) => {
        fn drain(&mut self) {
            self.$inner.drain()
        }
    };
    (@one $inner:ident bytes_in_reclaim) => {
        fn bytes_in_reclaim(&self) -> u64 {
            self.$inner.bytes_in_reclaim()
        }
    };
    (@one $inner:ident bytes_stranded) => {
        fn bytes_stranded(&self) -> u64 {
            self.$inner.bytes_stranded()
        }
    };
    (@one $inner:ident hold_spares) => {
        fn hold_spares(&mut self, hold: bool) {
            self.$inner.hold_spares(hold)
        }
    };
    (@one $inner:ident bytes_spare) => {
        fn bytes_spare(&self) -> u64 {
            self.$inner.bytes_spare()
        }
    };
    (@one $inner:ident stream_name) => {
        fn stream_name(&self) -> Option<UserStream> {
            self.$inner.stream_name()
        }
    };
    (@one $inner:ident fence_uses) => {
        fn fence_uses(&mut self, users: &[UserStream]) -> Result<UseFence, StorageError> {
            self.$inner.fence_uses(users)
        }
    };
    (@one $inner:ident uses_done) => {
        fn uses_done(&mut self, fence: UseFence) -> bool {
            self.$inner.uses_done(fence)
        }
    };
    (@one $inner:ident wait_uses) => {
        fn wait_uses(&mut self, fence: UseFence) {
            self.$inner.wait_uses(fence)
        }
    };
    (@one $inner:ident order_for) => {
        fn order_for(&mut self, user: UserStream) -> Result<(), StorageError> {
            self.$inner.order_for(user)
        }
    };
    (@one $inner:ident order_after) => {
        fn order_after(&mut self, users: &[UserStream]) -> Result<(), StorageError> {
            self.$inner.order_after(users)
        }
    };
    (@one $inner:ident release_spares) => {
        fn release_spares(&mut self) {
            self.$inner.release_spares()
        }
    };
    (@one $inner:ident hand_over_spares) => {
        fn hand_over_spares(&mut self) -> Vec<LooseHandle> {
            self.$inner.hand_over_spares()
        }
    };
    (@one $inner:ident adopt_handles) => {
        fn adopt_handles(&mut self, handles: Vec<LooseHandle>) -> Vec<LooseHandle> {
            self.$inner.adopt_handles(handles)
        }
    };
    (@one $inner:ident pass_spares_on) => {
        fn pass_spares_on(&mut self) {
            self.$inner.pass_spares_on()
        }
    };
    (@one $inner:ident take_passed_on) => {
        fn take_passed_on(&mut self) {
            self.$inner.take_passed_on()
        }
    };
    (@one $inner:ident whole_handles) => {
        fn whole_handles(&self, range: &StorageHandle) -> StorageHandle {
            self.$inner.whole_handles(range)
        }
    };
    (@one $inner:ident set_handle_cut) => {
        fn set_handle_cut(&mut self, cut: super::HandleCut) {
            self.$inner.set_handle_cut(cut)
        }
    };
    (@one $inner:ident first_handle_end) => {
        fn first_handle_end(&self, range: &StorageHandle) -> u64 {
            self.$inner.first_handle_end(range)
        }
    };
    (@one $inner:ident bytes_a_map_adds) => {
        fn bytes_a_map_adds(&self, range: &StorageHandle) -> u64 {
            self.$inner.bytes_a_map_adds(range)
        }
    };
    (@one $inner:ident resource) => {
        fn resource(&mut self, handle: &StorageHandle) -> Result<Resource, StorageError> {
            self.$inner.resource(handle)
        }
    };
    (@one $inner:ident write) => {
        fn write(&mut self, handle: &StorageHandle, data: &[u8]) -> Result<(), StorageError> {
            self.$inner.write(handle, data)
        }
    };
    (@one $inner:ident read) => {
        fn read(&mut self, handle: &StorageHandle, out: &mut [u8]) -> Result<(), StorageError> {
            self.$inner.read(handle, out)
        }
    };
    (@one $inner:ident copy) => {
        fn copy(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
            self.$inner.copy(from, to)
        }
    };
    (@one $inner:ident slide) => {
        fn slide(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
            self.$inner.slide(from, to)
        }
        fn stage(&mut self, moving: &super::StagedMove) -> Result<(), StorageError> {
            self.$inner.stage(moving)
        }
    };
    (@one $inner:ident bytes_allocated) => {
        fn bytes_allocated(&self) -> u64 {
            self.$inner.bytes_allocated()
        }
    };
    (@one $inner:ident granule) => {
        fn granule(&self) -> Option<u64> {
            self.$inner.granule()
        }
    };
    (@one $inner:ident reserve_range) => {
        fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
            self.$inner.reserve_range(size)
        }
    };
    (@one $inner:ident unmap) => {
        fn unmap(&mut self, range: &StorageHandle) {
            self.$inner.unmap(range)
        }
    };
    (@one $inner:ident shares_a_budget) => {
        fn shares_a_budget(&self) -> bool {
            self.$inner.shares_a_budget()
        }
    };
    (@one $inner:ident driver_ops) => {
        fn driver_ops(&self) -> DriverOps {
            self.$inner.driver_ops()
        }
        fn set_driver_path(&mut self, path: super::DriverPath) -> super::DriverPath {
            self.$inner.set_driver_path(path)
        }
        fn driver_paths(&self) -> super::DriverPaths {
            self.$inner.driver_paths()
        }
    };
}

/// Implement `copy`, `slide` and `stage` for a storage whose
/// `$move(from, to)` handles overlapping ranges (a `memmove`): a slide or a
/// staged move is one call, counted as the copies a device would queue for
/// it.
macro_rules! copy_and_slide_by {
    ($move:ident) => {
        fn copy(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
            self.$move(from, to)?;
            self.ops.copied(from.size);
            Ok(())
        }

        fn slide(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
            let distance = super::check_slide(from, to)?;
            self.$move(from, to)?;
            self.ops.slid(from.size, distance);
            Ok(())
        }

        fn stage(&mut self, moving: &super::StagedMove) -> Result<(), StorageError> {
            // One overlapping move where a device makes two a piece (the
            // staging block's bytes are free: what lands there is garbage).
            super::check_slide(&moving.source, &moving.target)?;
            self.$move(&moving.source, &moving.target)?;
            self.ops.staged(moving.source.size, moving.staging.size);
            Ok(())
        }
    };
}

/// Implement `fence_uses`, `uses_done`, `wait_uses`, `order_for` and
/// `order_after` for a
/// storage that models its device, whose fences lag its own flushes
/// (`self.clock`), counting on `self.ops` what a device would
/// (`storage/uses.rs`).
macro_rules! uses_lagged_by_clock {
    () => {
        fn fence_uses(&mut self, users: &[UserStream]) -> Result<UseFence, StorageError> {
            Ok(super::uses::fence_lagged(&self.clock, users, &mut self.ops))
        }

        fn uses_done(&mut self, fence: UseFence) -> bool {
            super::uses::done_lagged(&self.clock, fence, &mut self.ops)
        }

        fn wait_uses(&mut self, fence: UseFence) {
            super::uses::wait_lagged(&self.clock, fence, &mut self.ops);
        }

        fn order_for(&mut self, user: UserStream) -> Result<(), StorageError> {
            let _ = user;
            self.ops.ordered_stream();
            Ok(())
        }

        fn order_after(&mut self, users: &[UserStream]) -> Result<(), StorageError> {
            for _ in users {
                self.ops.ordered_stream();
            }
            Ok(())
        }
    };
}

/// Implement `driver_ops`, `set_driver_path` and `driver_paths` for a
/// storage that counts its operations in `self.ops` and keeps them by path
/// in `self.paths` (a [`PathLedger`](super::PathLedger)).
macro_rules! counts_driver_ops {
    () => {
        fn driver_ops(&self) -> DriverOps {
            self.ops
        }

        fn set_driver_path(&mut self, path: super::DriverPath) -> super::DriverPath {
            self.paths.switch(&self.ops, path)
        }

        fn driver_paths(&self) -> super::DriverPaths {
            self.paths.paths(&self.ops)
        }
    };
}
