//! What a storage asks of the device's driver, counted by kind
//! ([`DriverOps`]), and what those calls cost on a real GPU, by a table of
//! measured per-call times ([`DriverCosts`]).
//!
//! Every storage counts the calls a CUDA device would make for the same
//! requests: `CudaStorage` what it really calls, `VirtualStorage` and
//! `HostStorage` what `CudaStorage` would call in their place. So a replay
//! on host memory or on no memory at all prices its driver time as the GPU
//! would, from exact counts: no wall clock, the same figure on every run.

// Counts and costs are summed and multiplied: saturating, never wrapping.
#![allow(clippy::arithmetic_side_effects)]

use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// The granule a page's size is counted in, for the per-size term of a
/// page's cost: a CUDA device's (2 MiB).
const PAGE_GRANULE: u64 = 2 * 1024 * 1024;

/// Driver operations a storage performed, by kind, and the most granules
/// it had mapped at once. Cumulative over the storage's life.
///
/// A physical handle is one `cuMemCreate`, of one granule or more (a
/// run of fresh granules is cut into handles: `storage/granules/`), so
/// `handles_created` counts the calls and `handle_granules_created` the
/// granules they cover; each is priced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverOps {
    /// Physical handles created (`cuMemCreate`).
    pub handles_created: u64,
    /// Granules of those handles.
    pub handle_granules_created: u64,
    /// Physical handles released (`cuMemRelease`).
    pub handles_released: u64,
    /// Granules of those handles.
    pub handle_granules_released: u64,
    /// Spare handles moved: unmapped where they were given back and
    /// mapped at fresh granules (each also counted in `maps`,
    /// `access_grants` and `unmaps`; none created or released).
    #[serde(default)]
    pub handles_moved: u64,
    /// Granules of those handles.
    #[serde(default)]
    pub handle_granules_moved: u64,
    /// Handles another stream's storage of the device handed over,
    /// mapped here (each also counted in `maps` and `access_grants`; none
    /// created).
    #[serde(default)]
    pub handles_adopted: u64,
    /// Granules of those handles.
    #[serde(default)]
    pub handle_granules_adopted: u64,
    /// Spare handles unmapped and handed over to another stream's storage
    /// of the device, or kept unmapped by this one from a range it freed
    /// while holding spares (each also counted in `unmaps`; none
    /// released).
    #[serde(default)]
    pub handles_handed_over: u64,
    /// Granules of those handles.
    #[serde(default)]
    pub handle_granules_handed_over: u64,
    /// Granules of adopted handles released without being mapped here
    /// (also in `handle_granules_released`, never in what is mapped).
    #[serde(default)]
    pub handle_granules_released_unmapped: u64,
    /// Handles mapped into address space (`cuMemMap`).
    pub maps: u64,
    /// Handles granted access (`cuMemSetAccess` costs per handle it
    /// covers, so one call over many handles counts each).
    pub access_grants: u64,
    /// Handles unmapped (`cuMemUnmap`, per handle for the same reason).
    pub unmaps: u64,
    /// Ranges of address space reserved (`cuMemAddressReserve`).
    pub ranges_reserved: u64,
    /// Ranges of address space freed (`cuMemAddressFree`).
    pub ranges_freed: u64,
    /// Pages allocated (`cuMemAlloc`).
    pub pages_allocated: u64,
    /// Their size in 2 MiB granules, rounded up.
    pub page_granules_allocated: u64,
    /// Pages freed (`cuMemFree`).
    pub pages_freed: u64,
    /// Their size in 2 MiB granules, rounded up.
    pub page_granules_freed: u64,
    /// Events recorded (`cuEventRecord`, with its `cuEventCreate`).
    pub events_recorded: u64,
    /// Events asked whether their work is done (`cuEventQuery`), or waited
    /// for (`cuEventSynchronize`, also counted in `stream_waits`).
    pub events_queried: u64,
    /// Times the host waited for a stream's work (`cuStreamSynchronize`,
    /// `cuEventSynchronize`): each costs at least an idle wait, and in a
    /// server all the work queued before it.
    pub stream_waits: u64,
    /// Streams made to wait on the device for another's work
    /// (`cuStreamWaitEvent`, each after a `cuEventRecord` counted in
    /// `events_recorded`): queued, never a host wait. Asked when a stream
    /// serves another from its room (`DeviceStorage::order_for`).
    #[serde(default)]
    pub stream_orders: u64,
    /// Copies queued (device to device, host to device, device to host).
    pub copies: u64,
    /// Bytes those copies moved.
    pub bytes_copied: u64,
    /// The most granules mapped at once.
    pub peak_granules_mapped: u64,
}

