//! Pages of real host memory: the default storage, so that everything runs
//! on a machine without a GPU and every byte written can be read back.

use super::give_back::{Batch, GiveBack, Lag, LagClock};
use super::id_map::IdMap;
use super::loose::{self, Adopted};
use super::{
    DeviceStorage, DriverOps, HandleCut, HandleSize, LooseHandle, PathLedger, Resource,
    StorageError, StorageHandle, StorageId, UseFence, UserStream, check_range,
};
use crate::saturating::SaturatingSum;
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

#[cfg(unix)]
mod range;
#[cfg(unix)]
use range::HostRange;

/// Host pages start on this boundary (a page of the MMU), whatever smaller
/// alignment the device properties ask of slices.
const HOST_PAGE_ALIGN: usize = 4096;

/// Pages at least this large are mapped straight from the kernel: zero
/// pages that cost nothing until touched, where the heap's `calloc` would
/// zero recycled memory up front (milliseconds for a 20 MiB page).
#[cfg(unix)]
const MAP_THRESHOLD: usize = 256 * 1024;

/// One page: an owned, zero-initialised, aligned block.
#[derive(Debug)]
struct HostPage {
    /// Start of the block; valid for `layout.size()` bytes until dropped.
    ptr: NonNull<u8>,
    /// The layout it was allocated with (needed to free it).
    layout: Layout,
    /// Mapped with `mmap` (freed with `munmap`) rather than the heap.
    mapped: bool,
}

impl HostPage {
    fn new(size: u64) -> Result<Self, StorageError> {
        let bytes = usize::try_from(size).map_err(|_| StorageError::InvalidSize(size))?;
        let layout = Layout::from_size_align(bytes, HOST_PAGE_ALIGN)
            .map_err(|_| StorageError::InvalidSize(size))?;
        if bytes == 0 {
            return Err(StorageError::InvalidSize(size));
        }
        let out_of_memory = StorageError::OutOfMemory {
            requested: size,
            held: 0,
            capacity: 0,
        };
        #[cfg(unix)]
        if bytes >= MAP_THRESHOLD {
            // SAFETY: an anonymous private mapping of a non-zero length; the
            // kernel returns zeroed, page-aligned memory or MAP_FAILED.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Err(out_of_memory);
            }
            let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(out_of_memory)?;
            return Ok(Self {
                ptr,
                layout,
                mapped: true,
            });
        }
        // SAFETY: the layout has a non-zero size (checked just above).
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(out_of_memory)?;
        Ok(Self {
            ptr,
            layout,
            mapped: false,
        })
    }

    fn size(&self) -> u64 {
        self.layout.size() as u64
    }

    /// A raw pointer to the first byte `handle` names, after its range was
    /// checked against this page. Never a reference: other allocations on
    /// the page may be read or written through pinned addresses on other
    /// threads at any time, so no `&`/`&mut` may ever cover page bytes
    /// (it would assert exclusive or frozen access to bytes that are not).
    fn at(&self, handle: &StorageHandle) -> *mut u8 {
        // SAFETY: `check_range` proved offset + size <= the page's size, so
        // the offset stays inside the block.
        unsafe { self.ptr.as_ptr().add(handle.offset as usize) }
    }
}

impl Drop for HostPage {
    fn drop(&mut self) {
        #[cfg(unix)]
        if self.mapped {
            // SAFETY: `ptr` came from `mmap` of `layout.size()` bytes and is
            // unmapped once; no reference into it outlives the page.
            unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.layout.size());
            }
            return;
        }
        // SAFETY: `ptr` came from `alloc_zeroed(self.layout)` and is freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: a `HostPage` owns its block exclusively (like a `Box<[u8]>`); moving
// it to another thread moves that ownership.
unsafe impl Send for HostPage {}

/// The granule host ranges map in: a CUDA device's, so that placement on
/// host memory is what it would be on a GPU (and a multiple of every MMU
/// page size in use).
#[cfg(unix)]
pub const HOST_GRANULE: u64 = 2 * 1024 * 1024;

