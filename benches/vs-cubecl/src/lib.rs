//! What the comparison's bench and its memory tool share: a counting
//! storage for CubeCL (what `VirtualStorage` is for us) and CubeCL's
//! `MemoryManagement` set up as the bench drives it.

use cubecl_ir::MemoryDeviceProperties;
use cubecl_server::logging::ServerLogger;
use cubecl_server::memory_management::relocation::{CopyQueue, StorageCopy};
use cubecl_server::memory_management::{
    MemoryConfiguration as CubeConfig, MemoryManagement, MemoryManagementOptions,
};
use cubecl_server::server::{IoError, ServerError};
use cubecl_server::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use std::collections::HashMap;
use std::sync::Arc;

pub mod replays;

pub const MIB: u64 = 1 << 20;

/// For CubeCL, what `VirtualStorage` is for us: counts pages, holds no
/// bytes, so the comparison is manager time alone (BytesStorage zero-fills
/// every page, and glibc's calloc then memsets recycled heap memory).
#[derive(Default)]
pub struct CountingStorage {
    sizes: HashMap<StorageId, u64>,
    pending: Vec<StorageId>,
    bytes: u64,
    /// The pages a CUDA device would allocate and free for it
    /// (`cuMemAlloc`, `cuMemFree`), to price as streamalloc's are.
    pub ops: streamalloc::storage::DriverOps,
}

/// A CUDA device's granule, the unit a page's size is priced in.
const GRANULE: u64 = 2 * MIB;

impl ComputeStorage for CountingStorage {
    type Resource = ();

    fn alignment(&self) -> usize {
        32
    }

    fn get(&mut self, _handle: &StorageHandle) -> Result<(), IoError> {
        Ok(())
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let id = StorageId::new();
        self.sizes.insert(id, size);
        self.bytes += size;
        self.ops.pages_allocated += 1;
        self.ops.page_granules_allocated += size.div_ceil(GRANULE).max(1);
        Ok(StorageHandle::new(
            id,
            StorageUtilization { offset: 0, size },
        ))
    }

    fn dealloc(&mut self, id: StorageId) {
        self.pending.push(id);
    }

    fn flush(&mut self) {
        for id in self.pending.drain(..) {
            if let Some(size) = self.sizes.remove(&id) {
                self.bytes -= size;
                self.ops.pages_freed += 1;
                self.ops.page_granules_freed += size.div_ceil(GRANULE).max(1);
            }
        }
    }

    fn bytes_allocated(&self) -> u64 {
        self.bytes
    }
}

/// Relocation copies that move no bytes (there are none).
pub struct CountedCopies;

impl CopyQueue<CountingStorage> for CountedCopies {
    fn wait_device(&mut self) -> Result<(), ServerError> {
        Ok(())
    }
    fn copy(&mut self, _storage: &mut CountingStorage, _copy: &StorageCopy) -> Result<(), IoError> {
        Ok(())
    }
    fn wait_copies(&mut self) -> Result<(), ServerError> {
        Ok(())
    }
}

/// CubeCL's `MemoryManagement` in `config` on a device of `max_page` bytes
/// per page and 32-byte alignment.
pub fn cubecl_with<S: ComputeStorage>(
    storage: S,
    config: CubeConfig,
    max_page: u64,
) -> MemoryManagement<S> {
    MemoryManagement::from_configuration(
        storage,
        &MemoryDeviceProperties::new(max_page, 32),
        config,
        Arc::new(ServerLogger::default()),
        MemoryManagementOptions::new("bench"),
    )
}

/// CubeCL's default configuration, 128 MiB pages at most.
pub fn cubecl<S: ComputeStorage>(storage: S) -> MemoryManagement<S> {
    cubecl_with(storage, CubeConfig::default(), 128 * MIB)
}