impl DriverOps {
    /// Granules mapped now: created and not yet released.
    pub fn granules_mapped(&self) -> u64 {
        self.handle_granules_created
            .saturating_add(self.handle_granules_adopted)
            .saturating_add(self.handle_granules_released_unmapped)
            .saturating_sub(self.handle_granules_released)
            .saturating_sub(self.handle_granules_handed_over)
    }

    /// Granules unmapped: those of handles released from a mapping, handed
    /// over to another stream, or moved elsewhere (each mapped once before).
    pub fn granules_unmapped(&self) -> u64 {
        self.handle_granules_released
            .saturating_sub(self.handle_granules_released_unmapped)
            .saturating_add(self.handle_granules_handed_over)
            .saturating_add(self.handle_granules_moved)
    }

    /// Every driver call counted, of every kind.
    pub fn calls(&self) -> u64 {
        [
            self.handles_created,
            self.handles_released,
            self.maps,
            self.access_grants,
            self.unmaps,
            self.ranges_reserved,
            self.ranges_freed,
            self.pages_allocated,
            self.pages_freed,
            self.events_recorded,
            self.events_queried,
            self.stream_waits,
            self.stream_orders,
            self.copies,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    /// Granule mappings made, however their memory came: handles created,
    /// spare handles moved, handles adopted from another stream (a granule
    /// mapped, unmapped and mapped again counts twice).
    pub fn granule_maps(&self) -> u64 {
        (self.handle_granules_created)
            .saturating_add(self.handle_granules_moved)
            .saturating_add(self.handle_granules_adopted)
    }

    /// What was counted since `earlier` (a count of the same storage
    /// taken before): each count's difference. The peak is not a count,
    /// and is 0.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            peak_granules_mapped: 0,
            ..self.zip(earlier, u64::saturating_sub)
        }
    }

    /// The counts of two storages together. The peak is the sum of the
    /// two peaks: an upper bound, since they need not peak together (a
    /// device's own peak is metered where its storages meet:
    /// [`DeviceBudget::peak_granules_mapped`](super::DeviceBudget::peak_granules_mapped)).
    pub fn combine(self, other: Self) -> Self {
        self.zip(&other, u64::saturating_add)
    }

    /// Every field of `self` and `other` put together by `with`.
    fn zip(&self, other: &Self, with: impl Fn(u64, u64) -> u64) -> Self {
        Self {
            handles_created: with(self.handles_created, other.handles_created),
            handle_granules_created: with(
                self.handle_granules_created,
                other.handle_granules_created,
            ),
            handles_released: with(self.handles_released, other.handles_released),
            handle_granules_released: with(
                self.handle_granules_released,
                other.handle_granules_released,
            ),
            handles_moved: with(self.handles_moved, other.handles_moved),
            handle_granules_moved: with(self.handle_granules_moved, other.handle_granules_moved),
            handles_adopted: with(self.handles_adopted, other.handles_adopted),
            handle_granules_adopted: with(
                self.handle_granules_adopted,
                other.handle_granules_adopted,
            ),
            handles_handed_over: with(self.handles_handed_over, other.handles_handed_over),
            handle_granules_handed_over: with(
                self.handle_granules_handed_over,
                other.handle_granules_handed_over,
            ),
            handle_granules_released_unmapped: with(
                self.handle_granules_released_unmapped,
                other.handle_granules_released_unmapped,
            ),
            maps: with(self.maps, other.maps),
            access_grants: with(self.access_grants, other.access_grants),
            unmaps: with(self.unmaps, other.unmaps),
            ranges_reserved: with(self.ranges_reserved, other.ranges_reserved),
            ranges_freed: with(self.ranges_freed, other.ranges_freed),
            pages_allocated: with(self.pages_allocated, other.pages_allocated),
            page_granules_allocated: with(
                self.page_granules_allocated,
                other.page_granules_allocated,
            ),
            pages_freed: with(self.pages_freed, other.pages_freed),
            page_granules_freed: with(self.page_granules_freed, other.page_granules_freed),
            events_recorded: with(self.events_recorded, other.events_recorded),
            events_queried: with(self.events_queried, other.events_queried),
            stream_waits: with(self.stream_waits, other.stream_waits),
            stream_orders: with(self.stream_orders, other.stream_orders),
            copies: with(self.copies, other.copies),
            bytes_copied: with(self.bytes_copied, other.bytes_copied),
            peak_granules_mapped: with(self.peak_granules_mapped, other.peak_granules_mapped),
        }
    }

