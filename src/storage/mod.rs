//! Where pages come from: the `DeviceStorage` trait and its implementations.
//!
//! A storage hands out *pages* (one device allocation each) and knows nothing
//! about slices, pools or handles; the `memory` layer carves pages into
//! allocations. Deallocation is deferred and stream-ordered: `deallocate` and
//! `unmap` only queue, and `flush` lets what was queued go behind a fence on
//! the stream, giving it to the driver once the work queued before it is
//! done (asked, never waited for: `give_back.rs`). `drain` waits.

// Sizes and offsets come from callers: every sum is checked (a panic in a
// debug build would take a stream down for one caller's bad numbers).
#![warn(clippy::arithmetic_side_effects, clippy::disallowed_methods)]

#[macro_use]
mod macros;
mod budget;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod cuda_fence;
#[cfg(feature = "cuda")]
mod cuda_vmm;
mod driver;
mod driver_paths;
mod driver_report;
mod give_back;
mod granules;
mod host;
mod id_map;
mod limited;
mod loose;
mod stage;
mod uses;
mod virtual_storage;

pub use budget::{BudgetedStorage, DeviceBudget};

/// The most granules a storage's physical handle covers by default: a map
/// of a run of fresh granules creates, maps and grants one handle per this
/// many (each a driver call whatever its size), and memory goes back to
/// the driver a whole handle at a time. `docs/memory.md`, "Physical
/// handles", says what each size costs.
pub const DEFAULT_HANDLE_GRANULES: u64 = 16;
#[cfg(feature = "cuda")]
pub use cuda::{CudaStorage, cuda_available};
pub use driver::{DriverCosts, DriverOps};
pub(crate) use driver_paths::PathLedger;
pub use driver_paths::{DriverPath, DriverPaths, PathCost};
pub use driver_report::DriverReport;
pub use granules::HandleCut;
pub(crate) use granules::{GranuleMap, HANDLE_SHARE_ONE_IN, HandleSize, Mapping, granules_in};
#[cfg(unix)]
pub use host::HOST_GRANULE;
pub use host::HostStorage;
pub use limited::{FaultPlan, LimitedStorage};
pub use loose::LooseHandle;
pub use stage::StagedMove;
pub use uses::{UseFence, UserStream};
pub use virtual_storage::{DEFAULT_GRANULE, MapChurn, VirtualStorage};

use std::fmt;

/// Names one page a storage allocated. Ids are never reused by a storage, so
/// a stale id is reported as unknown rather than naming another page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageId(pub u64);

impl fmt::Display for StorageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "page#{}", self.0)
    }
}

/// A byte range of one page: what an allocation occupies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StorageHandle {
    /// The page.
    pub id: StorageId,
    /// First byte of the range, from the start of the page.
    pub offset: u64,
    /// Length of the range in bytes.
    pub size: u64,
}

impl StorageHandle {
    /// The whole of a page of `size` bytes.
    pub fn whole(id: StorageId, size: u64) -> Self {
        Self {
            id,
            offset: 0,
            size,
        }
    }

    /// The sub-range `start..end` of this range (offsets relative to it),
    /// or `None` when it does not lie inside (or past `u64::MAX`).
    pub fn sub_range(&self, start: u64, end: u64) -> Option<Self> {
        if start > end || end > self.size {
            return None;
        }
        Some(Self {
            id: self.id,
            offset: self.offset.checked_add(start)?,
            size: end.checked_sub(start)?,
        })
    }

    /// One past the last byte, from the start of the page (saturating: a
    /// range past `u64::MAX` lies outside every page anyway).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.size)
    }
}

/// The address of a range as the device sees it: a host pointer for
/// [`HostStorage`], a `CUdeviceptr` for CUDA, a synthetic address for
/// [`VirtualStorage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Resource {
    /// Address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// What a storage can refuse. Every variant is something a caller can cause
