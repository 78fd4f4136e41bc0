//! The CUDA device's virtual memory management (`cuMem*`): what an
//! expandable arena on a GPU stands on, as PyTorch's expandable segments.
//!
//! A range is address space from `cuMemAddressReserve`. Each granule mapped
//! into it is a physical allocation of its own (`cuMemCreate` of one
//! granule, `cuMemMap`, then `cuMemSetAccess` for the device): the driver
//! unmaps only whole mappings, and the arena unmaps granule by granule.
//! Unmapping (`cuMemUnmap`, `cuMemRelease`) happens at the storage's
//! flush, after its stream has finished the work that may touch the bytes;
//! the address space goes back (`cuMemAddressFree`) with the range.

use super::{DriverOps, GranuleMap, StorageError, StorageHandle};
use cudarc::driver::DriverError;
use cudarc::driver::sys::{self, CUdeviceptr, CUmemGenericAllocationHandle};
use std::collections::HashMap;

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
    /// Which granules are mapped.
    map: GranuleMap,
    /// The physical allocation behind each mapped granule, by index.
    granules: HashMap<u64, CUmemGenericAllocationHandle>,
}

impl CudaRange {
    /// Reserve `size` bytes of address space (a multiple of `granule`).
    /// The context must be bound.
    pub(super) fn reserve(size: u64, granule: u64) -> Result<Self, StorageError> {
        let map = GranuleMap::new(granule, size)?;
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
            granules: HashMap::new(),
        })
    }

    /// Which granules are mapped.
    pub(super) fn granule_map(&self) -> &GranuleMap {
        &self.map
    }

    /// Bytes mapped.
    pub(super) fn mapped_bytes(&self) -> u64 {
        self.map.mapped_bytes()
    }

    /// The device address of `offset` bytes into the range.
    pub(super) fn address(&self, offset: u64) -> CUdeviceptr {
        self.base.wrapping_add(offset)
    }

    /// Map physical memory behind `handle` (whole, unmapped granules), all
    /// or nothing: on a refusal what this call mapped is undone. `held` and
    /// `capacity` describe the storage for an out-of-memory error. The
    /// context must be bound.
    pub(super) fn map(
        &mut self,
        handle: &StorageHandle,
        ordinal: i32,
        ops: &mut DriverOps,
        held: u64,
        capacity: impl FnOnce() -> u64,
    ) -> Result<(), StorageError> {
        // The bookkeeping first: it refuses a range that is not whole,
        // unmapped granules before the driver is asked for anything.
        self.map.map(handle)?;
        let indices = self.map.granules(handle).unwrap_or(0..0);
        let granule = self.map.granule();
        let prop = properties(ordinal);
        let mut done = Vec::new();
        let mut failure = None;
        for index in indices {
            match self.map_granule(index, granule, &prop) {
                Ok(physical) => done.push((index, physical)),
                Err(err) => {
                    failure = Some(err);
                    break;
                }
            }
        }
        let created = done.len() as u64;
        ops.created_and_mapped(created);
        if failure.is_none() {
            ops.granted(created);
            failure = self.allow_access(handle, ordinal).err();
        }
        let Some(err) = failure else {
            self.granules.extend(done);
            return Ok(());
        };
        for (index, physical) in done {
            self.unmap_granule(index, granule, physical);
        }
        ops.unmapped(created);
        self.map.unmap(handle);
        Err(match err {
            DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) => StorageError::OutOfMemory {
                requested: handle.size,
                held,
                capacity: capacity(),
            },
            err => driver(err),
        })
    }

    fn map_granule(
        &self,
        index: u64,
        granule: u64,
        prop: &sys::CUmemAllocationProp,
    ) -> Result<CUmemGenericAllocationHandle, DriverError> {
        let size = usize::try_from(granule).unwrap_or(usize::MAX);
        let mut physical: CUmemGenericAllocationHandle = 0;
        // SAFETY: a fresh physical allocation of one granule into a local.
        unsafe { sys::cuMemCreate(&mut physical, size, prop, 0) }.result()?;
        let at = self.address(index.saturating_mul(granule));
        // SAFETY: `at` is a granule of this range's reserved address space
        // that the bookkeeping says is unmapped; `physical` is one granule.
        if let Err(err) = unsafe { sys::cuMemMap(at, size, 0, physical, 0) }.result() {
            // SAFETY: created above and mapped nowhere.
            let _ = unsafe { sys::cuMemRelease(physical) };
            return Err(err);
        }
        Ok(physical)
    }

    fn allow_access(&self, handle: &StorageHandle, ordinal: i32) -> Result<(), DriverError> {
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let size = usize::try_from(handle.size).unwrap_or(usize::MAX);
        // SAFETY: every granule of the span was mapped by this call.
        unsafe { sys::cuMemSetAccess(self.address(handle.offset), size, &access, 1) }.result()
    }

    /// Unmap one granule and free its memory (errors are the driver's to
    /// report on the next call; nothing here can be retried).
    fn unmap_granule(&self, index: u64, granule: u64, physical: CUmemGenericAllocationHandle) {
        let size = usize::try_from(granule).unwrap_or(usize::MAX);
        // SAFETY: `physical` is mapped at this granule, and the caller
        // waited for the stream's work on it.
        unsafe {
            let _ = sys::cuMemUnmap(self.address(index.saturating_mul(granule)), size);
            let _ = sys::cuMemRelease(physical);
        }
    }

    /// Unmap `handle` (whole, mapped granules); whether it named such.
    /// The stream must be done with the bytes and the context bound.
    pub(super) fn unmap(&mut self, handle: &StorageHandle, ops: &mut DriverOps) -> bool {
        let Some(indices) = self.map.granules(handle) else {
            return false;
        };
        if !self.map.unmap(handle) {
            return false;
        }
        let granule = self.map.granule();
        for index in indices {
            if let Some(physical) = self.granules.remove(&index) {
                self.unmap_granule(index, granule, physical);
                ops.unmapped(1);
            }
        }
        true
    }

    /// Unmap everything and give the address space back. The stream must
    /// be done with the bytes and the context bound.
    pub(super) fn release(mut self, ops: &mut DriverOps) {
        let granule = self.map.granule();
        let mapped = self.granules.len() as u64;
        for (index, physical) in std::mem::take(&mut self.granules) {
            self.unmap_granule(index, granule, physical);
        }
        ops.range_freed(mapped);
        let size = usize::try_from(self.map.size()).unwrap_or(usize::MAX);
        // SAFETY: the range's own reservation, nothing mapped in it now.
        let _ = unsafe { sys::cuMemAddressFree(self.base, size) };
    }
}
