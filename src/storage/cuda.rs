//! Device pages of an NVIDIA GPU through the CUDA driver API (`cudarc`,
//! loaded at run time, so the crate builds without a CUDA toolkit).
//!
//! The long form: `docs/modules.md`, "`src/storage/cuda.rs`".

use super::cuda_fence::CudaFence;
use super::cuda_vmm::{self, CudaRange};
use super::give_back::GiveBack;
use super::id_map::IdMap;
use super::loose::Adopted;
use super::{
    DeviceStorage, DriverOps, HandleCut, HandleSize, LooseHandle, Mapping, PathLedger, Resource,
    StorageError, StorageHandle, StorageId, UseFence, UserStream, check_range,
};
use crate::saturating::SaturatingSum;
use crate::sync::foreign::Arc;
use cudarc::driver::sys::{self, CUdeviceptr, CUevent};
use cudarc::driver::{CudaContext, CudaStream, DriverError, result};

mod reclaim;
mod uses;

/// Page starts are at least this aligned (the driver guarantees 256 bytes).
const CUDA_ALIGNMENT: u64 = 256;

/// One device page.
#[derive(Debug)]
struct CudaPage {
    /// Device address of its first byte.
    ptr: CUdeviceptr,
    /// Bytes.
    size: u64,
}

/// Device memory on one CUDA stream.
#[derive(Debug)]
pub struct CudaStorage {
    /// The device's context (shared by every stream of the device).
    context: Arc<CudaContext>,
    /// This storage's stream.
    stream: Arc<CudaStream>,
    /// Live pages.
    pages: IdMap<CudaPage>,
    /// The next id; never reused.
    next_id: u64,
    /// Bytes held, those queued to go back included.
    bytes: u64,
    /// The device's ordinal (where physical granules are placed).
    ordinal: i32,
    /// The granule of the device's virtual memory; `None`: pages only.
    granule: Option<u64>,
    /// The most granules one physical handle covers.
    handle_size: HandleSize,
    /// Reserved ranges of address space.
    ranges: IdMap<CudaRange>,
    /// Pages, ranges and granules given back, queued or behind fences.
    give_back: GiveBack<CudaFence>,
    /// The driver calls made so far (`driver.rs`).
    ops: DriverOps,
    /// The operations by the path that asked for them.
    paths: PathLedger,
    /// Work on this storage's memory is queued on streams it does not
    /// know (a PyTorch program's): before memory goes back, wait for the
    /// whole device, not this storage's stream.
    foreign_streams: bool,
    /// Bytes freed outside a flush (an allocation or a map short of
    /// memory waited for them): they leave `bytes` at the next flush,
    /// where whatever meters this storage (a budget) sees them go.
    freed_uncounted: u64,
    /// Whether handles given back are kept as spares (`hold_spares`).
    hold_spares: bool,
    /// Handles another storage of the device handed over, unmapped.
    adopted: Adopted,
    /// Fences on the streams that used memory released since
    /// (`fence_uses`): their events, by the fence's id.
    uses: std::collections::HashMap<u64, Vec<CUevent>>,
    /// The id the next use fence gets.
    next_use: u64,
}

fn driver(err: DriverError) -> StorageError {
    StorageError::Driver(format!("{err:?}"))
}

/// Whether a CUDA driver library can be loaded here. Asking first matters:
/// cudarc panics, rather than returning an error, when it cannot load it.
pub fn cuda_available() -> bool {
    // SAFETY: only tries to open the library; no symbol is called.
    unsafe { sys::is_culib_present() }
}

impl CudaStorage {
    /// The context of device `ordinal`, or a typed error: no driver
    /// library, no such device, or a driver failure.
    pub fn context(ordinal: usize) -> Result<Arc<CudaContext>, StorageError> {
        if !cuda_available() {
            return Err(StorageError::Driver(
                "no CUDA driver library (libcuda.so) found".into(),
            ));
        }
        let count = CudaContext::device_count().map_err(driver)?;
        if ordinal >= count.max(0) as usize {
            return Err(StorageError::Driver(format!(
                "no CUDA device {ordinal} ({count} present)"
            )));
        }
        CudaContext::new(ordinal).map_err(driver)
    }

