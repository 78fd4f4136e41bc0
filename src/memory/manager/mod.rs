//! `MemoryManager`: one stream's pools behind one single-threaded,
//! deterministic interface. Routing, modes, cleanup and handles live here;
//! the slot table in `slots.rs`; byte access, relocation, guards and taint
//! in their own files (`impl` blocks of the
//! same type).

use super::config::{AllocationMode, MemoryConfig, MemoryLogLevel, PersistentMemory, PoolKind};
use super::error::MemoryError;
use super::handle::{Allocation, AllocationCell, AllocationId, OwnerId, StreamId};
use super::live::LiveMeter;
use super::observer::MemoryObserver;
use super::policy::{Cleanup, PageUpdate};
use super::pool::mover::Mover;
use super::pool::{FreeRoom, Growth, Placement, Pool, Sweep, Wanted, WholePagePool, align_up};
use super::release::{Release, ReleaseInbox};
use super::report::MemoryReport;
use super::slot::{Live, PinWord, SlotKey, SlotTable};
use super::taint::{ErrorGraph, TaintRanges};
use crate::storage::{DeviceStorage, DriverPath};
use crate::sync::Arc;
use crate::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::fmt;

pub(crate) mod access;
mod bind;
pub(crate) mod guard;
mod relocate;
mod reserve;
pub(crate) mod retire;
mod spares;
mod taint;
mod uses;

pub use uses::MAX_USER_STREAMS;

/// Index of the persistent pool in `pools`.
pub(crate) const PERSISTENT: usize = 0;
/// Index of the dedicated pool in `pools`.
pub(crate) const DEDICATED: usize = 1;
/// Index of the first dynamic pool.
pub(crate) const FIRST_DYNAMIC: usize = 2;

/// Reserves pages from a [`DeviceStorage`] and carves them into allocations.
///
/// Single-threaded and deterministic: every method takes `&mut self` or
/// `&self`, and the same calls give the same placements. Handles it gives
/// out are `Send`; dropping one from any thread queues a release that the
/// next call processes.
pub struct MemoryManager<S> {
    /// Name for logs.
    name: String,
    /// This manager's identity (foreign-handle check).
    owner: OwnerId,
    /// The stream its ids carry.
    stream: StreamId,
    /// Where pages come from.
    storage: S,
    /// The device's limits.
    max_page_size: u64,
    /// Slice alignment.
    alignment: u64,
    /// Persistent, dedicated, then the dynamic pools in routing order.
    pools: Vec<Pool>,
    /// The slot table.
    slots: SlotTable,
    /// Where handles' drops land.
    releases: ReleaseInbox,
    /// Reused buffer for draining `releases`.
    release_buf: Vec<Release>,
    /// Reservations so far: the clock of deallocation periods (the
    /// service's clock is time; this one counts reservations).
    serial: u64,
    /// The persistent-memory policy.
    persistent: PersistentMemory,
    /// The mode no window overrides.
    base_mode: AllocationMode,
    /// Open windows, innermost last.
    windows: Vec<AllocationMode>,
    /// Log level.
    log: MemoryLogLevel,
    /// Carve new pages without backing until first dereference.
    dry_run: bool,
    /// Reserving for a client's hot cache: not handed out yet, so not on
    /// the live meter (the hit that hands it out meters it).
    unmetered: bool,
    /// Bytes in use, all pools.
    in_use: u64,
    /// Most bytes in use at once.
    peak_in_use: u64,
    /// Most bytes reserved at once.
    peak_reserved: u64,
    /// Most bytes reserved at once less what clients' caches held then
    /// (what the stream needed; `cache_ceiling`).
    peak_need: u64,
    /// Clients' caches may hold one byte in this many of `peak_need` past
    /// it (0: none past the peak; `set_cache_share`).
    cache_share: u64,
    /// The failures taint ranges point at.
    failures: ErrorGraph,
    /// Reserved / carved ratio past which a sliced pool wants compaction.
    compaction_threshold: Option<f64>,
    /// The serial of the last relocation that could do nothing.
    futile_at: Option<u64>,
    /// Told of every reservation, free, rebind and failure.
    observer: Option<Box<dyn MemoryObserver>>,
    /// Allocations whose free waits on pins through retired cells (see
    /// [`Live::retired`]), tried again as releases are processed.
    deferred_frees: Vec<SlotKey>,
    /// Cells of freed allocations that nothing else references, reused by
    /// the next reservations (saves an allocation and a free per reserve):
    /// the slot table's reference, and the last handle's when its release
    /// brought it back (then the next handle and slot take the two as they
    /// are, with no reference count to move).
    spare_cells: Vec<(Arc<AllocationCell>, Option<Arc<AllocationCell>>)>,
    /// Whether the owner holds spare handles (`spares.rs`).
    holding_spares: bool,
    /// Allocations released while other streams used them, waiting for
    /// those streams' work (`uses.rs`).
    awaiting_users: Vec<SlotKey>,
    /// Bytes of the live allocations other streams use, released or not
    /// (`uses.rs`).
    bytes_used_by_others: u64,
}

