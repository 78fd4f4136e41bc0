//! A storage that counts pages and bytes but holds no memory: what replay and
//! the scaling benches use, so a trace that peaks at 80 GB replays on a
//! machine with 24 GB (as RMM's replay simulates a GPU of a given size).

use super::{DeviceStorage, Resource, StorageError, StorageHandle, StorageId, check_range};
use std::collections::HashMap;

/// Synthetic addresses put each page in its own 1 TiB window, so addresses
/// of different pages never overlap and an offset reads off directly.
const ADDRESS_WINDOW_BITS: u32 = 40;

/// Counts pages and bytes; reads and writes answer [`StorageError::NoBacking`].
#[derive(Debug)]
pub struct VirtualStorage {
    /// Size of each live page.
    pages: HashMap<StorageId, u64>,
    /// Pages queued by `deallocate`.
    pending: Vec<StorageId>,
    /// The next id; never reused.
    next_id: u64,
    /// Bytes held, pending pages included.
    bytes: u64,
    /// The alignment of page starts this storage reports.
    alignment: u64,
    /// Bytes moved by `copy` so far.
    bytes_copied: u64,
}

impl Default for VirtualStorage {
    fn default() -> Self {
        Self::new()
    }
}

impl VirtualStorage {
    /// An empty storage with 256-byte alignment (a CUDA device's).
    pub fn new() -> Self {
        Self {
            pages: HashMap::new(),
            pending: Vec::new(),
            next_id: 1,
            bytes: 0,
            alignment: 256,
            bytes_copied: 0,
        }
    }

    /// Bytes moved by [`copy`](DeviceStorage::copy) so far.
    pub fn bytes_copied(&self) -> u64 {
        self.bytes_copied
    }

    fn page_size(&self, id: StorageId) -> Result<u64, StorageError> {
        self.pages
            .get(&id)
            .copied()
            .ok_or(StorageError::UnknownPage(id))
    }
}

impl DeviceStorage for VirtualStorage {
    fn alignment(&self) -> u64 {
        self.alignment
    }

    fn allocate(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        if size == 0 || size > 1 << ADDRESS_WINDOW_BITS {
            return Err(StorageError::InvalidSize(size));
        }
        let id = StorageId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1);
        self.pages.insert(id, size);
        self.bytes = self.bytes.saturating_add(size);
        Ok(StorageHandle::whole(id, size))
    }

    fn deallocate(&mut self, id: StorageId) {
        if self.pages.contains_key(&id) && !self.pending.contains(&id) {
            self.pending.push(id);
        }
    }

    fn flush(&mut self) {
        for id in self.pending.drain(..) {
            if let Some(size) = self.pages.remove(&id) {
                self.bytes = self.bytes.saturating_sub(size);
            }
        }
    }

    fn resource(&mut self, handle: &StorageHandle) -> Result<Resource, StorageError> {
        check_range(handle, self.page_size(handle.id)?, 0)?;
        Ok(Resource {
            // `check_range` kept the offset below the window's size.
            addr: (handle.id.0 << ADDRESS_WINDOW_BITS).wrapping_add(handle.offset),
            len: handle.size,
        })
    }

    fn write(&mut self, _handle: &StorageHandle, _data: &[u8]) -> Result<(), StorageError> {
        Err(StorageError::NoBacking)
    }

    fn read(&mut self, _handle: &StorageHandle, _out: &mut [u8]) -> Result<(), StorageError> {
        Err(StorageError::NoBacking)
    }

    fn copy(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        if from.size != to.size {
            return Err(StorageError::LengthMismatch {
                from: from.size,
                to: to.size,
            });
        }
        check_range(from, self.page_size(from.id)?, 0)?;
        check_range(to, self.page_size(to.id)?, 0)?;
        self.bytes_copied = self.bytes_copied.saturating_add(from.size);
        Ok(())
    }

    fn bytes_allocated(&self) -> u64 {
        self.bytes
    }
}