    /// Physical handles of `granules` granules in all were created,
    /// mapped and granted access: `handles` of each.
    pub(crate) fn mapped(&mut self, handles: u64, granules: u64) {
        self.created_and_mapped(handles, granules);
        self.granted(handles);
    }

    /// `handles` physical handles of `granules` granules in all were
    /// created and mapped (access not yet granted).
    pub(crate) fn created_and_mapped(&mut self, handles: u64, granules: u64) {
        self.handles_created += handles;
        self.handle_granules_created += granules;
        self.maps += handles;
        self.peak_granules_mapped = self.peak_granules_mapped.max(self.granules_mapped());
    }

    /// `handles` spare handles of `granules` granules in all were unmapped
    /// and mapped again elsewhere, with access granted there.
    pub(crate) fn moved(&mut self, handles: u64, granules: u64) {
        self.handles_moved += handles;
        self.handle_granules_moved += granules;
        self.unmaps += handles;
        self.maps += handles;
        self.access_grants += handles;
    }

    /// `handles` handles of `granules` granules in all that another
    /// storage of the device handed over were mapped here (no handle
    /// created; access not yet granted).
    pub(crate) fn adopted(&mut self, handles: u64, granules: u64) {
        self.handles_adopted += handles;
        self.handle_granules_adopted += granules;
        self.maps += handles;
        self.peak_granules_mapped = self.peak_granules_mapped.max(self.granules_mapped());
    }

    /// `handles` spare handles of `granules` granules in all were unmapped
    /// and handed over to another storage of the device (none released).
    pub(crate) fn handed_over(&mut self, handles: u64, granules: u64) {
        self.handles_handed_over += handles;
        self.handle_granules_handed_over += granules;
        self.unmaps += handles;
    }

    /// `handles` handles of `granules` granules in all, held unmapped,
    /// were released (`cuMemRelease` alone).
    pub(crate) fn released_unmapped(&mut self, handles: u64, granules: u64) {
        self.handles_released += handles;
        self.handle_granules_released += granules;
        self.handle_granules_released_unmapped += granules;
    }

    /// What `mapping` asked of the driver, in its order: spares and
    /// adopted handles released, spares moved, adopted handles mapped,
    /// handles created, mapped and granted access.
    pub(crate) fn mapping(&mut self, mapping: &super::granules::Mapping) {
        self.unmapped(mapping.released.len() as u64, mapping.released_granules());
        let (loose, loose_granules) = mapping.loose_released;
        self.released_unmapped(loose, loose_granules);
        self.moved(mapping.moved.len() as u64, mapping.moved_granules());
        self.adopted(mapping.adopted.len() as u64, mapping.adopted_granules());
        self.granted(mapping.adopted.len() as u64);
        self.mapped(mapping.created.len() as u64, mapping.created_granules());
    }

    /// Access was granted over `handles` handles.
    pub(crate) fn granted(&mut self, handles: u64) {
        self.access_grants += handles;
    }

    /// `handles` physical handles of `granules` granules in all were
    /// unmapped and released.
    pub(crate) fn unmapped(&mut self, handles: u64, granules: u64) {
        self.unmaps += handles;
        self.handles_released += handles;
        self.handle_granules_released += granules;
    }

    /// The physical handles starting the granule runs `runs` (as a granule
    /// map gave them up) were unmapped and released; their bytes, at
    /// `granule` bytes a granule.
    pub(crate) fn released_runs(&mut self, runs: &[std::ops::Range<u64>], granule: u64) -> u64 {
        let granules = super::granules_in(runs);
        self.unmapped(runs.len() as u64, granules);
        granules.saturating_mul(granule)
    }