/// At most this many spare cells are kept.
const SPARE_CELLS: usize = 1024;

impl<S: DeviceStorage> MemoryManager<S> {
    /// A manager over `storage`.
    pub fn new(storage: S, config: MemoryConfig) -> Self {
        Self::for_stream(storage, config, StreamId(0))
    }

    /// A manager whose allocation ids name `stream`.
    pub(crate) fn for_stream(storage: S, config: MemoryConfig, stream: StreamId) -> Self {
        Self::metered(storage, config, stream, None)
    }

    /// [`for_stream`](Self::for_stream), its live bytes also counted on
    /// `meter` for other threads to read (`live.rs`).
    pub(crate) fn metered(
        storage: S,
        config: MemoryConfig,
        stream: StreamId,
        meter: Option<Arc<LiveMeter>>,
    ) -> Self {
        let device = config.device;
        let alignment = device.alignment.max(1);
        let mut pools = vec![
            Pool::Whole(WholePagePool::new(
                PoolKind::Persistent,
                device.max_page_size,
                config.persistent_dealloc_period,
            )),
            Pool::Whole(WholePagePool::new(
                PoolKind::Dedicated,
                device.max_page_size,
                Some(0),
            )),
        ];
        let granule = storage.granule();
        for pool in config.pools.pools(&device) {
            pools.push(Pool::dynamic(
                &pool,
                alignment,
                device.max_page_size,
                granule,
                FreeRoom {
                    slack_one_in: config.free_slack_one_in,
                    keep_peak: config.keep_peak_mapped,
                },
            ));
        }
        let base_mode = config.mode.unwrap_or(match config.persistent {
            PersistentMemory::Enforced => AllocationMode::Persistent,
            _ => AllocationMode::Auto,
        });
        let owner = crate::sync::unique_id();
        Self {
            name: config.name,
            owner,
            stream,
            storage,
            max_page_size: device.max_page_size,
            alignment,
            pools,
            slots: SlotTable::default(),
            releases: ReleaseInbox::new(meter),
            release_buf: Vec::new(),
            serial: 0,
            persistent: config.persistent,
            base_mode,
            windows: Vec::new(),
            log: config.log,
            dry_run: false,
            unmetered: false,
            in_use: 0,
            peak_in_use: 0,
            peak_reserved: 0,
            peak_need: 0,
            cache_share: 0,
            // Scoped by the owner's identity (one in 2^32 managers could
            // share a scope: the counter wraps only after that many).
            failures: ErrorGraph::scoped(owner as u32),
            compaction_threshold: config.compaction_threshold,
            futile_at: None,
            observer: None,
            deferred_frees: Vec::new(),
            spare_cells: Vec::new(),
            holding_spares: false,
            awaiting_users: Vec::new(),
            bytes_used_by_others: 0,
        }
    }

    /// This manager's identity, which its handles carry.
    pub(crate) fn owner_id(&self) -> OwnerId {
        self.owner
    }