/// Page-aligned host memory.
#[derive(Debug, Default)]
pub struct HostStorage {
    /// Live pages by id.
    pages: IdMap<HostPage>,
    /// The next id to hand out; ids are never reused.
    next_id: u64,
    /// Bytes held, those queued to go back included.
    bytes: u64,
    /// Reserved ranges.
    #[cfg(unix)]
    ranges: IdMap<HostRange>,
    /// Pages, ranges and granules given back, queued or behind fences.
    give_back: GiveBack<Lag>,
    /// When a fence passes: flushes counted, and how many it lags (0: at
    /// once; `with_reclaim_lag`).
    clock: LagClock,
    /// What a CUDA device's driver would have been asked for the same
    /// calls (`driver.rs`): the same counts a `VirtualStorage` keeps.
    ops: DriverOps,
    /// The operations by the path that asked for them.
    paths: PathLedger,
    /// The most granules one physical handle covers.
    handle_size: HandleSize,
    /// Whether handles given back are kept as spares (`hold_spares`).
    hold_spares: bool,
    /// Handles another storage of the device handed over, unmapped.
    adopted: Adopted,
}

/// Where an access lands: the first byte, after the range was checked.
struct Place(*mut u8);

/// The host refused memory while the storage held `held` bytes: as far
/// as anyone can tell, that is the most it could hold (the kernel sets the
/// limit by its own accounting and says only no).
fn refused(err: StorageError, held: u64) -> StorageError {
    match err {
        StorageError::OutOfMemory { requested, .. } => StorageError::OutOfMemory {
            requested,
            held,
            capacity: held,
        },
        other => other,
    }
}

impl HostStorage {
    /// An empty storage.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same storage, letting what it gives back go only `lag` flushes
    /// later, as a device running behind its host would (0, the default:
    /// at once). Granules mapped again before they went keep their bytes.
    pub fn with_reclaim_lag(mut self, lag: u64) -> Self {
        self.clock.lag = lag;
        self
    }

    /// The same storage, counting physical handles of up to `granules`
    /// granules (at least 1) as a GPU's driver would create them: its
    /// granules go back to the kernel a whole handle at a time, as a
    /// GPU's would (`docs/memory.md`, "Physical handles").
    pub fn with_handle_granules(mut self, granules: u64) -> Self {
        self.handle_size = HandleSize::new(granules);
        self
    }

    /// Give what `batch` holds back: its granules still given back, then
    /// its pages and ranges.
    fn reclaim(&mut self, batch: Batch<Lag>) {
        #[cfg(not(unix))]
        drop(batch.unmaps); // no ranges: nothing was queued
        #[cfg(unix)]
        for handle in &batch.unmaps {
            if let Some(range) = self.ranges.get_mut(&handle.id) {
                let released = range.unmap_doomed(handle, batch.id, self.hold_spares);
                let bytes = self.ops.released_runs(&released, range.map.granule());
                self.bytes = self.bytes.saturating_sub(bytes);
            }
        }
        for id in batch.frees {
            if let Some(page) = self.pages.remove(&id) {
                self.bytes = self.bytes.saturating_sub(page.size());
                self.ops.page_freed(page.size());
            }
            #[cfg(unix)]
            if let Some(range) = self.ranges.remove(&id) {
                let map = &range.map;
                if self.hold_spares {
                    // Counted as a GPU's would be: its handles kept whole,
                    // unmapped (the host's memory goes with the range).
                    self.adopted.keep_range(map, &mut self.ops);
                    continue;
                }
                self.bytes = self.bytes.saturating_sub(range.map.mapped_bytes());
                self.ops
                    .range_freed(map.handle_count(), map.mapped_granules());
            }
        }
    }

    fn page(&self, id: StorageId) -> Result<&HostPage, StorageError> {
        self.pages.get(&id).ok_or(StorageError::UnknownPage(id))
    }

    /// Move the bytes of `from` to `to` (same length; they may overlap),
    /// both checked first. Counted by the caller, as a copy or a slide.
    fn memmove(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        if from.size != to.size {
            return Err(StorageError::LengthMismatch {
                from: from.size,
                to: to.size,
            });
        }
        let Place(source) = self.place(from, 0)?;
        let Place(target) = self.place(to, 0)?;
        // SAFETY: both ranges were checked to lie inside live (mapped)
        // memory. `ptr::copy` allows the ranges to overlap (a move within
        // one page or range), and raw pointers assert nothing about the
        // rest of either, which pinned clients may be using meanwhile.
        unsafe { std::ptr::copy(source, target, from.size as usize) };
        Ok(())
    }