    /// A storage on device `ordinal`, on a new stream.
    pub fn new(ordinal: usize) -> Result<Self, StorageError> {
        Self::on_context(Self::context(ordinal)?)
    }

    /// A storage on a new stream of `context` (one per stream actor).
    pub fn on_context(context: Arc<CudaContext>) -> Result<Self, StorageError> {
        let stream = context.new_stream().map_err(driver)?;
        Self::on_stream(context, stream)
    }

    /// A storage that orders its work on `stream`, a CUDA stream of
    /// `context` that other code made and keeps (PyTorch's): it is used,
    /// never destroyed. Memory goes back after that stream is done with
    /// it, as for a stream of its own.
    ///
    /// # Safety
    /// `stream` is a live stream of `context`, and stays alive as long as
    /// the storage.
    pub unsafe fn on_borrowed_stream(
        context: Arc<CudaContext>,
        stream: sys::CUstream,
    ) -> Result<Self, StorageError> {
        // SAFETY: the caller promises the stream lives as long as this.
        let stream = unsafe { context.wrap_borrowed_stream(stream) };
        Self::on_stream(context, stream)
    }

    /// A storage that orders its work on `context`'s legacy default stream
    /// (the null stream, which a PyTorch program's default stream is).
    /// Memory goes back once an event recorded there after its last use
    /// has passed, as on any stream: nothing waits. The legacy stream runs
    /// an operation only after the earlier work of every blocking stream,
    /// so the event covers those too; work on non-blocking streams (the
    /// ones PyTorch's pools make) that uses this memory is declared with
    /// `record_use` (PyTorch's `record_stream`), as for any other stream.
    pub fn on_default_stream(context: Arc<CudaContext>) -> Result<Self, StorageError> {
        let stream = context.default_stream();
        Self::on_stream(context, stream)
    }

    fn on_stream(context: Arc<CudaContext>, stream: Arc<CudaStream>) -> Result<Self, StorageError> {
        context.bind_to_thread().map_err(driver)?;
        let ordinal = i32::try_from(context.ordinal())
            .map_err(|_| StorageError::Driver("device ordinal past i32".into()))?;
        let granule = cuda_vmm::granule(context.cu_device(), ordinal);
        Ok(Self {
            context,
            stream,
            pages: IdMap::default(),
            next_id: 1,
            bytes: 0,
            ordinal,
            granule,
            handle_size: HandleSize::default(),
            ranges: IdMap::default(),
            give_back: GiveBack::default(),
            ops: DriverOps::default(),
            paths: PathLedger::default(),
            foreign_streams: false,
            hold_spares: false,
            adopted: Adopted::default(),
            freed_uncounted: 0,
            uses: std::collections::HashMap::new(),
            next_use: 0,
        })
    }

    /// A storage on `context` whose memory other code uses on streams this
    /// storage is never told of: correct whatever the streams, and slow
    /// where memory goes back often, since every flush that lets memory go
    /// waits for the whole device (`cuCtxSynchronize`). Code that says
    /// which streams use what (`record_use`) wants
    /// [`on_borrowed_stream`](Self::on_borrowed_stream) or
    /// [`on_default_stream`](Self::on_default_stream) instead: nothing
    /// waits there.
    pub fn for_foreign_streams(context: Arc<CudaContext>) -> Result<Self, StorageError> {
        let mut storage = Self::on_context(context)?;
        storage.foreign_streams = true;
        Ok(storage)
    }

    /// The same storage, mapping physical handles of up to `granules`
    /// granules (at least 1; `docs/memory.md`, "Physical handles").
    pub fn with_handle_granules(mut self, granules: u64) -> Self {
        self.handle_size = HandleSize::new(granules);
        self
    }

    /// The CUDA stream this storage orders its work on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's free and total memory in bytes.
    pub fn device_memory(&self) -> Result<(u64, u64), StorageError> {
        self.bind()?;
        let (free, total) = result::mem_get_info().map_err(driver)?;
        Ok((free as u64, total as u64))
    }

    /// Wait for everything queued on this storage's stream.
    pub fn synchronize(&mut self) -> Result<(), StorageError> {
        self.bind()?;
        self.ops.waited();
        self.stream.synchronize().map_err(driver)
    }