    /// Let clients' caches hold one byte in `share` of what the stream
    /// needed past it (the cache ceiling). A reservation that would grow
    /// the pools past the ceiling while caches hold room answers so
    /// ([`reserve_within_caches`](Self::reserve_within_caches)), for its
    /// caller to take them back first; spares for the caches
    /// ([`reserve_for_cache`](Self::reserve_for_cache)) never grow the
    /// pools past it.
    pub(crate) fn set_cache_share(&mut self, share: u64) {
        self.cache_share = share;
    }

    /// The pools, and what moving needs lent to them as one value.
    fn lend(&mut self) -> (&mut [Pool], Mover<'_>) {
        let mover = Mover {
            slots: &mut self.slots,
            storage: &mut self.storage,
            serial: self.serial,
            rehome: false,
        };
        (&mut self.pools, mover)
    }

    /// Bytes held by clients' caches: reserved here, not handed out (in
    /// use, off the live meter).
    fn cached_bytes(&self) -> u64 {
        self.meter()
            .map_or(0, |meter| self.in_use.saturating_sub(meter.live()))
    }

    /// How far the pools may grow for, or with, clients' caches: the most
    /// the stream ever needed (reserved less cached, at each growth), plus
    /// one byte in `cache_share` of it. Measured without the caches'
    /// bytes, so spares do not ratchet it up.
    fn cache_ceiling(&self) -> u64 {
        let allowance = self.peak_need.checked_div(self.cache_share).unwrap_or(0);
        self.peak_need.saturating_add(allowance)
    }

    /// Tell `observer` of every event from now on (replacing any other).
    pub(crate) fn set_observer(&mut self, observer: Box<dyn MemoryObserver>) {
        self.observer = Some(observer);
    }

    fn id_of(&self, key: SlotKey) -> AllocationId {
        AllocationId {
            stream: self.stream,
            slot: key.slot(),
            generation: key.generation(),
        }
    }

    /// The stream this manager's ids name.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Open or close an allocation window, as the seed's `mode` does.
    ///
    /// Windows **nest**: `Persistent` or `Dedicated` opens one, `Auto` closes
    /// the innermost, and the innermost open window decides the mode. A model
    /// load opens a persistent window around the whole load while each
    /// parameter opens its own inside it; without the stack the first inner
    /// close would send the rest of the weights to the dynamic pools.
    ///
    /// Under `PersistentMemory::Disabled` or `Enforced` a persistent window
    /// keeps the base mode; a dedicated window is always honoured.
    pub fn mode(&mut self, mode: AllocationMode) {
        let before = self.effective_mode();
        match mode {
            AllocationMode::Auto => {
                self.windows.pop();
            }
            AllocationMode::Persistent => self.windows.push(match self.persistent {
                PersistentMemory::Enabled | PersistentMemory::SizeMatch => mode,
                PersistentMemory::Disabled | PersistentMemory::Enforced => self.base_mode,
            }),
            AllocationMode::Dedicated => self.windows.push(mode),
        }
        let after = self.effective_mode();
        if self.log >= MemoryLogLevel::Basic {
            tracing::debug!(manager = %self.name, ?before, ?after, "allocation mode");
        }
    }

    /// The mode the innermost open window puts in force.
    pub fn effective_mode(&self) -> AllocationMode {
        self.windows.last().copied().unwrap_or(self.base_mode)
    }

    /// Carve new pages without backing until each is first dereferenced
    /// (a dry run: plan a workload's memory without touching the device).
    pub fn set_dry_run(&mut self, dry_run: bool) {
        self.dry_run = dry_run;
    }

    /// Bytes of the pages all pools hold.
    pub fn bytes_reserved(&self) -> u64 {
        self.pools.iter().map(Pool::bytes_reserved).sum()
    }

    /// Bytes the live allocations asked for.
    pub fn bytes_in_use(&self) -> u64 {
        self.in_use
    }

    /// Allocations of `bytes` in all were freed outside a release (the end
    /// of a stream).
    pub(crate) fn freed_in_use(&mut self, bytes: u64) {
        self.in_use = self.in_use.saturating_sub(bytes);
    }

