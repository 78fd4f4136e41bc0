//! Physical handles handed over between the storages of one device: a
//! stream that gives memory back for another's growth unmaps its spare
//! handles without releasing them (`DeviceStorage::hand_over_spares`),
//! and the growing stream maps them where it would have created handles
//! (`DeviceStorage::adopt_handles`). A handle's cycle costs the driver
//! per handle, not per byte (`shared/torch-h200/README.md`): handed
//! over, it skips a release and a create, 22.9 of the 73.1 us a granule
//! costs to move from one stream to another. `docs/memory.md`, "Handles
//! handed between streams".

// Granule counts and sizes multiply into bytes: saturating, never wrapping.
#![allow(clippy::arithmetic_side_effects)]

use super::granules::Mapping;
use super::{DriverOps, GranuleMap, granules_in};
use std::ops::Range;

/// A physical handle a storage gave up unmapped and not released, for
/// another storage of the same device to map: it holds device memory
/// until one maps it or releases it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LooseHandle {
    /// Its granules.
    granules: u64,
    /// Bytes of one granule (the device's).
    granule: u64,
    /// The driver's handle (`CUmemGenericAllocationHandle`); 0 where the
    /// storage models the device.
    raw: u64,
}

impl LooseHandle {
    /// A handle of `granules` granules of `granule` bytes, `raw` to the
    /// driver (what a storage that implements
    /// [`hand_over_spares`](super::DeviceStorage::hand_over_spares) makes;
    /// the storages of one device read one another's `raw`).
    pub fn new(granules: u64, granule: u64, raw: u64) -> Self {
        Self {
            granules,
            granule,
            raw,
        }
    }

    /// Its granules.
    pub fn granules(&self) -> u64 {
        self.granules
    }

    /// The memory it holds.
    pub fn bytes(&self) -> u64 {
        self.granules.saturating_mul(self.granule)
    }

    /// Bytes of one of its granules.
    pub fn granule(&self) -> u64 {
        self.granule
    }

    /// The driver's handle.
    pub fn raw(&self) -> u64 {
        self.raw
    }
}

/// The handles a storage adopted, unmapped, until its maps use them or
/// it releases them.
#[derive(Debug, Default)]
pub(crate) struct Adopted {
    handles: Vec<LooseHandle>,
}

impl Adopted {
    /// Keep the handles of `granule` bytes a granule (a storage adopts
    /// only its own device's); the others are returned.
    pub(crate) fn adopt(
        &mut self,
        handles: Vec<LooseHandle>,
        granule: Option<u64>,
    ) -> Vec<LooseHandle> {
        let (kept, refused): (Vec<_>, Vec<_>) = handles
            .into_iter()
            .partition(|handle| Some(handle.granule) == granule && handle.granules > 0);
        self.handles.extend(kept);
        refused
    }

    /// Their lengths in granules, for a map's plan.
    pub(crate) fn lengths(&self) -> Vec<u64> {
        self.handles.iter().map(LooseHandle::granules).collect()
    }

    /// The memory they hold.
    pub(crate) fn bytes(&self) -> u64 {
        (self.handles.iter()).fold(0, |sum, handle| sum.saturating_add(handle.bytes()))
    }

    /// Take out what `mapping` (planned with [`lengths`](Self::lengths))
    /// uses: a handle for each adopted run, in its order, and, where it
    /// releases the rest, all those left.
    pub(crate) fn take_for(&mut self, mapping: &Mapping) -> (Vec<LooseHandle>, Vec<LooseHandle>) {
        let mut mapped = Vec::with_capacity(mapping.adopted.len());
        for run in &mapping.adopted {
            let len = run.end - run.start;
            if let Some(at) = self.handles.iter().position(|h| h.granules == len) {
                mapped.push(self.handles.swap_remove(at));
            }
        }
        let released = if mapping.loose_released.0 > 0 {
            std::mem::take(&mut self.handles)
        } else {
            Vec::new()
        };
        (mapped, released)
    }

    /// Take every handle out (to release them).
    pub(crate) fn take_all(&mut self) -> Vec<LooseHandle> {
        std::mem::take(&mut self.handles)
    }

    /// [`adopt`](Self::adopt), the bytes of those kept added to `held`
    /// (what their storage holds).
    pub(crate) fn adopt_held(
        &mut self,
        handles: Vec<LooseHandle>,
        granule: Option<u64>,
        held: &mut u64,
    ) -> Vec<LooseHandle> {
        let before = self.bytes();
        let refused = self.adopt(handles, granule);
        *held = held.saturating_add(self.bytes().saturating_sub(before));
        refused
    }

    /// Keep the physical handles of `range`, which a storage that models
    /// the device frees while it holds spares: unmapped whole, counted in
    /// `ops` as not released (their bytes stay held), for its next maps or
    /// another stream's.
    pub(crate) fn keep_range(&mut self, range: &GranuleMap, ops: &mut DriverOps) {
        ops.range_freed_keeping(range.handle_count(), range.mapped_granules());
        let granule = range.granule();
        (self.handles).extend(
            (range.handle_lengths().into_iter())
                .filter(|&len| len > 0)
                .map(|len| LooseHandle::new(len, granule, 0)),
        );
    }

    /// Take every handle out, their bytes off `held`: to hand them over.
    pub(crate) fn take_all_held(&mut self, held: &mut u64) -> Vec<LooseHandle> {
        *held = held.saturating_sub(self.bytes());
        self.take_all()
    }

    /// Release every handle, each through `release` (the driver's
    /// `cuMemRelease`; nothing where the storage models the device),
    /// counted in `ops` and its bytes off `held`.
    pub(crate) fn release_all(
        &mut self,
        ops: &mut DriverOps,
        held: &mut u64,
        release: impl FnMut(&LooseHandle),
    ) {
        let handles = self.take_all_held(held);
        handles.iter().for_each(release);
        let (count, granules) = count(&handles);
        ops.released_unmapped(count, granules);
    }
}

/// The spare handles a granule map gave up as `runs` (of `granule`-byte
/// granules), handed over by a storage that models the device: counted
/// in `ops` as unmapped and not released, their bytes off `held`.
pub(crate) fn hand_over_modeled(
    runs: &[Range<u64>],
    granule: u64,
    ops: &mut DriverOps,
    held: &mut u64,
) -> Vec<LooseHandle> {
    let granules = granules_in(runs);
    ops.handed_over(runs.len() as u64, granules);
    *held = held.saturating_sub(granules.saturating_mul(granule));
    (runs.iter())
        .map(|run| LooseHandle::new(run.end - run.start, granule, 0))
        .collect()
}

/// How many handles, and granules, `handles` are.
pub(crate) fn count(handles: &[LooseHandle]) -> (u64, u64) {
    (
        handles.len() as u64,
        (handles.iter()).fold(0, |sum, handle| sum + handle.granules),
    )
}