/// or an environment can impose; none is a bug.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// The device (or the cap a [`LimitedStorage`] sets) has no room.
    #[error("device out of memory: requested {requested} bytes, {held} held of {capacity}")]
    OutOfMemory {
        /// Bytes the failed allocation asked for.
        requested: u64,
        /// Bytes the storage held when it refused.
        held: u64,
        /// The most it may hold.
        capacity: u64,
    },
    /// A fault a [`LimitedStorage`] was told to inject.
    #[error("injected fault: {0}")]
    InjectedFault(String),
    /// The page was never allocated here or was already deallocated.
    #[error("unknown {0}")]
    UnknownPage(StorageId),
    /// The range does not lie inside its page.
    #[error("{len} bytes at offset {offset} lie outside {id} of {page_size} bytes")]
    OutOfRange {
        /// The page.
        id: StorageId,
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// Size of the page.
        page_size: u64,
    },
    /// A slide that does not move bytes down within one allocation.
    #[error("a slide moves bytes down within one allocation, not {from:?} to {to:?}")]
    NotASlide {
        /// Source.
        from: StorageHandle,
        /// Destination.
        to: StorageHandle,
    },
    /// A copy between ranges of different lengths.
    #[error("copy between ranges of {from} and {to} bytes")]
    LengthMismatch {
        /// Source length.
        from: u64,
        /// Destination length.
        to: u64,
    },
    /// The storage holds no bytes (a [`VirtualStorage`]): it can count pages
    /// but not read or write them.
    #[error("this storage holds no bytes to read or write")]
    NoBacking,
    /// A size the storage cannot allocate (0, or beyond the address space).
    #[error("invalid page size {0}")]
    InvalidSize(u64),
    /// The driver refused, with its message (CUDA).
    #[error("driver error: {0}")]
    Driver(String),
    /// The storage cannot reserve address space and back it piecewise
    /// ([`DeviceStorage::granule`] is `None`).
    #[error("this storage has no virtual memory (no expandable ranges)")]
    NoVirtualMemory,
    /// A range to map or unmap that does not start and end on granules of
    /// a reserved range, or an access to bytes with no memory behind them.
    #[error("{len} bytes at offset {offset} of {id} are not {expected}")]
    Unmapped {
        /// The range.
        id: StorageId,
        /// Start of the bytes.
        offset: u64,
        /// Their length.
        len: u64,
        /// What they should have been ("mapped", "whole unmapped granules", ...).
        expected: &'static str,
    },
}

/// A source of device pages.
///
/// Implementations are single-threaded (`&mut self`); the service gives each
/// stream actor its own storage value.
pub trait DeviceStorage: Send {
    /// The alignment every page start is guaranteed to have.
    fn alignment(&self) -> u64;

    /// Allocate a page of `size` bytes.
    fn allocate(&mut self, size: u64) -> Result<StorageHandle, StorageError>;

    /// Queue the page for deallocation at the next [`flush`](Self::flush).
    /// Its bytes still count in [`bytes_allocated`](Self::bytes_allocated)
    /// until the driver has it back.
    fn deallocate(&mut self, id: StorageId);

    /// Let what was queued go in stream order, with no wait: behind a
    /// fence on the stream, given to the driver at this or a later flush
    /// once the stream's work before the fence is done. Also gives back
    /// what earlier flushes left behind fences that have passed since.
    fn flush(&mut self);

    /// Wait for the stream, and give back everything queued or waiting
    /// behind a fence: what explicit cleanup, shutdown and the last try
    /// before running out of memory do. The default flushes (a storage
    /// that frees at once).
    fn drain(&mut self) {
        self.flush();
    }

    /// Bytes given back but still held, waiting behind a fence for the
    /// stream's work before it (in [`bytes_allocated`](Self::bytes_allocated)
    /// until they go).
    fn bytes_in_reclaim(&self) -> u64 {
        0
    }

    /// Bytes given back whose fence passed but which the driver still
    /// holds, because the rest of their physical handle is in use (in
    /// [`bytes_allocated`](Self::bytes_allocated); they go with the last
    /// of their handle, or serve a map of the same granules again with no
    /// driver call). No wait frees them: only giving back the rest of the
    /// handle does.
    fn bytes_stranded(&self) -> u64 {
        0
    }

    /// Keep, from now until told otherwise, the physical handles whose
    /// every granule was given back and past its fence as *spares*, still
    /// mapped where they were, for the next [`map`](Self::map)s to move
    /// to their fresh granules (an unmap and a map, where a new handle
    /// would cost a create and a release more). What the owner does
    /// between holding and [`release_spares`](Self::release_spares):
    /// unmap to grow, then map. A map that must still create handles
    /// releases the spares it does not move first, so the storage never
    /// holds both. By default nothing (no physical handles).
    /// `docs/memory.md`, "Spare handles".
    fn hold_spares(&mut self, _hold: bool) {}