    /// The live meter, if this manager is metered (`live.rs`).
    pub(crate) fn meter(&self) -> Option<&Arc<LiveMeter>> {
        self.releases.meter.as_ref()
    }

    /// The binding of `cell` ended here, not by a drop: off the meter.
    pub(crate) fn unmeter(meter: Option<&Arc<LiveMeter>>, cell: &AllocationCell) {
        if let Some(meter) = meter {
            meter.ended(cell.metered.swap(0, Ordering::AcqRel));
        }
    }

    /// A handle bound to nothing yet, for [`bind`](Self::bind) to give an
    /// allocation to (the seed's `ManagedMemoryHandle::new()`).
    pub fn unbound(&self) -> Allocation {
        Allocation::new(self.new_cell(SlotKey::UNBOUND))
    }

    /// The queue this manager's handles release to.
    pub(crate) fn release_queue(&self) -> &Arc<super::release::ReleaseQueue> {
        self.releases.queue()
    }

    /// Process every release queued by dropped handles and guards.
    pub fn process_releases(&mut self) {
        if !self.deferred_frees.is_empty() {
            for key in std::mem::take(&mut self.deferred_frees) {
                self.free_slot(key, None);
            }
        }
        if self.releases.is_empty() {
            return;
        }
        // Both lanes as they stand now, cells first: what a client gave
        // back while these are processed waits for the next operation.
        let cells = self.releases.take_cells();
        let mut buf = std::mem::take(&mut self.release_buf);
        self.releases.drain_others(&mut buf);
        for cell in cells {
            let key = cell.key();
            self.free_slot(key, Some(cell));
        }
        for release in buf.drain(..) {
            match release {
                Release::Allocation(key) => self.free_slot(key, None),
                Release::Guard { pool, page } => {
                    self.pools[pool as usize].unguard(page, self.serial);
                }
            }
        }
        self.release_buf = buf;
    }

    /// Free the allocation `key` names, unless the key is stale (the slot
    /// was rebound since) or the allocation is still pinned (the last unpin
    /// queues the release again). `returned`: the last handle's reference to
    /// the cell, when the release brought it.
    pub(crate) fn free_slot(&mut self, key: SlotKey, returned: Option<Arc<AllocationCell>>) {
        let Some(live) = self.slots.locate(key) else {
            return;
        };
        if live.is_pinned() {
            // The last pin through the live cell queues the release again;
            // the last through a retired one cannot name it, so it waits here.
            if live.pinned_only_through_retired() {
                self.deferred_frees.push(key);
            }
            return;
        }
        if live.users.is_some() && self.hold_for_users(key) {
            return;
        }
        let live = self.slots.free(key.slot()).expect("located above");
        self.in_use -= live.size;

        if self.observer.is_some() {
            let id = self.id_of(key);
            if let Some(observer) = self.observer.as_mut() {
                observer.freed(id, live.size);
            }
        }
        self.pools[live.pool as usize].free(live.placement, live.size, live.aligned, self.serial);
        // Nothing but this slot (and the reference the release brought)
        // holds the cell — no handle, no pin: it can serve the next
        // reservation.
        let returned = returned.filter(|cell| Arc::ptr_eq(cell, &live.cell));
        let unshared = 1 + usize::from(returned.is_some());
        if Arc::strong_count(&live.cell) == unshared && self.spare_cells.len() < SPARE_CELLS {
            live.cell.pins.reset();
            live.cell.addr.store(0, Ordering::Relaxed);
            live.cell.lent_to.store(0, Ordering::Relaxed);
            self.spare_cells.push((live.cell, returned));
        }
    }

    /// The live allocation behind a handle.
    pub(crate) fn live(&self, allocation: &Allocation) -> Result<(u32, &Live), MemoryError> {
        let (slot, generation) = self.locate(allocation)?;
        match self.slots.locate(SlotKey::new(slot, generation)) {
            Some(live) => Ok((slot, live)),
            None => Err(MemoryError::Stale(allocation.id().expect("bound"))),
        }
    }