    /// Release every adopted handle its maps did not use (mapped
    /// nowhere: `cuMemRelease` alone). The context bound.
    fn release_adopted(&mut self) {
        (self.adopted).release_all(&mut self.ops, &mut self.bytes, |handle| {
            // SAFETY: handed over unmapped and adopted by this storage
            // alone; released once, here.
            let _ = unsafe { sys::cuMemRelease(handle.raw()) };
        });
    }

    /// Map `handle` in its range (`CudaRange::map`), the storage having
    /// held `held` bytes before; the granules of the spares and adopted
    /// handles a refused map gave up go off the bytes held.
    fn map_in_range(
        &mut self,
        handle: &StorageHandle,
        held: u64,
    ) -> Result<Mapping, (StorageError, u64)> {
        let (ordinal, granule) = (self.ordinal, self.granule.unwrap_or(0));
        let range =
            (self.ranges.get_mut(&handle.id)).ok_or((StorageError::UnknownPage(handle.id), 0))?;
        // The device's total, asked only when a mapping is refused.
        let capacity = || {
            result::mem_get_info()
                .map(|(_, total)| total as u64)
                .unwrap_or(0)
        };
        let mapped = range.map(
            handle,
            ordinal,
            &mut self.ops,
            held,
            capacity,
            &mut self.adopted,
        );
        if let Err((_, dropped)) = &mapped {
            self.bytes = (self.bytes).saturating_sub(dropped.saturating_mul(granule));
        }
        mapped
    }

    fn bind(&self) -> Result<(), StorageError> {
        self.context.bind_to_thread().map_err(driver)
    }

    fn page(&self, id: StorageId) -> Result<&CudaPage, StorageError> {
        self.pages.get(&id).ok_or(StorageError::UnknownPage(id))
    }

    /// The device address of `handle`'s first byte, once an access of
    /// `len` bytes (or of the whole handle) is checked: inside its page, or
    /// on mapped granules of its range.
    fn place(&self, handle: &StorageHandle, len: u64) -> Result<CUdeviceptr, StorageError> {
        if let Some(range) = self.ranges.get(&handle.id) {
            range.granule_map().check_access(handle, len)?;
            return Ok(range.address(handle.offset));
        }
        let page = self.page(handle.id)?;
        check_range(handle, page.size, len)?;
        Ok(page.ptr.wrapping_add(handle.offset))
    }

    fn new_id(&mut self) -> StorageId {
        let id = StorageId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1);
        id
    }
}

impl DeviceStorage for CudaStorage {
    fn alignment(&self) -> u64 {
        CUDA_ALIGNMENT
    }

    fn allocate(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        let bytes = usize::try_from(size).map_err(|_| StorageError::InvalidSize(size))?;
        if bytes == 0 {
            return Err(StorageError::InvalidSize(size));
        }
        self.bind()?;
        // SAFETY: a plain device allocation of a non-zero size; the memory
        // is only reached through ranges checked against `size`.
        let mut attempt = unsafe { result::malloc_sync(bytes) };
        if matches!(
            attempt,
            Err(DriverError(sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY))
        ) && self.reclaim_held_back()
        {
            // What went back in stream order was still held: waited for
            // and given back, so ask once more.
            // SAFETY: as above.
            attempt = unsafe { result::malloc_sync(bytes) };
        }
        let ptr = match attempt {
            Ok(ptr) => ptr,
            Err(DriverError(sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY)) => {
                let capacity = self.device_memory().map(|(_, total)| total).unwrap_or(0);
                return Err(StorageError::OutOfMemory {
                    requested: size,
                    held: self.bytes,
                    capacity,
                });
            }
            Err(err) => return Err(driver(err)),
        };
        let id = self.new_id();
        self.bytes = self.bytes.saturating_add(size);
        self.ops.page_allocated(size);
        self.pages.insert(id, CudaPage { ptr, size });
        Ok(StorageHandle::whole(id, size))
    }

    fn deallocate(&mut self, id: StorageId) {
        let known = self.pages.contains_key(&id) || self.ranges.contains_key(&id);
        self.give_back.free(id, known);
    }