    /// Bytes of the spare handles kept now (in
    /// [`bytes_stranded`](Self::bytes_stranded) and
    /// [`bytes_allocated`](Self::bytes_allocated)): memory a map moves
    /// rather than adds to, so a decision about growing leaves it out.
    fn bytes_spare(&self) -> u64 {
        0
    }

    /// Unmap and release every spare handle (what
    /// [`hold_spares`](Self::hold_spares) kept; those it keeps later stay
    /// until the next release, or a [`drain`](Self::drain)), and release
    /// every handle it adopted and has not mapped.
    fn release_spares(&mut self) {}

    /// Unmap every spare handle kept and hand it over, not released, for
    /// another storage of the same device to
    /// [`adopt`](Self::adopt_handles), with the handles of the ranges it
    /// freed while [holding spares](Self::hold_spares) (unmapped whole
    /// then, the address space freed): their bytes leave this storage.
    /// By default none (no physical handles).
    fn hand_over_spares(&mut self) -> Vec<LooseHandle> {
        Vec::new()
    }

    /// Hold `handles`, which another storage of the same device handed
    /// over, unmapped: the next [`map`](Self::map)s of fresh granules map
    /// them before they create any handle (no create, and no release where
    /// they came from), and [`release_spares`](Self::release_spares) lets
    /// go of those left. Counted in [`bytes_allocated`](Self::bytes_allocated)
    /// and [`bytes_spare`](Self::bytes_spare). Those it cannot hold
    /// (another granule, no virtual memory) are returned.
    fn adopt_handles(&mut self, handles: Vec<LooseHandle>) -> Vec<LooseHandle> {
        handles
    }

    /// Pass the spare handles kept on to the device's other streams: where
    /// the storage draws on a device budget, into its exchange, for the
    /// stream whose growth the give-back was for to
    /// [`take`](Self::take_passed_on); elsewhere (nobody to pass them to)
    /// they are released.
    fn pass_spares_on(&mut self) {
        self.release_spares();
    }

    /// Adopt every handle the device's other streams passed on
    /// ([`pass_spares_on`](Self::pass_spares_on)). Nothing where the
    /// storage shares no budget.
    fn take_passed_on(&mut self) {}

    /// The largest part of `range` (whole mapped granules of a range, as
    /// [`unmap`](Self::unmap) takes) that can be unmapped without leaving
    /// a physical handle partly held: the driver frees only whole handles,
    /// so a give-back of part of one would free nothing. One run, of size
    /// 0 where there is none. By default all of `range` (a handle per
    /// granule).
    fn whole_handles(&self, range: &StorageHandle) -> StorageHandle {
        *range
    }

    /// Cut the physical handles of later maps as `cut` says: at up to one
    /// `cut.share_one_in`th of the granules their range holds (64 by
    /// default; 1 where 0 is asked), or of the most it ever held, and at
    /// most the storage's handle size. A larger share maps and gives back
    /// the same memory in fewer driver calls, and a handle partly in use
    /// keeps more of its range from going back. The handles mapped already
    /// stay as they are. By default nothing (no physical handles).
    /// `docs/memory.md`, "Physical handles".
    fn set_handle_cut(&mut self, _cut: HandleCut) {}

    /// Where the physical handle holding the first granule of `range`
    /// (whole mapped granules of a range, such as
    /// [`whole_handles`](Self::whole_handles) returns) ends, as a byte
    /// offset of the range, and `range`'s end where the handle reaches
    /// past it: a give-back that walks a run of free granules a handle at
    /// a time picks whole handles, so each one it picks frees memory. By
    /// default the first granule's end (a handle per granule).
    fn first_handle_end(&self, range: &StorageHandle) -> u64 {
        let end = range.offset.saturating_add(range.size);
        let granule = self.granule().unwrap_or(range.size).max(1);
        range.offset.saturating_add(granule).min(end)
    }

    /// The address of `handle`'s bytes.
    fn resource(&mut self, handle: &StorageHandle) -> Result<Resource, StorageError>;

    /// Copy `data` into the range `handle` names (`data.len()` bytes at its start).
    fn write(&mut self, handle: &StorageHandle, data: &[u8]) -> Result<(), StorageError>;

    /// Copy the range `handle` names into `out` (`out.len()` bytes from its start).
    fn read(&mut self, handle: &StorageHandle, out: &mut [u8]) -> Result<(), StorageError>;