    /// The live allocation behind a handle, mutably.
    pub(crate) fn live_mut(&mut self, allocation: &Allocation) -> Result<&mut Live, MemoryError> {
        let (slot, _) = self.live(allocation)?;
        Ok(self.slots.get_mut(slot).expect("checked"))
    }

    /// `(slot, generation)` of a handle of this manager.
    fn locate(&self, allocation: &Allocation) -> Result<(u32, u32), MemoryError> {
        let Some(id) = allocation.id() else {
            return Err(MemoryError::Uninitialized);
        };
        if allocation.cell.owner != self.owner {
            return Err(MemoryError::Foreign(id));
        }
        Ok((id.slot, id.generation))
    }

    /// Return pages to the device: what each pool's period says is idle
    /// (`Periodic`, in stream order: no wait), or everything nothing
    /// holds (`Explicit`: waits for the stream, so that the memory has
    /// gone back when it returns). Spare handles kept for a growth go
    /// first: none follows.
    pub fn cleanup(&mut self, cleanup: Cleanup) {
        match cleanup {
            Cleanup::Periodic => self.cleanup_on_path(cleanup),
            Cleanup::Explicit => self.on_driver_path(DriverPath::Cleanup, |memory| {
                memory.cleanup_on_path(cleanup)
            }),
        }
    }

    fn cleanup_on_path(&mut self, cleanup: Cleanup) {
        self.release_spares();
        self.process_releases();
        if cleanup == Cleanup::Explicit && self.log >= MemoryLogLevel::Basic {
            tracing::debug!(manager = %self.name, "explicit cleanup");
        }
        match cleanup {
            Cleanup::Periodic => self.poll_users(),
            Cleanup::Explicit => {
                self.wait_users();
            }
        }
        self.cleanup_pools(cleanup);
        if cleanup == Cleanup::Explicit {
            self.storage.drain();
        }
    }

    /// Give back every page and granule nothing holds, in stream order
    /// (no wait): an explicit cleanup that a policy runs on the way to a
    /// reservation, a settle or another stream's round.
    pub(crate) fn give_back_free(&mut self) {
        self.process_releases();
        self.poll_users();
        self.cleanup_pools(Cleanup::Explicit);
    }

    /// Give back free memory in whole physical handles, the longest idle
    /// first, until `bytes` went: a round for another stream past the
    /// headroom, which lacks that much (the rest of the room stays mapped
    /// for this stream's next reservations). The bytes given back, which go in stream order
    /// at the caller's [`flush`](Self::flush).
    pub(crate) fn give_back_up_to(&mut self, bytes: u64) -> u64 {
        self.process_releases();
        self.poll_users();
        let mut given = 0;
        for pool in &mut self.pools {
            if given >= bytes {
                break;
            }
            given += pool.give_back_up_to(&mut self.storage, bytes - given);
        }
        given
    }

    /// The stream had no traffic for a while: move the clock past every
    /// pool's deallocation period and run a periodic cleanup, so pages that
    /// sit unused go back although no reservation drives the clock. Spare
    /// handles kept for a growth go first: none follows.
    pub(crate) fn cleanup_idle(&mut self) {
        self.on_driver_path(DriverPath::Idle, |memory| {
            memory.release_spares();
            memory.process_releases();
            memory.poll_users();
            memory.serial = memory.serial.saturating_add(memory.longest_period());
            memory.sweep_pools(Sweep::Idle {
                serial: memory.serial,
                quiet: true,
            });
        })
    }

    /// Run `f` with the storage counting the driver's operations for
    /// `path` (`storage::DriverPaths`), then switch back to the path that
    /// was on.
    pub(crate) fn on_driver_path<R>(
        &mut self,
        path: DriverPath,
        f: impl FnOnce(&mut Self) -> R,
    ) -> R {
        let was = self.storage.set_driver_path(path);
        let result = f(self);
        self.storage.set_driver_path(was);
        result
    }

    fn longest_period(&self) -> u64 {
        self.pools
            .iter()
            .filter_map(Pool::dealloc_period)
            .max()
            .unwrap_or(0)
    }