    /// A range of address space was reserved.
    pub(crate) fn range_reserved(&mut self) {
        self.ranges_reserved += 1;
    }

    /// A range was freed, the physical handles mapped in it unmapped and
    /// kept whole, not released (`handles` of `granules` granules in all):
    /// for the storage's next maps, or another stream's.
    pub(crate) fn range_freed_keeping(&mut self, handles: u64, granules: u64) {
        self.handed_over(handles, granules);
        self.ranges_freed += 1;
    }

    /// A range was freed with `handles` physical handles of `granules`
    /// granules still mapped in it.
    pub(crate) fn range_freed(&mut self, handles: u64, granules: u64) {
        self.unmapped(handles, granules);
        self.ranges_freed += 1;
    }

    /// A page of `size` bytes was allocated.
    pub(crate) fn page_allocated(&mut self, size: u64) {
        self.pages_allocated += 1;
        self.page_granules_allocated += size.div_ceil(PAGE_GRANULE).max(1);
    }

    /// A page of `size` bytes was freed.
    pub(crate) fn page_freed(&mut self, size: u64) {
        self.pages_freed += 1;
        self.page_granules_freed += size.div_ceil(PAGE_GRANULE).max(1);
    }

    /// One copy of `bytes` bytes was queued.
    pub(crate) fn copied(&mut self, bytes: u64) {
        self.copies += 1;
        self.bytes_copied += bytes;
    }

    /// `from` slid down by `distance` bytes as a device does it: in copies
    /// no longer than the distance, so none overlaps its own source (what
    /// [`DeviceStorage::slide`](super::DeviceStorage::slide)'s default does).
    pub(crate) fn slid(&mut self, size: u64, distance: u64) {
        self.copies += size.div_ceil(distance.max(1));
        self.bytes_copied += size;
    }

    /// `size` bytes moved through a staging block of `piece` bytes as a
    /// device does it: two copies a piece (what
    /// [`DeviceStorage::stage`](super::DeviceStorage::stage)'s default does).
    pub(crate) fn staged(&mut self, size: u64, piece: u64) {
        self.copies += 2 * size.div_ceil(piece.max(1));
        self.bytes_copied += 2 * size;
    }

    /// The host waited for a stream.
    pub(crate) fn waited(&mut self) {
        self.stream_waits += 1;
    }

    /// An event was recorded on a stream.
    pub(crate) fn event_recorded(&mut self) {
        self.events_recorded += 1;
    }

    /// One stream was made to wait, on the device, for the work another
    /// queued so far: an event recorded on the other, waited on by the one.
    pub(crate) fn ordered_stream(&mut self) {
        self.events_recorded += 1;
        self.stream_orders += 1;
    }

    /// An event was asked whether it has passed (never waited for).
    pub(crate) fn event_queried(&mut self) {
        self.events_queried += 1;
    }

    /// An event was waited for.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn event_waited(&mut self) {
        self.events_queried += 1;
        self.stream_waits += 1;
    }
}