    /// The first byte of an access of `len` bytes at `handle` (or of the
    /// whole handle), checked against its page or the mapped granules of
    /// its range.
    fn place(&self, handle: &StorageHandle, len: u64) -> Result<Place, StorageError> {
        #[cfg(unix)]
        if let Some(range) = self.ranges.get(&handle.id) {
            range.map.check_access(handle, len)?;
            return Ok(Place(range.at(handle)));
        }
        let page = self.page(handle.id)?;
        check_range(handle, page.size(), len)?;
        Ok(Place(page.at(handle)))
    }
}

impl DeviceStorage for HostStorage {
    fn alignment(&self) -> u64 {
        HOST_PAGE_ALIGN as u64
    }

    fn allocate(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        let page = HostPage::new(size).map_err(|err| refused(err, self.bytes))?;
        let id = StorageId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1);
        self.bytes = self.bytes.saturating_add(size);
        self.pages.insert(id, page);
        self.ops.page_allocated(size);
        Ok(StorageHandle::whole(id, size))
    }

    fn deallocate(&mut self, id: StorageId) {
        #[cfg(unix)]
        let known = self.pages.contains_key(&id) || self.ranges.contains_key(&id);
        #[cfg(not(unix))]
        let known = self.pages.contains_key(&id);
        self.give_back.free(id, known);
    }

    fn flush(&mut self) {
        for batch in (self.give_back).flush_lagged(&mut self.clock, &mut self.ops) {
            self.reclaim(batch);
        }
    }

    fn drain(&mut self) {
        for batch in (self.give_back).drain_lagged(&mut self.clock, &mut self.ops) {
            self.reclaim(batch);
        }
        self.release_spares();
    }

    fn resource(&mut self, handle: &StorageHandle) -> Result<Resource, StorageError> {
        #[cfg(unix)]
        if let Some(range) = self.ranges.get(&handle.id) {
            // The address of a range's bytes is known before they are mapped.
            check_range(handle, range.map.size(), 0)?;
            return Ok(Resource {
                addr: range.at(handle) as u64,
                len: handle.size,
            });
        }
        let page = self.page(handle.id)?;
        check_range(handle, page.size(), 0)?;
        Ok(Resource {
            // `check_range` kept the offset inside the page.
            addr: (page.ptr.as_ptr() as u64).wrapping_add(handle.offset),
            len: handle.size,
        })
    }

    fn write(&mut self, handle: &StorageHandle, data: &[u8]) -> Result<(), StorageError> {
        let Place(at) = self.place(handle, data.len() as u64)?;
        // SAFETY: the range was checked to lie inside live (mapped) memory,
        // and `data` is caller memory, never page memory: they cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at, data.len()) };
        // A device copies from the host and waits for the copy.
        self.ops.copied(data.len() as u64);
        self.ops.waited();
        Ok(())
    }

    fn read(&mut self, handle: &StorageHandle, out: &mut [u8]) -> Result<(), StorageError> {
        let Place(at) = self.place(handle, out.len() as u64)?;
        // SAFETY: as in `write`, the other way round.
        unsafe { std::ptr::copy_nonoverlapping(at, out.as_mut_ptr(), out.len()) };
        self.ops.copied(out.len() as u64);
        self.ops.waited();
        Ok(())
    }

    copy_and_slide_by!(memmove);

    fn bytes_allocated(&self) -> u64 {
        self.bytes
    }

    counts_driver_ops!();

    uses_lagged_by_clock!();

    #[cfg(unix)]
    fn granule(&self) -> Option<u64> {
        Some(HOST_GRANULE)
    }

    #[cfg(unix)]
    fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        let range = HostRange::reserve(size, HOST_GRANULE, self.handle_size)
            .map_err(|err| refused(err, self.bytes))?;
        let id = StorageId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1);
        self.ranges.insert(id, range);
        self.ops.range_reserved();
        Ok(StorageHandle::whole(id, size))
    }

    #[cfg(unix)]
    fn map(&mut self, handle: &StorageHandle) -> Result<(), StorageError> {
        let held = self.bytes;
        let range = self
            .ranges
            .get_mut(&handle.id)
            .ok_or(StorageError::UnknownPage(handle.id))?;
        let granule = range.map.granule();
        let mapping = match range.map(handle, &self.adopted.lengths()) {
            Ok(mapping) => mapping,
            Err((err, released)) => {
                let granules = super::granules_in(&released);
                self.bytes = (self.bytes).saturating_sub(granules.saturating_mul(granule));
                self.ops.unmapped(released.len() as u64, granules);
                return Err(refused(err, held));
            }
        };
        self.adopted.take_for(&mapping);
        self.ops.mapping(&mapping);
        self.bytes = mapping.held_after(self.bytes, granule);
        Ok(())
    }

    #[cfg(unix)]
    fn bytes_a_map_adds(&self, handle: &StorageHandle) -> u64 {
        (self.ranges.get(&handle.id)).map_or(handle.size, |range| {
            range.map.bytes_a_map_adds(handle, &self.adopted.lengths())
        })
    }

    fn hold_spares(&mut self, hold: bool) {
        self.hold_spares = hold;
    }

    fn bytes_spare(&self) -> u64 {
        #[cfg(unix)]
        return (self.ranges.values())
            .map(|range| range.map.spare_bytes())
            .saturating_sum()
            .saturating_add(self.adopted.bytes());
        #[cfg(not(unix))]
        0
    }

    fn release_spares(&mut self) {
        #[cfg(unix)]
        for (id, range) in self.ranges.iter_mut() {
            let released = range.release_spares(*id);
            let bytes = self.ops.released_runs(&released, range.map.granule());
            self.bytes = self.bytes.saturating_sub(bytes);
        }
        (self.adopted).release_all(&mut self.ops, &mut self.bytes, |_| {});
    }

    fn hand_over_spares(&mut self) -> Vec<LooseHandle> {
        let mut handed = Vec::new();
        #[cfg(unix)]
        for (id, range) in self.ranges.iter_mut() {
            let granule = range.map.granule();
            let runs = range.release_spares(*id);
            handed.extend(loose::hand_over_modeled(
                &runs,
                granule,
                &mut self.ops,
                &mut self.bytes,
            ));
        }
        // Those kept from ranges it freed, unmapped already.
        handed.extend(self.adopted.take_all_held(&mut self.bytes));
        handed
    }

    fn adopt_handles(&mut self, handles: Vec<LooseHandle>) -> Vec<LooseHandle> {
        let granule = self.granule();
        (self.adopted).adopt_held(handles, granule, &mut self.bytes)
    }

    #[cfg(unix)]
    fn unmap(&mut self, handle: &StorageHandle) {
        let batch = self.give_back.open_batch();
        let known =
            (self.ranges.get_mut(&handle.id)).is_some_and(|range| range.map.doom(handle, batch));
        self.give_back.unmap(handle, known);
    }

    fn bytes_in_reclaim(&self) -> u64 {
        let held = |id: &StorageId| {
            let page = self.pages.get(id).map(HostPage::size);
            #[cfg(unix)]
            let page = page.or_else(|| self.ranges.get(id).map(|range| range.map.mapped_bytes()));
            page.unwrap_or(0)
        };
        #[cfg(unix)]
        let doomed = (self.ranges.iter()).map(|(id, range)| (id, range.map.doomed_bytes()));
        #[cfg(not(unix))]
        let doomed = std::iter::empty();
        self.give_back.bytes_waiting(held, doomed)
    }

    #[cfg(unix)]
    fn whole_handles(&self, range: &StorageHandle) -> StorageHandle {
        (self.ranges.get(&range.id)).map_or(*range, |held| held.map.whole_handles(range))
    }

    #[cfg(unix)]
    fn set_handle_cut(&mut self, cut: HandleCut) {
        self.handle_size = self.handle_size.with_cut(cut);
        for held in self.ranges.values_mut() {
            held.map.set_handle_cut(cut);
        }
    }

    #[cfg(unix)]
    fn first_handle_end(&self, range: &StorageHandle) -> u64 {
        let end = range.offset.saturating_add(range.size);
        (self.ranges.get(&range.id)).map_or(end, |held| held.map.first_handle_end(range))
    }

    fn bytes_stranded(&self) -> u64 {
        #[cfg(unix)]
        return self
            .ranges
            .values()
            .map(|range| range.map.stranded_bytes())
            .saturating_sum();
        #[cfg(not(unix))]
        0
    }
}

#[cfg(test)]
mod tests;