    fn cleanup_pools(&mut self, cleanup: Cleanup) {
        self.sweep_pools(match cleanup {
            Cleanup::Periodic => Sweep::Idle {
                serial: self.serial,
                quiet: false,
            },
            Cleanup::Explicit => Sweep::All,
        });
    }

    fn sweep_pools(&mut self, sweep: Sweep) {
        let mut released = false;
        for pool in &mut self.pools {
            released |= pool.cleanup(&mut self.storage, sweep);
        }
        // Pools only queue deallocations; the memory goes back at a flush,
        // which the storage orders after the stream's work on the pages.
        if released {
            self.storage.flush();
        }
    }

    /// Whether pools keep the room their peak needed mapped until it is
    /// asked for: expandable ones, under `MemoryConfig::keep_peak_mapped`.
    pub fn keeps_peak_mapped(&self) -> bool {
        self.pools.iter().any(Pool::keeps_peak_mapped)
    }

    /// Let queued deallocations go in stream order (no wait), and give
    /// the driver what earlier ones left behind fences that have passed.
    /// Allocations released while other streams used them are freed
    /// here once those streams' work is done (asked, never waited for):
    /// asked before the storage's flush, so what they free can go with
    /// it, and again after, for the fences the flush saw pass (a device
    /// whose work is done as it is asked passes them there; asked only
    /// before, they held their bytes to the next flush, and a stream that
    /// lent to others grew past them: `docs/service.md`, "Serving another
    /// stream").
    pub fn flush(&mut self) {
        self.process_releases();
        self.poll_users();
        self.storage.flush();
        self.poll_users();
    }

    /// Wait for the stream, and give the driver everything given back.
    /// What waited for other streams' work (`record_use`) is waited for
    /// too, and the memory it frees given back.
    pub fn drain(&mut self) {
        self.process_releases();
        if self.wait_users() {
            self.cleanup_pools(Cleanup::Explicit);
        }
        self.storage.drain();
    }

    /// Bytes given back and still held, waiting for the stream's work
    /// before them.
    pub fn bytes_in_reclaim(&self) -> u64 {
        self.storage.bytes_in_reclaim()
    }

    /// Bytes given back that the driver still holds because the rest of
    /// their physical handle is in use
    /// ([`DeviceStorage::bytes_stranded`]).
    pub fn bytes_stranded(&self) -> u64 {
        self.storage.bytes_stranded()
    }

    /// Bytes the storage holds from the device now.
    pub fn bytes_allocated(&self) -> u64 {
        self.storage.bytes_allocated()
    }

    /// The storage (to time deallocations, or read its own counters).
    pub fn storage(&mut self) -> &mut S {
        &mut self.storage
    }

    /// Every pool's shape, usage and peaks.
    pub fn memory_report(&self) -> MemoryReport {
        let mut pools = self.pools.iter().map(Pool::report);
        let persistent = pools.next().expect("persistent pool");
        let dedicated = pools.next().expect("dedicated pool");
        MemoryReport {
            dynamic: pools.collect(),
            persistent,
            dedicated,
            peak_bytes_reserved: self.peak_reserved,
            peak_bytes_in_use: self.peak_in_use,
            driver: self.storage.driver_ops(),
            driver_paths: self.storage.driver_paths(),
        }
    }

    /// Allocations moved, and their bytes, by compactions before growth.
    pub fn moved_before_growth(&self) -> (u64, u64) {
        self.pools
            .iter()
            .map(Pool::moved_before_growth)
            .fold((0, 0), |(moved, bytes), (m, b)| (moved + m, bytes + b))
    }

    /// Log the report at `info`.
    pub fn print_memory_usage(&self) {
        tracing::info!(manager = %self.name, "\n{}", self.memory_report());
    }
}

impl<S> fmt::Debug for MemoryManager<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryManager")
            .field("name", &self.name)
            .field("stream", &self.stream)
            .field("storage", &std::any::type_name::<S>())
            .field("serial", &self.serial)
            .finish_non_exhaustive()
    }
}

impl<S: DeviceStorage> fmt::Display for MemoryManager<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "memory {:?} ({})", self.name, self.stream)?;
        write!(f, "{}", self.memory_report())
    }
}