    fn flush(&mut self) {
        if !self.catch_up() {
            return;
        }
        if self.foreign_streams || (self.give_back.has_queued() && !self.seal()) {
            self.wait_all();
            return;
        }
        let ready = (self.give_back).ready(&mut self.ops, |fence, ops| fence.passed(ops));
        for batch in ready {
            self.reclaim(batch, false);
        }
    }

    fn drain(&mut self) {
        if self.catch_up() {
            self.wait_all();
        }
        self.release_spares();
    }

    fn hold_spares(&mut self, hold: bool) {
        self.hold_spares = hold;
    }

    fn bytes_spare(&self) -> u64 {
        (self.ranges.values())
            .map(|range| range.granule_map().spare_bytes())
            .saturating_sum()
            .saturating_add(self.adopted.bytes())
    }

    fn release_spares(&mut self) {
        if self.bind().is_err() {
            return;
        }
        for range in self.ranges.values_mut() {
            let gone = range.release_spares(&mut self.ops);
            let granule = range.granule_map().granule();
            self.bytes = self.bytes.saturating_sub(gone.saturating_mul(granule));
        }
        self.release_adopted();
    }

    fn hand_over_spares(&mut self) -> Vec<LooseHandle> {
        if self.bind().is_err() {
            return Vec::new();
        }
        let mut handed = Vec::new();
        for range in self.ranges.values_mut() {
            handed.extend(range.hand_over_spares(&mut self.ops));
        }
        let bytes = (handed.iter().map(LooseHandle::bytes)).saturating_sum();
        self.bytes = self.bytes.saturating_sub(bytes);
        // Those kept from ranges it freed, unmapped already.
        handed.extend(self.adopted.take_all_held(&mut self.bytes));
        handed
    }

    fn adopt_handles(&mut self, handles: Vec<LooseHandle>) -> Vec<LooseHandle> {
        (self.adopted).adopt_held(handles, self.granule, &mut self.bytes)
    }

    fn bytes_in_reclaim(&self) -> u64 {
        let held = |id: &StorageId| {
            (self.pages.get(id).map(|page| page.size))
                .or_else(|| self.ranges.get(id).map(CudaRange::mapped_bytes))
                .unwrap_or(0)
        };
        let doomed = (self.ranges.iter()).map(|(id, range)| (id, range.doomed_bytes()));
        self.give_back.bytes_waiting(held, doomed)
    }

    fn whole_handles(&self, range: &StorageHandle) -> StorageHandle {
        (self.ranges.get(&range.id)).map_or(*range, |held| held.granule_map().whole_handles(range))
    }

    fn set_handle_cut(&mut self, cut: HandleCut) {
        self.handle_size = self.handle_size.with_cut(cut);
        for held in self.ranges.values_mut() {
            held.set_handle_cut(cut);
        }
    }

    fn first_handle_end(&self, range: &StorageHandle) -> u64 {
        let end = range.offset.saturating_add(range.size);
        (self.ranges.get(&range.id)).map_or(end, |held| held.granule_map().first_handle_end(range))
    }

    fn bytes_stranded(&self) -> u64 {
        (self.ranges.values())
            .map(|range| range.granule_map().stranded_bytes())
            .saturating_sum()
    }

    fn resource(&mut self, handle: &StorageHandle) -> Result<Resource, StorageError> {
        let addr = match self.ranges.get(&handle.id) {
            // The address of a range's bytes is known before they are mapped.
            Some(range) => {
                check_range(handle, range.granule_map().size(), 0)?;
                range.address(handle.offset)
            }
            None => self.place(handle, 0)?,
        };
        Ok(Resource {
            addr,
            len: handle.size,
        })
    }

    fn write(&mut self, handle: &StorageHandle, data: &[u8]) -> Result<(), StorageError> {
        let dst = self.place(handle, data.len() as u64)?;
        self.bind()?;
        // SAFETY: the range was checked against the page; the copy is
        // waited for before `data` can go away.
        unsafe { result::memcpy_htod_async(dst, data, self.stream.cu_stream()) }.map_err(driver)?;
        self.ops.copied(data.len() as u64);
        self.ops.waited();
        self.stream.synchronize().map_err(driver)
    }

