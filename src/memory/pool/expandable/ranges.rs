//! The ranges of address space an expandable pool reserves, and the
//! granules it maps and unmaps in them: a void run mapped joins the free
//! block before it; a span of whole free granules unmapped joins the void
//! runs beside it; a range all void goes back.

use super::{ExpandablePool, Range, VOID};
use crate::memory::pool::arena::{Arena, NONE};
use crate::memory::pool::page::{Backing, align_up};
use crate::storage::{DeviceStorage, StorageError, StorageHandle};

impl ExpandablePool {
    /// Reserve a range that holds at least `aligned` bytes, all void.
    pub(super) fn add_range(
        &mut self,
        storage: &mut dyn DeviceStorage,
        aligned: u64,
    ) -> Result<u32, StorageError> {
        let size = self.range_size.max(align_up(aligned, self.granule));
        let handle = storage.reserve_range(size)?;
        let base = match storage.resource(&handle) {
            Ok(resource) => resource.addr,
            Err(err) => {
                storage.deallocate(handle.id);
                storage.flush();
                return Err(err);
            }
        };
        let index = self.spare.pop().unwrap_or_else(|| {
            self.ranges.push(Range {
                backing: None,
                size: 0,
                first: NONE,
                live: 0,
                used: 0,
                mapped: 0,
                guards: 0,
                held: false,
                let_go: Vec::new(),
            });
            (self.ranges.len() - 1) as u32
        });
        let first = self.arena.add_page(index, size, false);
        self.arena.occupy(first, VOID);
        self.voids.insert((index, 0), first);
        self.unmapped_ranges += 1;
        self.ranges[index as usize] = Range {
            backing: Some(Backing { handle, base }),
            size,
            first,
            live: 0,
            used: 0,
            mapped: 0,
            guards: 0,
            held: true,
            let_go: Vec::new(),
        };
        self.stats.range_added();
        Ok(index)
    }

    /// Map the first `bytes` of the void run `node` and return the free
    /// block they join (merged with a free block before them).
    pub(super) fn map_void(
        &mut self,
        storage: &mut dyn DeviceStorage,
        node: u32,
        bytes: u64,
    ) -> Result<u32, StorageError> {
        let index = self.arena.page(node);
        let offset = self.arena.offset(node);
        let handle = self.range_handle(index, offset, bytes);
        storage.map(&handle)?;
        self.voids.remove(&(index, offset));
        if bytes < self.arena.size(node) {
            let rest = self.arena.split(node, bytes);
            self.voids.insert((index, offset + bytes), rest);
        }
        let range = &mut self.ranges[index as usize];
        if range.mapped == 0 {
            self.unmapped_ranges -= 1;
        }
        range.mapped += bytes;
        let listed = range.guards == 0;
        self.stats.mapped(bytes);
        Ok(self.arena.free(node, listed))
    }

    /// The storage handle of `bytes` at `offset` of range `index`.
    pub(super) fn range_handle(&self, index: u32, offset: u64, bytes: u64) -> StorageHandle {
        let backing = self.ranges[index as usize]
            .backing
            .expect("a held range has its reservation");
        StorageHandle {
            id: backing.handle.id,
            offset,
            size: bytes,
        }
    }

    /// Unmap the granules `first..last` (range offsets, on granules) of the
    /// free block `node`, which holds them, or the part of them the storage
    /// can give back whole (`DeviceStorage::whole_handles`: a physical
    /// handle partly in use would free nothing, so the rest stays mapped
    /// and free, as the allocator sees it and can use it): the bytes
    /// unmapped, and the void run they joined (`node` where none went).
    /// What lies below them stays the block `node`, so a caller may go on
    /// to unmap lower spans of it.
    pub(super) fn unmap_span(
        &mut self,
        storage: &mut dyn DeviceStorage,
        node: u32,
        first: u64,
        last: u64,
    ) -> (u64, u32) {
        let index = self.arena.page(node);
        let whole = storage.whole_handles(&self.range_handle(index, first, last - first));
        if whole.size == 0 {
            return (0, node);
        }
        let (first, last) = (whole.offset, whole.offset + whole.size);
        let start = self.arena.offset(node);
        let mut middle = node;
        if first > start {
            middle = self.arena.split(node, first - start);
        }
        if last < first + self.arena.size(middle) {
            self.arena.split(middle, last - first);
        }
        self.arena.occupy(middle, VOID);
        storage.unmap(&self.range_handle(index, first, last - first));
        // One void run for neighbouring ones, so a growth finds them whole.
        let mut run = middle;
        let mut key = (index, first);
        let prev = self.arena.prev(middle);
        if prev != NONE && self.arena.is_carved_by(prev, VOID) {
            self.voids.remove(&(index, self.arena.offset(prev)));
            self.arena.merge_carved_next(prev);
            run = prev;
            key = (index, self.arena.offset(prev));
        }
        let next = self.arena.next(run);
        if next != NONE && self.arena.is_carved_by(next, VOID) {
            self.voids.remove(&(index, self.arena.offset(next)));
            self.arena.merge_carved_next(run);
        }
        self.voids.insert(key, run);
        let range = &mut self.ranges[index as usize];
        range.mapped -= last - first;
        if range.mapped == 0 {
            self.unmapped_ranges += 1;
        }
        self.stats.unmapped(last - first);
        (last - first, run)
    }

    /// Give back every range that is all void: address space is cheap to
    /// reserve again, and a range held for nothing would outlive the load.
    pub(super) fn give_back_void_ranges(&mut self, storage: &mut dyn DeviceStorage) -> bool {
        if self.unmapped_ranges == 0 {
            return false;
        }
        let mut released = false;
        for index in 0..self.ranges.len() as u32 {
            let range = &self.ranges[index as usize];
            let whole_void = range.held
                && range.live == 0
                && range.guards == 0
                && range.mapped == 0
                && self.arena.next(range.first) == NONE;
            if whole_void {
                self.release(storage, index);
                released = true;
            }
        }
        released
    }

    /// Give range `index` back, whatever is still mapped in it.
    fn release(&mut self, storage: &mut dyn DeviceStorage, index: u32) {
        let range = &mut self.ranges[index as usize];
        range.held = false;
        let mapped = std::mem::take(&mut range.mapped);
        if mapped == 0 {
            self.unmapped_ranges -= 1;
        }
        Backing::give_back(&mut range.backing, storage);
        self.voids.retain(|&(at, _), _| at != index);
        self.stats.unmapped(mapped);
        self.stats.range_removed();
        self.spare.push(index);
    }

    pub(crate) fn release_all(&mut self, storage: &mut dyn DeviceStorage) {
        for range in &mut self.ranges {
            Backing::give_back(&mut range.backing, storage);
        }
        self.ranges.clear();
        self.spare.clear();
        self.unmapped_ranges = 0;
        self.voids.clear();
        self.idle_due = None;
        self.untrimmable = 0;
        self.arena = Arena::default();
        self.used = 0;
        self.fence = None;
        self.stats.clear_usage();
    }
}