    /// Copy the bytes of `from` into `to` (same lengths), as a relocation does.
    fn copy(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError>;

    /// Move the bytes of `from` down to `to`: the same allocation (`id`),
    /// the same length, `to` starting below `from` and possibly overlapping
    /// it (a sliding compaction closing the hole below an allocation).
    ///
    /// The default copies forward in chunks no longer than the distance,
    /// so no chunk overlaps its own source (a device copy of overlapping
    /// ranges is undefined); if a chunk fails, the chunks already copied
    /// are copied back, last first, and the bytes are where they were. A
    /// storage whose `copy` handles overlap (`memmove`) does it in one.
    fn slide(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        let distance = check_slide(from, to)?;
        let chunk = |at: u64, offset: u64| StorageHandle {
            id: from.id,
            offset: offset.saturating_add(at),
            size: distance.min(from.size.saturating_sub(at)),
        };
        let mut at = 0;
        while at < from.size {
            if let Err(error) = self.copy(&chunk(at, from.offset), &chunk(at, to.offset)) {
                // Undo, last chunk first: restoring chunk k overwrites only
                // the copy of chunk k + 1, already restored.
                while at > 0 {
                    at = at.saturating_sub(distance);
                    self.copy(&chunk(at, to.offset), &chunk(at, from.offset))?;
                }
                return Err(error);
            }
            at = at.saturating_add(distance);
        }
        Ok(())
    }

    /// Move the bytes of `moving.source` down to `moving.target` (a
    /// slide's: the same length, overlapping) through `moving.staging`, a
    /// free block of the same storage apart from both, no longer than
    /// them: when the distance is short, fewer copies than
    /// [`slide`](Self::slide) would take.
    ///
    /// The default copies a piece of the staging block's size at a time,
    /// lowest first, there and on to the target: two copies a piece. If a
    /// copy fails, the pieces moved go back, last first, and the bytes are
    /// where they were. A storage whose `copy` handles overlap does it in
    /// one, counting what a device would queue.
    fn stage(&mut self, moving: &StagedMove) -> Result<(), StorageError> {
        stage::through(self, moving)
    }

    /// Bytes the storage holds from the driver now, queued deallocations
    /// (and unmappings) included; a reserved range counts its mapped bytes.
    fn bytes_allocated(&self) -> u64;

    /// The granule of this storage's virtual memory, when it can reserve
    /// address space and back it piecewise (what an expandable arena needs):
    /// `None` when it cannot.
    fn granule(&self) -> Option<u64> {
        None
    }

    /// Reserve `size` bytes of address space (a multiple of the granule)
    /// with no memory behind them. The range is given back with
    /// [`deallocate`](Self::deallocate) like a page, whatever is still
    /// mapped in it going with it.
    fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        let _ = size;
        Err(StorageError::NoVirtualMemory)
    }

    /// Put memory behind `range`: whole granules of a reserved range that
    /// are unmapped, or given back and not yet gone (those are taken back
    /// with no driver call). Its bytes are unspecified until written.
    fn map(&mut self, range: &StorageHandle) -> Result<(), StorageError> {
        let _ = range;
        Err(StorageError::NoVirtualMemory)
    }

    /// Bytes a [`map`](Self::map) of `range` would add to what the storage
    /// holds: its granules less those given back and not yet gone (what a
    /// budget grants before the map).
    fn bytes_a_map_adds(&self, range: &StorageHandle) -> u64 {
        range.size
    }

    /// Queue `range` (whole, mapped granules of a reserved range) to lose
    /// its memory, in stream order from the next [`flush`](Self::flush);
    /// its bytes count in [`bytes_allocated`](Self::bytes_allocated) until
    /// they go, and mapping it again before takes it back.
    fn unmap(&mut self, range: &StorageHandle) {
        let _ = range;
    }

    /// Whether a [`map`](Self::map) may be refused because of what other
    /// streams hold at that moment (a budget the device's streams share):
    /// then whether a mapping made off a request's path succeeds depends on
    /// thread timing, and such mappings are not made (a relocation's slide
    /// crosses no void), so that replays stay the same on every run.
    fn shares_a_budget(&self) -> bool {
        false
    }

