//! Device pages of an NVIDIA GPU through the CUDA driver API (`cudarc`,
//! loaded at run time, so the crate builds without a CUDA toolkit).
//!
//! The long form: `docs/modules.md`, "`src/storage/cuda.rs`".

use super::cuda_vmm::{self, CudaRange};
use super::give_back::GiveBack;
use super::id_map::IdMap;
use super::{
    DeviceStorage, DriverOps, Resource, StorageError, StorageHandle, StorageId, check_range,
};
use crate::sync::foreign::Arc;
use cudarc::driver::sys::{self, CUdeviceptr, CUevent};
use cudarc::driver::{CudaContext, CudaStream, DriverError, result};

/// Page starts are at least this aligned (the driver guarantees 256 bytes).
const CUDA_ALIGNMENT: u64 = 256;

/// One device page.
#[derive(Debug)]
struct CudaPage {
    /// Device address of its first byte.
    ptr: CUdeviceptr,
    /// Bytes.
    size: u64,
    /// Events recorded on other streams that used the page; it is freed
    /// only after each has completed.
    uses: Vec<CUevent>,
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
    /// Reserved ranges of address space.
    ranges: IdMap<CudaRange>,
    /// Pages, ranges and granules queued to go back at `flush`.
    give_back: GiveBack,
    /// The driver calls made so far (`driver.rs`).
    ops: DriverOps,
    /// Work on this storage's memory is queued on streams it does not
    /// know (a PyTorch program's): before memory goes back, wait for the
    /// whole device, not this storage's stream.
    foreign_streams: bool,
    /// Pages let go without waiting: each batch frees once an event
    /// recorded on the stream at its flush has passed (`ordered_reclaim`).
    in_flight: std::collections::VecDeque<InFlight>,
    /// Whether pages go back in stream order (no wait) rather than after
    /// a stream synchronize.
    ordered_reclaim: bool,
    /// Bytes of pages freed outside a flush (an allocation short of
    /// memory waited for them): they leave `bytes` at the next flush,
    /// where whatever meters this storage (a budget) sees them go.
    freed_uncounted: u64,
}

