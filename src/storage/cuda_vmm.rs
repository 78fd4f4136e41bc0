//! The CUDA device's virtual memory management (`cuMem*`): what an
//! expandable arena on a GPU stands on, as PyTorch's expandable segments.
//!
//! A range is address space from `cuMemAddressReserve`. A map of fresh
//! granules creates physical handles of one or more granules each, as the
//! range's `GranuleMap` cuts them (`cuMemCreate`, `cuMemMap`, then one
//! `cuMemSetAccess` a handle for the device, since the driver charges
//! access per handle however many one call covers,
//! `../shared/torch-h200/README.md`): the driver unmaps only whole
//! mappings, so a handle goes back whole, once every granule of it was
//! given back. Unmapping (`cuMemUnmap`, `cuMemRelease`) happens once the
//! stream has finished the work that may touch the bytes (the batch's
//! fence); the address space goes back (`cuMemAddressFree`) with the
//! range.

use super::loose::{self, Adopted};
use super::{
    DriverOps, GranuleMap, HandleCut, HandleSize, LooseHandle, Mapping, StorageError,
    StorageHandle, granules_in,
};
use cudarc::driver::DriverError;
use cudarc::driver::sys::{self, CUdeviceptr, CUmemGenericAllocationHandle};
use std::collections::HashMap;
use std::ops::Range;

/// Where physical granules live: pinned device memory of one device.
fn properties(ordinal: i32) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The device's granule for mapped memory, or `None` where the device or
/// driver has no virtual memory management. The context must be bound.
pub(super) fn granule(device: sys::CUdevice, ordinal: i32) -> Option<u64> {
    let mut supported: i32 = 0;
    // SAFETY: plain queries into locals; the device came from a context
    // that exists.
    let attribute = unsafe {
        sys::cuDeviceGetAttribute(
            &mut supported,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            device,
        )
    };
    if attribute.result().is_err() || supported == 0 {
        return None;
    }
    let prop = properties(ordinal);
    let mut bytes: usize = 0;
    // SAFETY: `prop` is a complete description of device memory; the
    // answer goes into a local.
    let asked = unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut bytes,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    };
    asked
        .result()
        .ok()
        .and_then(|()| u64::try_from(bytes).ok())
        .filter(|&bytes| bytes > 0)
}

/// Granules in `run`.
fn granules(run: &Range<u64>) -> u64 {
    run.end.saturating_sub(run.start)
}

/// Granules of the physical handles `held`, each with its granule run.
fn granules_of(held: &[(Range<u64>, CUmemGenericAllocationHandle)]) -> u64 {
    held.iter()
        .fold(0, |sum: u64, (run, _)| sum.saturating_add(granules(run)))
}

fn driver(err: DriverError) -> StorageError {
    StorageError::Driver(format!("{err:?}"))
}

fn bytes(size: u64) -> Result<usize, StorageError> {
    usize::try_from(size).map_err(|_| StorageError::InvalidSize(size))
}

/// One reserved range of device address space.
#[derive(Debug)]
pub(super) struct CudaRange {
    /// Its first address.
    base: CUdeviceptr,
    /// Which granules are mapped, and which physical handle holds each.
    map: GranuleMap,
    /// Each physical handle, by its first granule: its granules and the
    /// driver's handle.
    handles: HashMap<u64, (Range<u64>, CUmemGenericAllocationHandle)>,
}