/// What each driver operation costs, in nanoseconds of host time: a value
/// a user can replace with another GPU's measurements (`--driver-costs`
/// reads one from JSON; fields left out keep the H200's).
///
/// The default is what `cuMem*` and friends cost on an NVIDIA H200
/// (driver 580, CUDA 13; `shared/torch-h200/README.md`, and
/// `scripts/driver_probe.py` for address space and copies). The cost of
/// virtual memory is per physical handle, not per call and barely per
/// byte: one granule's handle costs 11.8 us to create, 2.9 to map, 29.9 to
/// grant access, 17.4 to unmap and 11.1 to release, while a 128 MiB
/// handle's whole cycle costs 130 us, so each granule past the first of a
/// handle adds `handle_extra_granule_ns` to its cycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DriverCosts {
    /// Which device these are (shown in reports).
    pub name: Cow<'static, str>,
    /// `cuMemCreate` of a one-granule handle.
    pub handle_create_ns: u64,
    /// `cuMemRelease` of a one-granule handle.
    pub handle_release_ns: u64,
    /// Each granule past the first of a handle, over its whole cycle
    /// (charged half at its creation, half at its release).
    pub handle_extra_granule_ns: u64,
    /// `cuMemMap` of one handle.
    pub map_ns: u64,
    /// `cuMemSetAccess`, per handle covered.
    pub access_ns: u64,
    /// `cuMemUnmap`, per handle covered.
    pub unmap_ns: u64,
    /// `cuMemAddressReserve` of a 16 GiB range (`scripts/driver_probe.py`).
    pub address_reserve_ns: u64,
    /// `cuMemAddressFree` of a 16 GiB range (`scripts/driver_probe.py`).
    pub address_free_ns: u64,
    /// `cuMemAlloc` of one granule (half of a measured alloc and free).
    pub page_allocate_ns: u64,
    /// `cuMemFree` of one granule (the other half).
    pub page_free_ns: u64,
    /// Each granule past the first of a page, over its alloc and free
    /// (charged half at each).
    pub page_extra_granule_ns: u64,
    /// `cuEventRecord` (half of a measured record and query).
    pub event_record_ns: u64,
    /// `cuEventQuery` (the other half).
    pub event_query_ns: u64,
    /// `cuStreamSynchronize` of an idle stream (a busy one costs all the
    /// work queued on it too, which no table knows).
    pub stream_wait_ns: u64,
    /// `cuStreamWaitEvent`: queuing, on one stream, a wait for an event
    /// of another. Not measured on the H200 yet (`scripts/driver_probe.py`
    /// prints it as `stream_wait_event_ns`): taken as an event record's
    /// cost, the host queuing one command on a stream either way.
    pub stream_order_ns: u64,
    /// Queuing one device-to-device copy on a stream (`cuMemcpyDtoDAsync`,
    /// `scripts/driver_probe.py`).
    pub copy_ns: u64,
    /// Device copy bandwidth, bytes per microsecond (the H200's plain
    /// device-to-device copy: 2,030 GB/s).
    pub copy_bytes_per_us: u64,
}

impl Default for DriverCosts {
    fn default() -> Self {
        Self::H200
    }
}

impl DriverCosts {
    /// An NVIDIA H200, driver 580.159.04, CUDA 13 (measured 2026-12-04).
    pub const H200: Self = Self {
        name: Cow::Borrowed("NVIDIA H200"),
        handle_create_ns: 11_800,
        handle_release_ns: 11_100,
        handle_extra_granule_ns: 900,
        map_ns: 2_900,
        access_ns: 29_900,
        unmap_ns: 17_400,
        address_reserve_ns: 39_800,
        address_free_ns: 5_800,
        page_allocate_ns: 32_500,
        page_free_ns: 32_500,
        page_extra_granule_ns: 900,
        event_record_ns: 575,
        event_query_ns: 575,
        stream_wait_ns: 690,
        stream_order_ns: 575,
        copy_ns: 7_500,
        copy_bytes_per_us: 2_030_000,
    };

    /// A driver that costs nothing (what a replay charged before it priced
    /// the driver).
    pub const FREE: Self = Self {
        name: Cow::Borrowed("no driver cost"),
        handle_create_ns: 0,
        handle_release_ns: 0,
        handle_extra_granule_ns: 0,
        map_ns: 0,
        access_ns: 0,
        unmap_ns: 0,
        address_reserve_ns: 0,
        address_free_ns: 0,
        page_allocate_ns: 0,
        page_free_ns: 0,
        page_extra_granule_ns: 0,
        event_record_ns: 0,
        event_query_ns: 0,
        stream_wait_ns: 0,
        stream_order_ns: 0,
        copy_ns: 0,
        copy_bytes_per_us: 0,
    };

