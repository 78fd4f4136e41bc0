//! Byte access: where an allocation's bytes are (the storage range, the
//! address) and reading, writing and copying them. Every dereference goes
//! through [`MemoryManager::get_storage`], which gives a lazily carved page
//! its backing first; ranges are checked against the allocation before the
//! storage sees them.

use super::MemoryManager;
use crate::memory::error::MemoryError;
use crate::memory::handle::Allocation;
use crate::storage::{DeviceStorage, Resource, StorageHandle};

/// The resource behind an allocation, with a binding that keeps the
/// allocation alive (and so in place) for as long as this value lives.
#[derive(Debug)]
pub struct ManagedResource {
    /// The binding that holds the allocation.
    pub binding: crate::memory::Binding,
    /// The address and length.
    pub resource: Resource,
}

impl<S: DeviceStorage> MemoryManager<S> {
    /// The cursor recorded by [`bind`](Self::bind).
    pub fn get_cursor(&self, allocation: &Allocation) -> Result<u64, MemoryError> {
        Ok(self.live(allocation)?.1.cursor)
    }

    /// The storage range behind an allocation, giving a lazily carved page
    /// its backing first: this is the funnel every dereference passes.
    pub fn get_storage(&mut self, allocation: &Allocation) -> Result<StorageHandle, MemoryError> {
        let (_, live) = self.live(allocation)?;
        let (pool, placement, size) = (live.pool as usize, live.placement, live.size);
        let page = match self.pools[pool].page_storage(placement.page()) {
            Some(page) => page,
            None => self.pools[pool].materialize(&mut self.storage, placement.page())?,
        };
        Ok(StorageHandle {
            id: page.id,
            offset: page.offset + placement.offset,
            size,
        })
    }

    /// The storage range of bytes `start..end` of an allocation (`None`:
    /// from its start, to its end).
    pub(crate) fn get_storage_range(
        &mut self,
        allocation: &Allocation,
        start: Option<u64>,
        end: Option<u64>,
    ) -> Result<StorageHandle, MemoryError> {
        let whole = self.get_storage(allocation)?;
        let (start, end) = (start.unwrap_or(0), end.unwrap_or(whole.size));
        whole.sub_range(start, end).ok_or(MemoryError::OutOfBounds {
            start,
            end,
            size: whole.size,
        })
    }

    /// The address of bytes `start..end` of an allocation (`None`: from its
    /// start, to its end). Valid until the allocation is freed or moved;
    /// [`managed_resource`](Self::managed_resource) keeps it alive.
    pub fn get_resource(
        &mut self,
        allocation: &Allocation,
        start: Option<u64>,
        end: Option<u64>,
    ) -> Result<Resource, MemoryError> {
        let range = self.get_storage_range(allocation, start, end)?;
        Ok(self.storage.resource(&range)?)
    }

    /// [`get_resource`](Self::get_resource) with a binding that keeps the
    /// allocation alive while the resource is used.
    pub fn managed_resource(
        &mut self,
        allocation: &Allocation,
        start: Option<u64>,
        end: Option<u64>,
    ) -> Result<ManagedResource, MemoryError> {
        let resource = self.get_resource(allocation, start, end)?;
        Ok(ManagedResource {
            binding: allocation.binding(),
            resource,
        })
    }

    /// Write `data` at `offset` of the allocation. The written bytes are no
    /// longer tainted.
    pub fn write(
        &mut self,
        allocation: &Allocation,
        offset: u64,
        data: &[u8],
    ) -> Result<(), MemoryError> {
        let end = offset.saturating_add(data.len() as u64);
        let range = self.get_storage_range(allocation, Some(offset), Some(end))?;
        self.storage.write(&range, data)?;
        self.live_mut(allocation)?.taint.written(offset..end);
        Ok(())
    }

    /// Read `out.len()` bytes from `offset` of the allocation.
    pub fn read_into(
        &mut self,
        allocation: &Allocation,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), MemoryError> {
        let end = offset.saturating_add(out.len() as u64);
        let range = self.get_storage_range(allocation, Some(offset), Some(end))?;
        Ok(self.storage.read(&range, out)?)
    }

    /// Read `len` bytes from `offset` of the allocation.
    pub fn read(
        &mut self,
        allocation: &Allocation,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, MemoryError> {
        let size = self.live(allocation)?.1.size;
        let end = offset.saturating_add(len);
        if end > size {
            return Err(MemoryError::OutOfBounds {
                start: offset,
                end,
                size,
            });
        }
        let mut out = vec![0; len as usize];
        self.read_into(allocation, offset, &mut out)?;
        Ok(out)
    }

    /// Copy every byte of `from` to the start of `to` (same manager).
    pub fn copy(&mut self, from: &Allocation, to: &Allocation) -> Result<(), MemoryError> {
        let source = self.get_storage(from)?;
        let target = self.get_storage_range(to, Some(0), Some(source.size))?;
        self.storage.copy(&source, &target)?;
        let taint = self.live(from)?.1.taint.clone();
        self.live_mut(to)?.taint.replace_prefix(source.size, &taint);
        Ok(())
    }
}
