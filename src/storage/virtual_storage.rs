//! A storage that counts pages and bytes but holds no memory: what replay and
//! the scaling benches use, so a trace that peaks at 80 GB replays on a
//! machine with 24 GB (as RMM's replay simulates a GPU of a given size).

use super::give_back::{Batch, GiveBack, Lag, LagClock};
use super::id_map::IdMap;
use super::loose::{self, Adopted};
use super::{
    DeviceStorage, DriverOps, GranuleMap, HandleCut, HandleSize, LooseHandle, PathLedger, Resource,
    StorageError, StorageHandle, StorageId, UseFence, UserStream, check_range,
};
use crate::saturating::SaturatingSum;

/// The granule a `VirtualStorage` maps in by default: a CUDA device's
/// (`cuMemGetAllocationGranularity` answers 2 MiB on current GPUs), so a
/// replay counts what a GPU would map.
pub const DEFAULT_GRANULE: u64 = 2 * 1024 * 1024;

/// Synthetic addresses put each page in its own 1 TiB window, so addresses
/// of different pages never overlap and an offset reads off directly.
const ADDRESS_WINDOW_BITS: u32 = 40;

/// Bytes a [`VirtualStorage`] mapped and unmapped over its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapChurn {
    /// Bytes mapped (every `map`).
    pub mapped: u64,
    /// Bytes unmapped (every `unmap` that took effect at a flush).
    pub unmapped: u64,
}

/// Counts pages and bytes; reads and writes answer [`StorageError::NoBacking`].
#[derive(Debug)]
pub struct VirtualStorage {
    /// Size of each live page.
    pages: IdMap<u64>,
    /// The next id; never reused.
    next_id: u64,
    /// Bytes held, those queued to go back included.
    bytes: u64,
    /// The alignment of page starts this storage reports.
    alignment: u64,
    /// Bytes moved by `copy` so far.
    bytes_copied: u64,
    /// Bytes mapped and unmapped so far (what a GPU's driver would map
    /// and unmap, a granule at a time).
    churn: MapChurn,
    /// The granule of its virtual memory; `None`: pages only.
    granule: Option<u64>,
    /// The most granules one physical handle covers.
    handle_size: HandleSize,
    /// Reserved ranges and what is mapped in them.
    ranges: IdMap<GranuleMap>,
    /// Pages, ranges and granules given back, queued or behind fences.
    give_back: GiveBack<Lag>,
    /// When a fence passes: flushes counted, and how many it lags.
    clock: LagClock,
    /// Whether handles given back are kept as spares (`hold_spares`).
    hold_spares: bool,
    /// Handles another storage of the device handed over, unmapped.
    adopted: Adopted,