    /// The driver operations this storage performed so far, by kind, as
    /// a CUDA device performs them for the same calls (see
    /// [`DriverOps`]). A storage that counts nothing answers zeros.
    fn driver_ops(&self) -> DriverOps {
        DriverOps::default()
    }

    /// Count the operations from now on for `path` (see [`DriverPaths`]),
    /// and return the path that was on, for the caller to switch back to.
    /// A storage that counts nothing keeps no paths.
    fn set_driver_path(&mut self, path: DriverPath) -> DriverPath {
        let _ = path;
        DriverPath::Serve
    }

    /// [`driver_ops`](Self::driver_ops), by the path that asked for each
    /// operation. By default all on [`DriverPath::Serve`].
    fn driver_paths(&self) -> DriverPaths {
        DriverPaths::all_on(DriverPath::Serve, self.driver_ops())
    }

    /// The stream this storage orders its work on, as other storages of
    /// the device name it when its work uses their memory
    /// ([`fence_uses`](Self::fence_uses)); `None` where it has none of its
    /// own (a storage that models its device takes any [`UserStream`]).
    fn stream_name(&self) -> Option<UserStream> {
        None
    }

    /// Record a fence on the work each of `users` (streams other than
    /// this storage's own, which used memory of it) has queued so far: an
    /// event on each, never a wait. Memory released under it must not be
    /// reused or given back before it passed (`uses.rs`). The default: a
    /// fence passed at once (a storage whose work is done as it is asked).
    ///
    /// # Errors
    /// The driver could not record an event; nothing was recorded.
    fn fence_uses(&mut self, users: &[UserStream]) -> Result<UseFence, StorageError> {
        let _ = users;
        Ok(UseFence::PASSED)
    }

    /// Whether the work `fence` stands for is done: asked, never waited
    /// for. Once it answers `true` the storage forgets the fence (and
    /// answers `true` for it again).
    fn uses_done(&mut self, fence: UseFence) -> bool {
        let _ = fence;
        true
    }

    /// Wait until the work `fence` stands for is done, and forget it:
    /// only for the last try before running out of memory, an explicit
    /// cleanup and the end of a stream.
    fn wait_uses(&mut self, fence: UseFence) {
        let _ = fence;
    }

    /// Make the work `user` queues from now on wait, on the device, for
    /// the work this storage's stream queued so far: an event recorded
    /// here and waited on there (`cuStreamWaitEvent`), never a host wait.
    /// Asked before memory this storage's stream last touched is handed to
    /// another stream's work (a stream serving another from its room:
    /// `docs/service.md`, "Serving another stream"). The default: nothing
    /// to order (a storage whose work is done as it is asked).
    ///
    /// # Errors
    /// The driver could not record the event or queue the wait; nothing
    /// was queued.
    fn order_for(&mut self, user: UserStream) -> Result<(), StorageError> {
        let _ = user;
        Ok(())
    }

    /// Make the work this storage's stream queues from now on wait, on
    /// the device, for the work each of `users` queued so far: an event
    /// recorded on each, waited on here (`cuStreamWaitEvent`), never a host
    /// wait. Asked before memory another stream's work uses is moved (a
    /// lent allocation a compaction or settle moves), with
    /// [`order_for`](Self::order_for) each user after the move. The
    /// default: nothing to order.
    ///
    /// # Errors
    /// The driver could not record an event or queue a wait; what was
    /// queued before the failure stays queued (a wait more is harmless).
    fn order_after(&mut self, users: &[UserStream]) -> Result<(), StorageError> {
        let _ = users;
        Ok(())
    }
}