impl CudaRange {
    /// Reserve `size` bytes of address space (a multiple of `granule`),
    /// mapped later in physical handles of up to `handle_size`
    /// granules. The context must be bound.
    pub(super) fn reserve(
        size: u64,
        granule: u64,
        handle_size: HandleSize,
    ) -> Result<Self, StorageError> {
        let map = GranuleMap::new(granule, size, handle_size)?;
        let mut base: CUdeviceptr = 0;
        // SAFETY: asks for fresh address space (no fixed address, no flags)
        // into a local.
        unsafe { sys::cuMemAddressReserve(&mut base, bytes(size)?, bytes(granule)?, 0, 0) }
            .result()
            .map_err(|err| match err {
                DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) => {
                    StorageError::InvalidSize(size)
                }
                err => driver(err),
            })?;
        Ok(Self {
            base,
            map,
            handles: HashMap::new(),
        })
    }

    /// Which granules are mapped.
    pub(super) fn granule_map(&self) -> &GranuleMap {
        &self.map
    }

    /// Cut the handles of later maps as `cut` says.
    pub(super) fn set_handle_cut(&mut self, cut: HandleCut) {
        self.map.set_handle_cut(cut);
    }

    /// Bytes mapped.
    pub(super) fn mapped_bytes(&self) -> u64 {
        self.map.mapped_bytes()
    }

    /// The device address of `offset` bytes into the range.
    pub(super) fn address(&self, offset: u64) -> CUdeviceptr {
        self.base.wrapping_add(offset)
    }

    /// Put memory behind `handle` as [`GranuleMap::plan`] says, with the
    /// handles `adopted` holds: the spares it does not move and the
    /// adopted handles it does not map released first, spares moved
    /// (unmapped where they were, mapped at their new granules), adopted
    /// handles mapped, new physical handles created for the rest, all
    /// made accessible; granules given back and not yet gone are taken
    /// back as they are. On a refusal the handles created, moved or
    /// adopted so far are released, and so are the spares given up and
    /// every adopted handle the plan took: the error comes with the
    /// granules those held, and the map is otherwise unchanged. What the
    /// map did.
    pub(super) fn map(
        &mut self,
        handle: &StorageHandle,
        ordinal: i32,
        ops: &mut DriverOps,
        held: u64,
        capacity: impl FnOnce() -> u64,
        adopted: &mut Adopted,
    ) -> Result<Mapping, (StorageError, u64)> {
        let mapping = (self.map.plan(handle, &adopted.lengths())).map_err(|err| (err, 0))?;
        let granule = self.map.granule();
        let prop = properties(ordinal);
        let (adopting, unused) = adopted.take_for(&mapping);
        for loose in &unused {
            // SAFETY: a handle handed over unmapped, owned by this storage
            // since it adopted it; released once, here.
            let _ = unsafe { sys::cuMemRelease(loose.raw()) };
        }
        let (count, granules_released) = loose::count(&unused);
        ops.released_unmapped(count, granules_released);
        // Refused, every adopted handle taken here goes too (released
        // unused, or mapped and then given up with what was done).
        let adopted_gone = granules_released.saturating_add(loose::count(&adopting).1);
        let mut given_up: Vec<Range<u64>> = Vec::new();
        for spare in &mapping.released {
            if let Some((run, physical)) = self.handles.remove(&spare.start) {
                self.unmap_handle(&run, granule, physical);
            }
            given_up.push(spare.clone());
        }
        ops.unmapped(given_up.len() as u64, granules_in(&given_up));
        let mut done = Vec::new();
        let mut failure = None;
        for moved in &mapping.moved {
            given_up.push(moved.from.clone());
            let Some((from, physical)) = self.handles.remove(&moved.from.start) else {
                continue;
            };
            match self.move_handle(&from, &moved.to, granule, physical) {
                Ok(()) => done.push((moved.to.clone(), physical)),
                Err(err) => {
                    ops.unmapped(1, granules(&from));
                    failure = Some(err);
                    break;
                }
            }
        }
        let moved = done.len();
        let moved_granules = granules_of(&done);
        ops.moved(moved as u64, moved_granules);
        let mut adopting = adopting.into_iter();
        if failure.is_none() {
            for (run, loose) in mapping.adopted.iter().zip(adopting.by_ref()) {
                match self.map_unmapped(run, granule, loose.raw()) {
                    Ok(()) => done.push((run.clone(), loose.raw())),
                    Err(err) => {
                        failure = Some(err);
                        break;
                    }
                }
            }
        }
        // Those a failure left unmapped go as an unused one does.
        for loose in adopting {
            // SAFETY: as above: adopted, mapped nowhere, released once.
            let _ = unsafe { sys::cuMemRelease(loose.raw()) };
            ops.released_unmapped(1, loose.granules());
        }
        let adopted_now = done.len().saturating_sub(moved);
        ops.adopted(adopted_now as u64, granules_of(&done[moved..]));
        if failure.is_none() {
            for run in &mapping.created {
                match self.map_handle(run, granule, &prop) {
                    Ok(physical) => done.push((run.clone(), physical)),
                    Err(err) => {
                        failure = Some(err);
                        break;
                    }
                }
            }
        }
        let created = &done[moved.saturating_add(adopted_now)..];
        let created_granules = granules_of(created);
        ops.created_and_mapped(created.len() as u64, created_granules);
        if failure.is_none() {
            ops.granted(done.len() as u64);
            for (run, _) in &done {
                if let Err(err) = self.allow_access(run, granule, ordinal) {
                    failure = Some(err);
                    break;
                }
            }
        }
        let Some(err) = failure else {
            self.map.apply(handle, &mapping);
            (self.handles).extend(
                done.into_iter()
                    .map(|(run, physical)| (run.start, (run, physical))),
            );
            return Ok(mapping);
        };
        let dropped = granules_of(&done);
        for (run, physical) in &done {
            self.unmap_handle(run, granule, *physical);
        }
        ops.unmapped(done.len() as u64, dropped);
        self.map.forget_spares(&given_up);
        let err = match err {
            DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) => StorageError::OutOfMemory {
                requested: handle.size,
                held,
                capacity: capacity(),
            },
            err => driver(err),
        };
        Err((err, granules_in(&given_up).saturating_add(adopted_gone)))
    }

    /// Move the spare `physical` from the granules `from` (its fence
    /// passed: nothing touches them) to `to`, as many; released where it
    /// cannot be mapped there.
    fn move_handle(
        &self,
        from: &Range<u64>,
        to: &Range<u64>,
        granule: u64,
        physical: CUmemGenericAllocationHandle,
    ) -> Result<(), DriverError> {
        let size = usize::try_from(granules(from).saturating_mul(granule)).unwrap_or(usize::MAX);
        // SAFETY: the range's own granules, `from` mapped to `physical`
        // and past its fence (the granule map's plan): mapped nowhere
        // after this.
        let _ = unsafe { sys::cuMemUnmap(self.address(from.start.saturating_mul(granule)), size) };
        self.map_unmapped(to, granule, physical)
    }

    /// Map `physical`, a handle mapped nowhere (adopted from another
    /// storage, or a spare just unmapped), at the granules `run` (as
    /// many); released where it cannot be mapped there.
    fn map_unmapped(
        &self,
        run: &Range<u64>,
        granule: u64,
        physical: CUmemGenericAllocationHandle,
    ) -> Result<(), DriverError> {
        let size = usize::try_from(granules(run).saturating_mul(granule)).unwrap_or(usize::MAX);
        let at = self.address(run.start.saturating_mul(granule));
        // SAFETY: `run` is unmapped granules of this range (the granule
        // map's plan) and `physical` is exactly that long, mapped nowhere:
        // the storage that handed it over unmapped it once its stream was
        // done with it, or `move_handle` just did.
        if let Err(err) = unsafe { sys::cuMemMap(at, size, 0, physical, 0) }.result() {
            // SAFETY: mapped nowhere.
            let _ = unsafe { sys::cuMemRelease(physical) };
            return Err(err);
        }
        Ok(())
    }

    fn map_handle(
        &self,
        run: &Range<u64>,
        granule: u64,
        prop: &sys::CUmemAllocationProp,
    ) -> Result<CUmemGenericAllocationHandle, DriverError> {
        let bytes = granules(run).saturating_mul(granule);
        let size = usize::try_from(bytes).unwrap_or(usize::MAX);
        let mut physical: CUmemGenericAllocationHandle = 0;
        // SAFETY: a fresh physical allocation of whole granules into a local.
        unsafe { sys::cuMemCreate(&mut physical, size, prop, 0) }.result()?;
        let at = self.address(run.start.saturating_mul(granule));
        // SAFETY: `at..at + size` are granules of this range's reserved
        // address space that the bookkeeping says are unmapped; `physical`
        // is exactly that long.
        if let Err(err) = unsafe { sys::cuMemMap(at, size, 0, physical, 0) }.result() {
            // SAFETY: created above and mapped nowhere.
            let _ = unsafe { sys::cuMemRelease(physical) };
            return Err(err);
        }
        Ok(physical)
    }

    fn allow_access(
        &self,
        run: &std::ops::Range<u64>,
        granule: u64,
        ordinal: i32,
    ) -> Result<(), DriverError> {
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let bytes = run.end.saturating_sub(run.start).saturating_mul(granule);
        let size = usize::try_from(bytes).unwrap_or(usize::MAX);
        let at = self.address(run.start.saturating_mul(granule));
        // SAFETY: every granule of the run was mapped by this call.
        unsafe { sys::cuMemSetAccess(at, size, &access, 1) }.result()
    }

    /// Unmap one physical handle, mapped at the granules `run`, and free
    /// its memory (errors are the driver's to report on the next call;
    /// nothing here can be retried).
    fn unmap_handle(&self, run: &Range<u64>, granule: u64, physical: CUmemGenericAllocationHandle) {
        let bytes = granules(run).saturating_mul(granule);
        let size = usize::try_from(bytes).unwrap_or(usize::MAX);
        // SAFETY: `physical` is mapped at exactly these granules, and the
        // caller waited for the stream's work on them.
        unsafe {
            let _ = sys::cuMemUnmap(self.address(run.start.saturating_mul(granule)), size);
            let _ = sys::cuMemRelease(physical);
        }
    }

    /// Give back in `batch` the granules `handle` names (whole, live):
    /// they stay mapped until [`unmap_doomed`](Self::unmap_doomed).
    pub(super) fn doom(&mut self, handle: &StorageHandle, batch: u64) -> bool {
        self.map.doom(handle, batch)
    }

    /// Bytes given back and still mapped.
    pub(super) fn doomed_bytes(&self) -> u64 {
        self.map.doomed_bytes()
    }

    /// Unmap and release the physical handles that the granules of
    /// `handle` still waiting in `batch` complete (`GranuleMap::unmap_doomed`);
    /// the granules gone. The stream must be done with them (the batch's
    /// fence passed) and the context bound.
    pub(super) fn unmap_doomed(
        &mut self,
        handle: &StorageHandle,
        batch: u64,
        keep: bool,
        ops: &mut DriverOps,
    ) -> u64 {
        let runs = self.map.unmap_doomed(handle, batch, keep);
        self.release_handles(runs, ops)
    }

    /// Unmap every spare handle, not released, for another storage of the
    /// device to adopt: the handles. The context bound.
    pub(super) fn hand_over_spares(&mut self, ops: &mut DriverOps) -> Vec<LooseHandle> {
        let granule = self.map.granule();
        let mut handed = Vec::new();
        for run in self.map.hand_over_spares() {
            let Some((run, physical)) = self.handles.remove(&run.start) else {
                continue;
            };
            let size =
                usize::try_from(granules(&run).saturating_mul(granule)).unwrap_or(usize::MAX);
            // SAFETY: a spare: mapped at exactly these granules, its fence
            // passed, nothing of this storage's touches it.
            let _ =
                unsafe { sys::cuMemUnmap(self.address(run.start.saturating_mul(granule)), size) };
            ops.handed_over(1, granules(&run));
            handed.push(LooseHandle::new(granules(&run), granule, physical));
        }
        handed
    }

    /// Unmap and release every spare handle; the granules gone. The
    /// context bound.
    pub(super) fn release_spares(&mut self, ops: &mut DriverOps) -> u64 {
        let runs = self.map.release_spares();
        self.release_handles(runs, ops)
    }

    /// Unmap and release the physical handles that start the granule runs
    /// `runs` (as the granule map gave them up); the granules gone.
    fn release_handles(
        &mut self,
        runs: impl IntoIterator<Item = Range<u64>>,
        ops: &mut DriverOps,
    ) -> u64 {
        let granule = self.map.granule();
        let mut gone: u64 = 0;
        for run in runs {
            if let Some((run, physical)) = self.handles.remove(&run.start) {
                self.unmap_handle(&run, granule, physical);
                ops.unmapped(1, granules(&run));
                gone = gone.saturating_add(granules(&run));
            }
        }
        gone
    }

    /// Unmap everything, keeping the physical handles whole (not
    /// released), and give the address space back: the handles. The
    /// stream must be done with the bytes and the context bound.
    pub(super) fn release_keeping_handles(mut self, ops: &mut DriverOps) -> Vec<LooseHandle> {
        let granule = self.map.granule();
        let mut kept = Vec::with_capacity(self.handles.len());
        for (_, (run, physical)) in std::mem::take(&mut self.handles) {
            let size =
                usize::try_from(granules(&run).saturating_mul(granule)).unwrap_or(usize::MAX);
            // SAFETY: mapped at exactly these granules; the stream is done
            // with them (the range's free passed its fence).
            let _ =
                unsafe { sys::cuMemUnmap(self.address(run.start.saturating_mul(granule)), size) };
            kept.push(LooseHandle::new(granules(&run), granule, physical));
        }
        let (handles, granules_kept) = loose::count(&kept);
        ops.range_freed_keeping(handles, granules_kept);
        let size = usize::try_from(self.map.size()).unwrap_or(usize::MAX);
        // SAFETY: the range's own reservation, nothing mapped in it now.
        let _ = unsafe { sys::cuMemAddressFree(self.base, size) };
        kept
    }

    /// Unmap everything and give the address space back. The stream must
    /// be done with the bytes and the context bound.
    pub(super) fn release(mut self, ops: &mut DriverOps) {
        let granule = self.map.granule();
        let handles = self.handles.len() as u64;
        let mut mapped: u64 = 0;
        for (_, (run, physical)) in std::mem::take(&mut self.handles) {
            mapped = mapped.saturating_add(granules(&run));
            self.unmap_handle(&run, granule, physical);
        }
        ops.range_freed(handles, mapped);
        let size = usize::try_from(self.map.size()).unwrap_or(usize::MAX);
        // SAFETY: the range's own reservation, nothing mapped in it now.
        let _ = unsafe { sys::cuMemAddressFree(self.base, size) };
    }
}