    /// What a CUDA device's driver would have been asked (`driver.rs`).
    ops: DriverOps,
    /// The operations by the path that asked for them.
    paths: PathLedger,
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
            pages: IdMap::default(),
            next_id: 1,
            bytes: 0,
            alignment: 256,
            bytes_copied: 0,
            churn: MapChurn::default(),
            granule: Some(DEFAULT_GRANULE),
            handle_size: HandleSize::default(),
            ranges: IdMap::default(),
            give_back: GiveBack::default(),
            clock: LagClock::default(),
            hold_spares: false,
            adopted: Adopted::default(),
            ops: DriverOps::default(),
            paths: PathLedger::default(),
        }
    }

    /// The same storage, its device running `lag` flushes behind: what
    /// a flush gives back goes only `lag` flushes later (0, the default:
    /// at once, as on a GPU with no kernels queued, which is what a replay
    /// of allocation events is). Deterministic, so a replay with a lag is
    /// still the same on every run; what it shows is the memory a device
    /// holds while its host does not wait, and the granules mapped again
    /// before they went (taken back with no driver call).
    pub fn with_reclaim_lag(mut self, lag: u64) -> Self {
        self.clock.lag = lag;
        self
    }

    /// The same storage, backing what it maps with physical handles of up
    /// to `granules` granules (at least 1): fewer driver calls, and memory
    /// that goes back a whole handle at a time (`docs/memory.md`,
    /// "Physical handles").
    pub fn with_handle_granules(mut self, granules: u64) -> Self {
        self.handle_size = HandleSize::new(granules);
        self
    }

    /// An empty storage whose virtual memory maps `granule` bytes at a
    /// time (a multiple of the alignment), or has none (`None`: pages only,
    /// as a device without virtual memory management).
    pub fn with_granule(granule: Option<u64>) -> Self {
        Self {
            granule: granule.filter(|&g| g > 0),
            ..Self::new()
        }
    }

    /// Bytes moved by [`copy`](DeviceStorage::copy) so far.
    pub fn bytes_copied(&self) -> u64 {
        self.bytes_copied
    }

    /// Bytes mapped and unmapped so far: a device's driver maps and unmaps
    /// them a granule at a time, at a cost no host replay shows.
    pub fn map_churn(&self) -> MapChurn {
        self.churn
    }

    fn page_size(&self, id: StorageId) -> Result<u64, StorageError> {
        self.pages
            .get(&id)
            .copied()
            .ok_or(StorageError::UnknownPage(id))
    }

    /// Check a move of `from`'s bytes to `to` (same length, both inside
    /// memory) and count its bytes; counted by the caller as a copy or a
    /// slide.
    fn moved(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        if from.size != to.size {
            return Err(StorageError::LengthMismatch {
                from: from.size,
                to: to.size,
            });
        }
        self.check(from)?;
        self.check(to)?;
        self.bytes_copied = self.bytes_copied.saturating_add(from.size);
        Ok(())
    }

    /// Give the driver what `batch` holds: its granules still given back,
    /// then its pages and ranges.
    fn reclaim(&mut self, batch: Batch<Lag>) {
        for handle in batch.unmaps {
            let Some(range) = self.ranges.get_mut(&handle.id) else {
                continue;
            };
            let released = range.unmap_doomed(&handle, batch.id, self.hold_spares);
            let bytes = self.ops.released_runs(&released, range.granule());
            self.bytes = self.bytes.saturating_sub(bytes);
            self.churn.unmapped = self.churn.unmapped.saturating_add(bytes);
        }
        for id in batch.frees {
            if let Some(size) = self.pages.remove(&id) {
                self.bytes = self.bytes.saturating_sub(size);
                self.ops.page_freed(size);
            }
            if let Some(range) = self.ranges.remove(&id) {
                if self.hold_spares {
                    // Its handles kept whole, unmapped (`DeviceStorage::hold_spares`).
                    self.adopted.keep_range(&range, &mut self.ops);
                    continue;
                }
                self.bytes = self.bytes.saturating_sub(range.mapped_bytes());
                (self.ops).range_freed(range.handle_count(), range.mapped_granules());
            }
        }
    }

    /// Check an access of `handle` (a page's bytes, or mapped bytes of a range).
    fn check(&self, handle: &StorageHandle) -> Result<(), StorageError> {
        match self.ranges.get(&handle.id) {
            Some(range) => range.check_access(handle, 0),
            None => check_range(handle, self.page_size(handle.id)?, 0),
        }
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
        self.ops.page_allocated(size);
        Ok(StorageHandle::whole(id, size))
    }

    fn deallocate(&mut self, id: StorageId) {
        let known = self.pages.contains_key(&id) || self.ranges.contains_key(&id);
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

    fn bytes_in_reclaim(&self) -> u64 {
        let held = |id: &StorageId| {
            (self.pages.get(id).copied())
                .or_else(|| self.ranges.get(id).map(GranuleMap::mapped_bytes))
                .unwrap_or(0)
        };
        let doomed = (self.ranges.iter()).map(|(id, range)| (id, range.doomed_bytes()));
        self.give_back.bytes_waiting(held, doomed)
    }

    fn whole_handles(&self, range: &StorageHandle) -> StorageHandle {
        (self.ranges.get(&range.id)).map_or(*range, |map| map.whole_handles(range))
    }

    fn first_handle_end(&self, range: &StorageHandle) -> u64 {
        let end = range.offset.saturating_add(range.size);
        (self.ranges.get(&range.id)).map_or(end, |map| map.first_handle_end(range))
    }

    fn set_handle_cut(&mut self, cut: HandleCut) {
        self.handle_size = self.handle_size.with_cut(cut);
        for map in self.ranges.values_mut() {
            map.set_handle_cut(cut);
        }
    }

    fn bytes_stranded(&self) -> u64 {
        self.ranges
            .values()
            .map(GranuleMap::stranded_bytes)
            .saturating_sum()
    }

    fn resource(&mut self, handle: &StorageHandle) -> Result<Resource, StorageError> {
        match self.ranges.get(&handle.id) {
            // The address of a range's bytes is known before they are mapped.
            Some(range) => check_range(handle, range.size(), 0)?,
            None => check_range(handle, self.page_size(handle.id)?, 0)?,
        }
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

    copy_and_slide_by!(moved);

    fn bytes_allocated(&self) -> u64 {
        self.bytes
    }

    counts_driver_ops!();

    uses_lagged_by_clock!();

    fn granule(&self) -> Option<u64> {
        self.granule
    }

    fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        let granule = self.granule.ok_or(StorageError::NoVirtualMemory)?;
        if size > 1 << ADDRESS_WINDOW_BITS {
            return Err(StorageError::InvalidSize(size));
        }
        let range = GranuleMap::new(granule, size, self.handle_size)?;
        let id = StorageId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1);
        self.ranges.insert(id, range);
        self.ops.range_reserved();
        Ok(StorageHandle::whole(id, size))
    }

    fn map(&mut self, handle: &StorageHandle) -> Result<(), StorageError> {
        let range = self
            .ranges
            .get_mut(&handle.id)
            .ok_or(StorageError::UnknownPage(handle.id))?;
        let mapping = range.map(handle, &self.adopted.lengths())?;
        let granule = range.granule();
        self.adopted.take_for(&mapping);
        self.ops.mapping(&mapping);
        let released = mapping.released_granules().saturating_mul(granule);
        let created = mapping.created_granules().saturating_mul(granule);
        let moved = mapping.moved_granules().saturating_mul(granule);
        let adopted = mapping.adopted_granules().saturating_mul(granule);
        self.bytes = mapping.held_after(self.bytes, granule);
        self.churn.unmapped = (self.churn.unmapped)
            .saturating_add(released)
            .saturating_add(moved);
        self.churn.mapped = (self.churn.mapped)
            .saturating_add(created)
            .saturating_add(moved)
            .saturating_add(adopted);
        Ok(())
    }

    fn bytes_a_map_adds(&self, handle: &StorageHandle) -> u64 {
        (self.ranges.get(&handle.id)).map_or(handle.size, |range| {
            range.bytes_a_map_adds(handle, &self.adopted.lengths())
        })
    }

    fn hold_spares(&mut self, hold: bool) {
        self.hold_spares = hold;
    }

    fn bytes_spare(&self) -> u64 {
        (self.ranges.values().map(GranuleMap::spare_bytes))
            .saturating_sum()
            .saturating_add(self.adopted.bytes())
    }

    fn release_spares(&mut self) {
        for range in self.ranges.values_mut() {
            let released = range.release_spares();
            let bytes = self.ops.released_runs(&released, range.granule());
            self.bytes = self.bytes.saturating_sub(bytes);
            self.churn.unmapped = self.churn.unmapped.saturating_add(bytes);
        }
        (self.adopted).release_all(&mut self.ops, &mut self.bytes, |_| {});
    }

    fn hand_over_spares(&mut self) -> Vec<LooseHandle> {
        let mut handed = Vec::new();
        for range in self.ranges.values_mut() {
            let runs = range.hand_over_spares();
            let granule = range.granule();
            let given = loose::hand_over_modeled(&runs, granule, &mut self.ops, &mut self.bytes);
            let bytes = (given.iter().map(LooseHandle::bytes)).saturating_sum();
            self.churn.unmapped = self.churn.unmapped.saturating_add(bytes);
            handed.extend(given);
        }
        // Those kept from ranges it freed, unmapped already.
        handed.extend(self.adopted.take_all_held(&mut self.bytes));
        handed
    }

    fn adopt_handles(&mut self, handles: Vec<LooseHandle>) -> Vec<LooseHandle> {
        (self.adopted).adopt_held(handles, self.granule, &mut self.bytes)
    }

    fn unmap(&mut self, handle: &StorageHandle) {
        let batch = self.give_back.open_batch();
        let known =
            (self.ranges.get_mut(&handle.id)).is_some_and(|range| range.doom(handle, batch));
        self.give_back.unmap(handle, known);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_counts_what_is_mapped_and_refuses_the_rest() {
        let mut storage = VirtualStorage::with_granule(Some(1024));
        let range = storage.reserve_range(8 * 1024).unwrap();
        assert_eq!(storage.bytes_allocated(), 0);
        let two = range.sub_range(1024, 3072).unwrap();
        storage.map(&two).unwrap();
        assert_eq!(storage.bytes_allocated(), 2048);
        // Mapped twice, or not on granules: refused.
        assert!(matches!(
            storage.map(&two),
            Err(StorageError::Unmapped { .. })
        ));
        let odd = range.sub_range(100, 1024).unwrap();
        assert!(matches!(
            storage.map(&odd),
            Err(StorageError::Unmapped { .. })
        ));
        // Copies touch mapped bytes only.
        let inside = range.sub_range(1100, 1200).unwrap();
        let outside = range.sub_range(3000, 3100).unwrap();
        assert!(storage.copy(&inside, &inside).is_ok());
        assert!(matches!(
            storage.copy(&inside, &outside),
            Err(StorageError::Unmapped { .. })
        ));
        // Unmapping waits for the flush; the range goes with what it holds.
        storage.unmap(&range.sub_range(1024, 2048).unwrap());
        assert_eq!(storage.bytes_allocated(), 2048);
        storage.flush();
        assert_eq!(storage.bytes_allocated(), 1024);
        // What a driver would have mapped and unmapped: the refusals none.
        assert_eq!(
            storage.map_churn(),
            MapChurn {
                mapped: 2048,
                unmapped: 1024
            }
        );
        storage.deallocate(range.id);
        storage.flush();
        assert_eq!(storage.bytes_allocated(), 0);
        assert!(
            VirtualStorage::with_granule(None)
                .reserve_range(1024)
                .is_err()
        );
    }
}