impl<S: DeviceStorage + ?Sized> DeviceStorage for Box<S> {
    fn alignment(&self) -> u64 {
        (**self).alignment()
    }
    fn allocate(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        (**self).allocate(size)
    }
    fn deallocate(&mut self, id: StorageId) {
        (**self).deallocate(id)
    }
    fn flush(&mut self) {
        (**self).flush()
    }
    fn drain(&mut self) {
        (**self).drain()
    }
    fn bytes_in_reclaim(&self) -> u64 {
        (**self).bytes_in_reclaim()
    }
    fn bytes_stranded(&self) -> u64 {
        (**self).bytes_stranded()
    }
    fn hold_spares(&mut self, hold: bool) {
        (**self).hold_spares(hold)
    }
    fn release_spares(&mut self) {
        (**self).release_spares()
    }
    fn hand_over_spares(&mut self) -> Vec<LooseHandle> {
        (**self).hand_over_spares()
    }
    fn adopt_handles(&mut self, handles: Vec<LooseHandle>) -> Vec<LooseHandle> {
        (**self).adopt_handles(handles)
    }
    fn pass_spares_on(&mut self) {
        (**self).pass_spares_on()
    }
    fn take_passed_on(&mut self) {
        (**self).take_passed_on()
    }
    fn bytes_spare(&self) -> u64 {
        (**self).bytes_spare()
    }
    fn whole_handles(&self, range: &StorageHandle) -> StorageHandle {
        (**self).whole_handles(range)
    }
    fn first_handle_end(&self, range: &StorageHandle) -> u64 {
        (**self).first_handle_end(range)
    }
    fn set_handle_cut(&mut self, cut: HandleCut) {
        (**self).set_handle_cut(cut)
    }
    fn resource(&mut self, handle: &StorageHandle) -> Result<Resource, StorageError> {
        (**self).resource(handle)
    }
    fn write(&mut self, handle: &StorageHandle, data: &[u8]) -> Result<(), StorageError> {
        (**self).write(handle, data)
    }
    fn read(&mut self, handle: &StorageHandle, out: &mut [u8]) -> Result<(), StorageError> {
        (**self).read(handle, out)
    }
    fn copy(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        (**self).copy(from, to)
    }
    fn slide(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        (**self).slide(from, to)
    }
    fn stage(&mut self, moving: &StagedMove) -> Result<(), StorageError> {
        (**self).stage(moving)
    }
    fn bytes_allocated(&self) -> u64 {
        (**self).bytes_allocated()
    }
    fn granule(&self) -> Option<u64> {
        (**self).granule()
    }
    fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        (**self).reserve_range(size)
    }
    fn map(&mut self, range: &StorageHandle) -> Result<(), StorageError> {
        (**self).map(range)
    }
    fn unmap(&mut self, range: &StorageHandle) {
        (**self).unmap(range)
    }
    fn bytes_a_map_adds(&self, range: &StorageHandle) -> u64 {
        (**self).bytes_a_map_adds(range)
    }
    fn shares_a_budget(&self) -> bool {
        (**self).shares_a_budget()
    }
    fn driver_ops(&self) -> DriverOps {
        (**self).driver_ops()
    }
    fn set_driver_path(&mut self, path: DriverPath) -> DriverPath {
        (**self).set_driver_path(path)
    }
    fn driver_paths(&self) -> DriverPaths {
        (**self).driver_paths()
    }
    fn stream_name(&self) -> Option<UserStream> {
        (**self).stream_name()
    }
    fn fence_uses(&mut self, users: &[UserStream]) -> Result<UseFence, StorageError> {
        (**self).fence_uses(users)
    }
    fn uses_done(&mut self, fence: UseFence) -> bool {
        (**self).uses_done(fence)
    }
    fn wait_uses(&mut self, fence: UseFence) {
        (**self).wait_uses(fence)
    }
    fn order_for(&mut self, user: UserStream) -> Result<(), StorageError> {
        (**self).order_for(user)
    }
    fn order_after(&mut self, users: &[UserStream]) -> Result<(), StorageError> {
        (**self).order_after(users)
    }
}

/// Check that `from` to `to` is a slide (the same allocation and length,
/// `to` below `from`): the distance it moves.
pub(crate) fn check_slide(from: &StorageHandle, to: &StorageHandle) -> Result<u64, StorageError> {
    let distance = from.offset.checked_sub(to.offset).filter(|&d| d > 0);
    match distance {
        Some(distance) if from.id == to.id && from.size == to.size => Ok(distance),
        _ => Err(StorageError::NotASlide {
            from: *from,
            to: *to,
        }),
    }
}

/// Check that `handle` lies inside a page of `page_size` bytes and that an
/// access of `len` bytes from its start stays inside `handle`.
pub(crate) fn check_range(
    handle: &StorageHandle,
    page_size: u64,
    len: u64,
) -> Result<(), StorageError> {
    let out_of_range = || StorageError::OutOfRange {
        id: handle.id,
        offset: handle.offset,
        len: handle.size.max(len),
        page_size,
    };
    let end = handle
        .offset
        .checked_add(handle.size)
        .ok_or_else(out_of_range)?;
    if end > page_size || len > handle.size {
        return Err(out_of_range());
    }
    Ok(())
}