    /// The modeled driver time of `ops`, nanoseconds (saturating).
    pub fn price(&self, ops: &DriverOps) -> u64 {
        let each = |count: u64, ns: u64| u128::from(count) * u128::from(ns);
        let extra =
            |granules: u64, handles: u64, ns: u64| each(granules.saturating_sub(handles), ns / 2);
        let copy_time = match self.copy_bytes_per_us {
            0 => 0,
            rate => u128::from(ops.bytes_copied) * 1_000 / u128::from(rate),
        };
        let total = each(ops.handles_created, self.handle_create_ns)
            + each(ops.handles_released, self.handle_release_ns)
            + extra(
                ops.handle_granules_created,
                ops.handles_created,
                self.handle_extra_granule_ns,
            )
            + extra(
                ops.handle_granules_released,
                ops.handles_released,
                self.handle_extra_granule_ns,
            )
            + each(ops.maps, self.map_ns)
            + each(ops.access_grants, self.access_ns)
            + each(ops.unmaps, self.unmap_ns)
            + each(ops.ranges_reserved, self.address_reserve_ns)
            + each(ops.ranges_freed, self.address_free_ns)
            + each(ops.pages_allocated, self.page_allocate_ns)
            + each(ops.pages_freed, self.page_free_ns)
            + extra(
                ops.page_granules_allocated,
                ops.pages_allocated,
                self.page_extra_granule_ns,
            )
            + extra(
                ops.page_granules_freed,
                ops.pages_freed,
                self.page_extra_granule_ns,
            )
            + each(ops.events_recorded, self.event_record_ns)
            + each(ops.events_queried, self.event_query_ns)
            + each(ops.stream_waits, self.stream_wait_ns)
            + each(ops.stream_orders, self.stream_order_ns)
            + each(ops.copies, self.copy_ns)
            + copy_time;
        u64::try_from(total).unwrap_or(u64::MAX)
    }

    /// What mapping `granules` granules once costs (create, map, access):
    /// the least any allocator pays to hold that many.
    pub fn map_once(&self, granules: u64) -> u64 {
        let per = self.handle_create_ns + self.map_ns + self.access_ns;
        granules.saturating_mul(per)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_granule_mapped_and_unmapped_costs_what_the_h200_measured() {
        let mut ops = DriverOps::default();
        ops.mapped(1, 1);
        ops.unmapped(1, 1);
        // 11.8 + 2.9 + 29.9 + 17.4 + 11.1 us.
        assert_eq!(DriverCosts::H200.price(&ops), 73_100);
        assert_eq!(ops.granules_mapped(), 0);
        assert_eq!(ops.peak_granules_mapped, 1);
        assert_eq!(DriverCosts::FREE.price(&ops), 0);
    }

    #[test]
    fn a_large_handle_costs_per_handle_plus_a_little_per_granule() {
        // One 128 MiB handle's whole cycle: 130 us measured.
        let ops = DriverOps {
            handles_created: 1,
            handle_granules_created: 64,
            handles_released: 1,
            handle_granules_released: 64,
            maps: 1,
            access_grants: 1,
            unmaps: 1,
            ..DriverOps::default()
        };
        let us = DriverCosts::H200.price(&ops) as f64 / 1000.0;
        assert!((us - 130.0).abs() < 1.0, "{us} us");
        // Pages: 2 MiB and 64 MiB alloc + free, 65 and 93 us measured.
        let mut small = DriverOps::default();
        small.page_allocated(2 << 20);
        small.page_freed(2 << 20);
        assert_eq!(DriverCosts::H200.price(&small), 65_000);
        let mut large = DriverOps::default();
        large.page_allocated(64 << 20);
        large.page_freed(64 << 20);
        let us = DriverCosts::H200.price(&large) as f64 / 1000.0;
        assert!((us - 93.0).abs() < 1.0, "{us} us");
    }

    #[test]
    fn a_slide_is_priced_as_the_copies_a_device_makes() {
        let mut ops = DriverOps::default();
        ops.slid(10, 3);
        assert_eq!((ops.copies, ops.bytes_copied), (4, 10));
        let mut big = DriverOps::default();
        big.copied(2_030_000_000);
        // 7.5 us to queue, 1 ms at 2,030 GB/s.
        assert_eq!(DriverCosts::H200.price(&big), 7_500 + 1_000_000);
    }

    #[test]
    fn a_table_read_from_json_keeps_the_fields_it_leaves_out() {
        let costs: DriverCosts = serde_json::from_str(r#"{"map_ns": 1000}"#).unwrap();
        assert_eq!(costs.map_ns, 1000);
        assert_eq!(costs.access_ns, DriverCosts::H200.access_ns);
        assert!(serde_json::from_str::<DriverCosts>(r#"{"mapns": 1}"#).is_err());
    }
}