    fn read(&mut self, handle: &StorageHandle, out: &mut [u8]) -> Result<(), StorageError> {
        let src = self.place(handle, out.len() as u64)?;
        self.bind()?;
        // SAFETY: the range was checked; `out` is written by the copy, which
        // is waited for before it is returned.
        unsafe { result::memcpy_dtoh_async(out, src, self.stream.cu_stream()) }.map_err(driver)?;
        self.ops.copied(out.len() as u64);
        self.ops.waited();
        self.stream.synchronize().map_err(driver)
    }

    fn copy(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        if from.size != to.size {
            return Err(StorageError::LengthMismatch {
                from: from.size,
                to: to.size,
            });
        }
        let src = self.place(from, 0)?;
        let dst = self.place(to, 0)?;
        self.bind()?;
        // SAFETY: both ranges were checked against live pages; the copy is
        // ordered on this stream before any later use or free of either.
        unsafe { result::memcpy_dtod_async(dst, src, from.size as usize, self.stream.cu_stream()) }
            .map_err(driver)?;
        self.ops.copied(from.size);
        Ok(())
    }

    fn bytes_allocated(&self) -> u64 {
        self.bytes
    }

    fn granule(&self) -> Option<u64> {
        self.granule
    }

    fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        let granule = self.granule.ok_or(StorageError::NoVirtualMemory)?;
        self.bind()?;
        let range = CudaRange::reserve(size, granule, self.handle_size)?;
        self.ops.range_reserved();
        let id = self.new_id();
        self.ranges.insert(id, range);
        Ok(StorageHandle::whole(id, size))
    }

    fn map(&mut self, handle: &StorageHandle) -> Result<(), StorageError> {
        self.bind()?;
        let held = self.bytes;
        let granule = self.granule.unwrap_or(0);
        let mut mapped = self.map_in_range(handle, held);
        if matches!(mapped, Err((StorageError::OutOfMemory { .. }, _))) && self.reclaim_held_back()
        {
            // What went back in stream order was still held: waited for
            // and given back, so ask once more.
            mapped = self.map_in_range(handle, held);
        }
        let mapping = mapped.map_err(|(err, _)| err)?;
        self.bytes = mapping.held_after(self.bytes, granule);
        Ok(())
    }

    fn bytes_a_map_adds(&self, handle: &StorageHandle) -> u64 {
        (self.ranges.get(&handle.id)).map_or(handle.size, |range| {
            (range.granule_map()).bytes_a_map_adds(handle, &self.adopted.lengths())
        })
    }

    fn unmap(&mut self, handle: &StorageHandle) {
        let batch = self.give_back.open_batch();
        let known =
            (self.ranges.get_mut(&handle.id)).is_some_and(|range| range.doom(handle, batch));
        self.give_back.unmap(handle, known);
    }

    counts_driver_ops!();

    fn stream_name(&self) -> Option<UserStream> {
        Some(UserStream(self.stream.cu_stream() as u64))
    }

    fn fence_uses(&mut self, users: &[UserStream]) -> Result<UseFence, StorageError> {
        self.record_uses(users)
    }

    fn uses_done(&mut self, fence: UseFence) -> bool {
        self.uses_passed(fence)
    }

    fn wait_uses(&mut self, fence: UseFence) {
        self.wait_for_uses(fence);
    }

    fn order_for(&mut self, user: UserStream) -> Result<(), StorageError> {
        self.order_stream(user)
    }

    fn order_after(&mut self, users: &[UserStream]) -> Result<(), StorageError> {
        self.wait_for_streams(users)
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        self.wait_all();
        let _ = self.stream.synchronize();
        self.forget_uses();
        for (_, page) in std::mem::take(&mut self.pages) {
            self.free_page(page);
        }
        for (_, range) in std::mem::take(&mut self.ranges) {
            range.release(&mut self.ops);
        }
        self.release_adopted();
    }
}

// SAFETY: the raw device pointers, events and physical allocation handles
// are plain handles owned by this
// storage; every driver call binds the context to the calling thread first,
// so the storage may move to its stream actor's thread.
unsafe impl Send for CudaStorage {}