/// Pages let go at one flush, freed once the stream's work queued before
/// that flush is done.
#[derive(Debug)]
struct InFlight {
    /// Recorded on the stream at the flush.
    event: CUevent,
    /// The pages.
    pages: Vec<StorageId>,
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
            ranges: IdMap::default(),
            give_back: GiveBack::default(),
            ops: DriverOps::default(),
            foreign_streams: false,
            in_flight: std::collections::VecDeque::new(),
            ordered_reclaim: false,
            freed_uncounted: 0,
        })
    }

    /// The same storage, letting pages go in stream order: a flush
    /// records an event on the stream rather than waiting for it, and the
    /// pages are freed at a later flush once the event has passed (asked
    /// with `cuEventQuery`, never waited on), or when an allocation would
    /// otherwise run out of memory. Their bytes count until then.
    /// Unmapped granules still wait for the stream (the manager may map
    /// them again at once).
    pub fn with_ordered_reclaim(mut self) -> Self {
        self.ordered_reclaim = true;
        self
    }

    /// Free the pages of every batch whose event has passed (all of them,
    /// after waiting for the stream, when `wait`).
    fn reap(&mut self, wait: bool) {
        if self.in_flight.is_empty() {
            return;
        }
        if wait {
            let _ = self.stream.synchronize();
            self.ops.waited();
        }
        while let Some(front) = self.in_flight.front() {
            if !wait {
                self.ops.events_queried = self.ops.events_queried.saturating_add(1);
                // SAFETY: recorded by `flush`, destroyed only below.
                if unsafe { result::event::query(front.event) }.is_err() {
                    // A stream runs in order: later batches wait too.
                    break;
                }
            }
            let Some(batch) = self.in_flight.pop_front() else {
                break;
            };
            // SAFETY: made by `flush`, destroyed once, here.
            let _ = unsafe { result::event::destroy(batch.event) };
            for id in batch.pages {
                if let Some(page) = self.pages.remove(&id) {
                    self.free_page(page);
                }
            }
        }
    }

    /// An allocation is short of memory while pages wait in stream order:
    /// wait for the stream and free them now, their bytes still counted
    /// until the next flush.
    fn reap_held_back(&mut self) {
        let before = self.bytes;
        self.reap(true);
        self.freed_uncounted = self
            .freed_uncounted
            .saturating_add(before.saturating_sub(self.bytes));
        self.bytes = before;
    }

    /// Let this flush's pages go in stream order: an event on the stream
    /// now, the pages freed once it has passed. `false` where no event
    /// could be recorded (the caller waits instead).
    fn defer_pages(&mut self) -> bool {
        let pages: Vec<StorageId> = self
            .give_back
            .frees()
            .iter()
            .copied()
            .filter(|id| self.pages.contains_key(id))
            .collect();
        if pages.is_empty() {
            return true;
        }
        let Ok(event) = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING) else {
            return false;
        };
        // SAFETY: a fresh event, recorded on this storage's live stream.
        if unsafe { result::event::record(event, self.stream.cu_stream()) }.is_err() {
            // SAFETY: made above, recorded nowhere.
            let _ = unsafe { result::event::destroy(event) };
            return false;
        }
        self.ops.event_recorded();
        self.give_back.forget_frees(&pages);
        self.in_flight.push_back(InFlight { event, pages });
        true
    }

    /// A storage on `context` whose memory other code uses on streams this
    /// storage does not know (PyTorch's, through `streamalloc-torch`):
    /// correct, and slow where memory goes back often, since every flush
    /// that lets memory go waits for the whole device (`cuCtxSynchronize`)
    /// until stream-ordered reclaim replaces it (issue 43).
    pub fn for_foreign_streams(context: Arc<CudaContext>) -> Result<Self, StorageError> {
        let mut storage = Self::on_context(context)?;
        storage.foreign_streams = true;
        Ok(storage)
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

    /// Record that `other` uses the page `id` from now on (as PyTorch's
    /// `record_stream`): the page is not freed before the work `other` has
    /// queued so far is done.
    pub fn record_use(&mut self, id: StorageId, other: &CudaStream) -> Result<(), StorageError> {
        self.bind()?;
        let page = self
            .pages
            .get_mut(&id)
            .ok_or(StorageError::UnknownPage(id))?;
        let event =
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(driver)?;
        // SAFETY: `event` was just created and `other` is a live stream of
        // this context.
        unsafe { result::event::record(event, other.cu_stream()) }.map_err(driver)?;
        page.uses.push(event);
        self.ops.event_recorded();
        Ok(())
    }

    /// Wait for everything queued on this storage's stream.
    pub fn synchronize(&mut self) -> Result<(), StorageError> {
        self.bind()?;
        self.ops.waited();
        self.stream.synchronize().map_err(driver)
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

    /// Free a page once every stream that used it is done with it.
    fn free_page(&mut self, page: CudaPage) {
        for event in page.uses {
            self.ops.event_waited();
            // SAFETY: each event was created and recorded by `record_use`
            // and is destroyed once, here.
            unsafe {
                let _ = result::event::synchronize(event);
                let _ = result::event::destroy(event);
            }
        }
        // SAFETY: `ptr` came from `malloc_sync` and is freed once; the
        // caller synchronised this storage's stream first.
        unsafe {
            let _ = result::free_sync(page.ptr);
        }
        self.ops.page_freed(page.size);
        self.bytes = self.bytes.saturating_sub(page.size);
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
        ) && !self.in_flight.is_empty()
        {
            // Pages let go in stream order are still held: wait for them,
            // and ask once more. (Their bytes leave the count at the next
            // flush, where a budget sees them go.)
            self.reap_held_back();
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
        self.pages.insert(
            id,
            CudaPage {
                ptr,
                size,
                uses: Vec::new(),
            },
        );
        Ok(StorageHandle::whole(id, size))
    }

    fn deallocate(&mut self, id: StorageId) {
        let known = self.pages.contains_key(&id) || self.ranges.contains_key(&id);
        self.give_back.free(id, known);
    }

    fn flush(&mut self) {
        if self.bind().is_err() {
            return;
        }
        self.bytes = self
            .bytes
            .saturating_sub(std::mem::take(&mut self.freed_uncounted));
        self.reap(false);
        if self.ordered_reclaim && !self.give_back.has_unmaps() && !self.foreign_streams {
            // Pages alone (ranges go back after a wait, below): no wait.
            let only_pages =
                (self.give_back.frees().iter()).all(|id| !self.ranges.contains_key(id));
            if only_pages && self.defer_pages() {
                return;
            }
        }
        if self.give_back.is_empty() {
            return;
        }
        // Work queued on the stream (or, for memory others use, on any
        // stream of the device) may still touch the pages and granules.
        let _ = if self.foreign_streams {
            self.context.synchronize()
        } else {
            self.stream.synchronize()
        };
        self.ops.waited();
        let (unmaps, frees) = self.give_back.take();
        for handle in unmaps {
            if let Some(range) = self.ranges.get_mut(&handle.id)
                && range.unmap(&handle, &mut self.ops)
            {
                self.bytes = self.bytes.saturating_sub(handle.size);
            }
        }
        for id in frees {
            if let Some(page) = self.pages.remove(&id) {
                self.free_page(page);
            }
            if let Some(range) = self.ranges.remove(&id) {
                self.bytes = self.bytes.saturating_sub(range.mapped_bytes());
                range.release(&mut self.ops);
            }
        }
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
        let range = CudaRange::reserve(size, granule)?;
        self.ops.range_reserved();
        let id = self.new_id();
        self.ranges.insert(id, range);
        Ok(StorageHandle::whole(id, size))
    }

    fn map(&mut self, handle: &StorageHandle) -> Result<(), StorageError> {
        self.bind()?;
        let held = self.bytes;
        let ordinal = self.ordinal;
        let range = self
            .ranges
            .get_mut(&handle.id)
            .ok_or(StorageError::UnknownPage(handle.id))?;
        // The device's total, asked only when a mapping is refused.
        let capacity = || {
            result::mem_get_info()
                .map(|(_, total)| total as u64)
                .unwrap_or(0)
        };
        range.map(handle, ordinal, &mut self.ops, held, capacity)?;
        self.bytes = self.bytes.saturating_add(handle.size);
        Ok(())
    }

    fn unmap(&mut self, handle: &StorageHandle) {
        let known = self.ranges.contains_key(&handle.id);
        self.give_back.unmap(handle, known);
    }

    fn driver_ops(&self) -> DriverOps {
        self.ops
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        self.reap(true);
        let _ = self.stream.synchronize();
        for (_, page) in std::mem::take(&mut self.pages) {
            self.free_page(page);
        }
        for (_, range) in std::mem::take(&mut self.ranges) {
            range.release(&mut self.ops);
        }
    }
}

// SAFETY: the raw device pointers, events and physical allocation handles
// are plain handles owned by this
// storage; every driver call binds the context to the calling thread first,
// so the storage may move to its stream actor's thread.
unsafe impl Send for CudaStorage {}
