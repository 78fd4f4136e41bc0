//! Reserving: validate a size, route it to a pool, take room from a page
//! the pool holds or a new one, and fill a slot (recycling a spare cell
//! where one is free). Every reserve form goes through `observe_reserve`.

use super::*;

/// Whether a reservation asks its caller to take clients' caches back
/// before it grows past the cache ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caches {
    /// Grow as needed.
    Ignore,
    /// Answer first (`reserve_within_caches`).
    First,
}

impl<S: DeviceStorage> MemoryManager<S> {
    /// Reserve `size` bytes in the effective mode, changing the pages held
    /// only as far as `update` allows.
    ///
    /// # Errors
    /// [`MemoryError::ZeroSize`], [`MemoryError::TooLarge`],
    /// [`MemoryError::PageUpdateForbidden`] when no room is held and `update`
    /// forbids a page, [`MemoryError::Storage`] when the device refuses one.
    pub fn reserve(&mut self, size: u64, update: PageUpdate) -> Result<Allocation, MemoryError> {
        let mode = self.effective_mode();
        self.reserve_in(size, update, mode)
    }

    /// [`reserve`](Self::reserve) in `mode`, whatever the windows say (the
    /// service passes each caller's own mode).
    pub fn reserve_in(
        &mut self,
        size: u64,
        update: PageUpdate,
        mode: AllocationMode,
    ) -> Result<Allocation, MemoryError> {
        let result = self.reserve_growing(size, update, mode, Growth::Pool);
        self.observe_reserve(size, result)
    }

    /// A spare for a client's hot cache, from the room held or from a
    /// growth that stays within the peak reserved bytes (a cache never
    /// raises the peak), `Ok(None)` when neither can; not on the
    /// live meter until it is handed out ([`Allocation::hand_out_from_cache`]).
    pub(crate) fn reserve_for_cache(
        &mut self,
        size: u64,
        mode: AllocationMode,
    ) -> Result<Option<Allocation>, MemoryError> {
        self.unmetered = true;
        let mut result = self.reserve_held(size, mode);
        // Growing for a spare is fine below the cache ceiling: the spare
        // then takes memory the stream needed before, or the caches' small
        // allowance past it.
        if matches!(result, Ok(None))
            && let Ok(grows) = self.new_page_size(size, mode)
            && self.bytes_reserved().saturating_add(grows) <= self.cache_ceiling()
        {
            result = self.reserve_in(size, PageUpdate::Allow, mode).map(Some);
        }
        self.unmetered = false;
        result
    }

    /// Reserve `size` bytes in `mode` from the room the pages hold, or
    /// `Ok(None)` if none fits: a probe before deciding to grow (the
    /// service's headroom). Unlike `reserve_in(.., PageUpdate::Forbidden, ..)`
    /// a miss is not a failure, and observers do not hear of it.
    ///
    /// # Errors
    /// [`MemoryError::ZeroSize`], [`MemoryError::TooLarge`].
    pub(crate) fn reserve_held(
        &mut self,
        size: u64,
        mode: AllocationMode,
    ) -> Result<Option<Allocation>, MemoryError> {
        match self.reserve_growing(size, PageUpdate::Forbidden, mode, Growth::Pool) {
            Err(MemoryError::PageUpdateForbidden { .. }) => Ok(None),
            result => self.observe_reserve(size, result).map(Some),
        }
    }

    /// [`reserve_in`](Self::reserve_in) with `PageUpdate::Allow`, but a page
    /// it must add is just large enough for this reservation (in the pool's
    /// growth steps, 1 MiB) instead of the pool's page size, and the pool's
    /// page size does not grow for it: what a device past its headroom
    /// wants, where every byte taken beyond the request is waste.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub(crate) fn reserve_tight(
        &mut self,
        size: u64,
        mode: AllocationMode,
    ) -> Result<Allocation, MemoryError> {
        let result = self.reserve_growing(size, PageUpdate::Allow, mode, Growth::Tight);
        self.observe_reserve(size, result)
    }

    /// Tell the observer, if any, what a reservation of `size` came to.
    fn observe_reserve(
        &mut self,
        size: u64,
        result: Result<Allocation, MemoryError>,
    ) -> Result<Allocation, MemoryError> {
        if let Some(observer) = self.observer.as_mut() {
            match &result {
                Ok(allocation) => {
                    observer.reserved(allocation.id().expect("reserved handles are bound"), size)
                }
                Err(err) => observer.failed(self.stream, size, err),
            }
        }
        result
    }

    /// [`reserve_in`](Self::reserve_in) (or [`reserve_tight`](Self::reserve_tight)
    /// when `tight`), unless it would grow the pools past the cache ceiling
    /// while clients' caches hold room: then `Ok(None)`, having changed
    /// nothing but the releases it took, for the caller to take the caches
    /// back and reserve again (the service's actor).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub(crate) fn reserve_within_caches(
        &mut self,
        size: u64,
        update: PageUpdate,
        mode: AllocationMode,
        tight: bool,
    ) -> Result<Option<Allocation>, MemoryError> {
        let growth = if tight { Growth::Tight } else { Growth::Pool };
        match self.reserve_unobserved(size, update, mode, growth, Caches::First) {
            Ok(None) => Ok(None),
            result => self
                .observe_reserve(size, result.map(Option::unwrap))
                .map(Some),
        }
    }

    fn reserve_unobserved(
        &mut self,
        size: u64,
        update: PageUpdate,
        mode: AllocationMode,
        growth: Growth,
        caches: Caches,
    ) -> Result<Option<Allocation>, MemoryError> {
        self.process_releases();
        if update == PageUpdate::Allow {
            self.cleanup_pools(Cleanup::Periodic);
        }
        let aligned = self.validate(size)?;
        self.serial += 1;
        let pool = self.route(size, aligned, mode)?;
        let slot = self.slots.claim();
        // Memory other streams were using may be free by now: asked (never
        // waited for) where the room held cannot serve, before anything
        // grows. PyTorch asks its events at every allocation; asked there,
        // a stream that lent to another paid a query a reservation while a
        // loan waited (`serving-s1`'s `serve` path 0.20 us per event;
        // `docs/performance.md`, "Lending, as an option").
        let placement = self.pools[pool]
            .try_reserve(size, aligned, slot)
            .or_else(|| {
                self.poll_users_freed()
                    .then(|| self.pools[pool].try_reserve(size, aligned, slot))
                    .flatten()
            });
        let placement = match placement {
            Some(placement) => placement,
            None if update == PageUpdate::Forbidden => {
                self.slots.unclaim(slot);
                return Err(MemoryError::PageUpdateForbidden { size });
            }
            None if caches == Caches::First && self.passes_cache_ceiling(pool, aligned) => {
                // Room handed to clients' caches first: caches never take
                // the stream past what it needed by more than their
                // allowance. The caller takes them back and asks again.
                self.slots.unclaim(slot);
                self.serial -= 1;
                return Ok(None);
            }
            None => {
                let lazy = self.dry_run;
                let (pools, mut mover) = self.lend();
                let wanted = Wanted {
                    size,
                    aligned,
                    slot,
                };
                match pools[pool].grow(&mut mover, wanted, update, growth, lazy) {
                    Ok(placement) => {
                        self.note_reserved();
                        if self.log >= MemoryLogLevel::Basic {
                            tracing::debug!(manager = %self.name, pool, size, "new page");
                        }
                        placement
                    }
                    Err(err) => {
                        self.slots.unclaim(slot);
                        return Err(err.into());
                    }
                }
            }
        };
        if self.log >= MemoryLogLevel::Full {
            tracing::trace!(manager = %self.name, pool, size, "reserved");
        }
        if update == PageUpdate::Allow {
            self.pools[pool].trim_after_reserve(&mut self.storage);
        }
        Ok(Some(self.fill_slot(slot, pool, placement, size, aligned)))
    }

    /// [`reserve_unobserved`](Self::reserve_unobserved) of a reservation
    /// that grows as it needs, whatever clients' caches hold.
    fn reserve_growing(
        &mut self,
        size: u64,
        update: PageUpdate,
        mode: AllocationMode,
        growth: Growth,
    ) -> Result<Allocation, MemoryError> {
        self.reserve_unobserved(size, update, mode, growth, Caches::Ignore)
            .map(|placed| placed.expect("only a reservation that asks for caches first waits"))
    }

    /// Whether growing `pool` for `aligned` bytes would take the pools past
    /// the cache ceiling while clients' caches hold room to take back.
    fn passes_cache_ceiling(&self, pool: usize, aligned: u64) -> bool {
        let grown = self
            .bytes_reserved()
            .saturating_add(self.pools[pool].new_page_size(aligned));
        grown > self.cache_ceiling() && self.cached_bytes() > 0
    }

    /// Check a size and return it aligned.
    fn validate(&self, size: u64) -> Result<u64, MemoryError> {
        if size == 0 {
            return Err(MemoryError::ZeroSize);
        }
        let aligned = align_up(size, self.alignment);
        if aligned > self.max_page_size {
            return Err(MemoryError::TooLarge {
                size,
                aligned,
                max: self.max_page_size,
            });
        }
        Ok(aligned)
    }

    /// The bytes of device memory a reservation of `size` in `mode` would
    /// take if it needed a new page now (what growth costs; the service's
    /// headroom weighs it before growing).
    ///
    /// # Errors
    /// The reservation's own size and routing errors.
    pub(crate) fn new_page_size(
        &self,
        size: u64,
        mode: AllocationMode,
    ) -> Result<u64, MemoryError> {
        let (pool, aligned) = self.routed(size, mode)?;
        Ok(self.pools[pool].new_page_size(aligned))
    }

    /// At least [`new_page_size`](Self::new_page_size), without the search
    /// an expandable pool's exact answer makes: a bound that settles most
    /// headroom checks at once.
    pub(crate) fn new_page_size_at_most(
        &self,
        size: u64,
        mode: AllocationMode,
    ) -> Result<u64, MemoryError> {
        let (pool, aligned) = self.routed(size, mode)?;
        Ok(self.pools[pool].new_page_size_at_most(aligned))
    }

    /// The pool a reservation of `size` in `mode` goes to, and its size
    /// aligned.
    fn routed(&self, size: u64, mode: AllocationMode) -> Result<(usize, u64), MemoryError> {
        let aligned = self.validate(size)?;
        Ok((self.route(size, aligned, mode)?, aligned))
    }

    /// The pool a reservation goes to.
    fn route(&self, size: u64, aligned: u64, mode: AllocationMode) -> Result<usize, MemoryError> {
        match mode {
            AllocationMode::Dedicated => return Ok(DEDICATED),
            AllocationMode::Persistent => return Ok(PERSISTENT),
            AllocationMode::Auto => {}
        }
        if self.persistent == PersistentMemory::SizeMatch
            && let Pool::Whole(persistent) = &self.pools[PERSISTENT]
            && persistent.holds_size(aligned)
        {
            return Ok(PERSISTENT);
        }
        (FIRST_DYNAMIC..self.pools.len())
            .find(|&pool| self.pools[pool].max_alloc_size() >= size)
            // The error's largest pool is worked out only for a refusal:
            // every reservation routes, and most fit the first pool.
            .ok_or_else(|| MemoryError::TooLarge {
                size,
                aligned,
                max: self.pools[FIRST_DYNAMIC..]
                    .iter()
                    .map(Pool::max_alloc_size)
                    .max()
                    .unwrap_or(0),
            })
    }

    fn fill_slot(
        &mut self,
        slot: u32,
        pool: usize,
        placement: Placement,
        size: u64,
        aligned: u64,
    ) -> Allocation {
        let key = self.slots.key(slot);
        let (allocation, kept) = match self.spare_cells.pop() {
            Some((kept, handle)) => {
                kept.set_key(key);
                let handle = handle.unwrap_or_else(|| Arc::clone(&kept));
                (Allocation::from_cell(handle), kept)
            }
            None => {
                let allocation = Allocation::new(self.new_cell(key));
                let kept = Arc::clone(&allocation.cell);
                (allocation, kept)
            }
        };
        let addr = self.pools[pool]
            .page_base(placement.page())
            .map_or(0, |base| base + placement.offset);
        allocation.cell.addr.store(addr, Ordering::Release);
        allocation.cell.len.store(size, Ordering::Release);
        if let Some(meter) = self.releases.meter.as_ref()
            && !self.unmetered
        {
            allocation.cell.metered.store(size, Ordering::Release);
            meter.handed_out(size);
        }
        self.slots.fill(
            slot,
            Live {
                pool: pool as u8,
                placement,
                size,
                aligned,
                cursor: 0,
                cell: kept,
                taint: TaintRanges::default(),
                retired: Vec::new(),
                users: None,
            },
        );
        self.in_use += size;
        self.peak_in_use = self.peak_in_use.max(self.in_use);
        allocation
    }

    pub(super) fn new_cell(&self, key: SlotKey) -> AllocationCell {
        AllocationCell {
            owner: self.owner,
            stream: self.stream,
            key: AtomicU64::new(key.word()),
            handles: AtomicUsize::new(1),
            pins: PinWord::default(),
            addr: AtomicU64::new(0),
            len: AtomicU64::new(0),
            metered: AtomicU64::new(0),
            lent_to: AtomicU64::new(0),
            releases: Arc::clone(self.releases.queue()),
            next_release: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Record a new high-water mark of reserved bytes.
    fn note_reserved(&mut self) {
        let reserved = self.bytes_reserved();
        self.peak_reserved = self.peak_reserved.max(reserved);
        let need = reserved.saturating_sub(self.cached_bytes());
        self.peak_need = self.peak_need.max(need);
    }
}

#[cfg(test)]
mod tests {
    use crate::memory::{AllocationMode, MemoryConfig, MemoryManager, PageUpdate};
    use crate::storage::VirtualStorage;
    use proptest::prelude::*;

    /// A metered manager whose clients' caches may hold one byte in 256.
    fn with_caches() -> MemoryManager<VirtualStorage> {
        use crate::memory::live::{LiveBytes, LiveMeter};
        use crate::sync::Arc;
        let meter = Arc::new(LiveMeter::new(Arc::new(LiveBytes::new())));
        let config = MemoryConfig::default();
        let stream = crate::memory::StreamId(0);
        let mut memory = MemoryManager::metered(VirtualStorage::new(), config, stream, Some(meter));
        memory.set_cache_share(256);
        memory
    }

    #[test]
    fn a_growth_past_the_cache_ceiling_asks_for_the_caches_first_and_changes_nothing() {
        let mut memory = with_caches();
        let first = memory.reserve(8 << 20, PageUpdate::Allow).unwrap();
        drop(first);
        // A spare for a cache: the room the stream needed, not handed out.
        let spare = memory
            .reserve_for_cache(8 << 20, AllocationMode::Auto)
            .unwrap()
            .expect("room held");
        let (reserved, serial) = (memory.bytes_reserved(), memory.serial);
        let asked = memory
            .reserve_within_caches(4 << 20, PageUpdate::Allow, AllocationMode::Auto, false)
            .unwrap();
        assert!(asked.is_none(), "the caches hold room: they go first");
        assert_eq!((memory.bytes_reserved(), memory.serial), (reserved, serial));
        // Taken back, the same reservation is served from their room.
        drop(spare);
        let served = memory
            .reserve_within_caches(4 << 20, PageUpdate::Allow, AllocationMode::Auto, false)
            .unwrap();
        assert!(served.is_some());
        assert_eq!(memory.bytes_reserved(), reserved, "no growth");
    }

    #[test]
    fn without_cached_room_a_reservation_grows_without_asking() {
        let mut memory = with_caches();
        let held = memory
            .reserve_within_caches(8 << 20, PageUpdate::Allow, AllocationMode::Auto, false)
            .unwrap();
        assert!(held.is_some());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// The service's headroom check settles most reservations on
        /// `new_page_size_at_most` alone, so it must never be below the
        /// exact answer, whatever the arena's voids look like.
        #[test]
        fn the_bound_on_a_new_page_is_never_below_it(
            steps in prop::collection::vec((1u64..(24 << 20), any::<bool>()), 1..120),
            asked in prop::collection::vec(1u64..(40 << 20), 1..8),
        ) {
            let mut memory = MemoryManager::new(VirtualStorage::new(), MemoryConfig::default());
            let mut live = Vec::new();
            for (size, keep) in steps {
                let allocation = memory.reserve(size, PageUpdate::Allow).unwrap();
                if keep {
                    live.push(allocation);
                } else if !live.is_empty() {
                    live.swap_remove(size as usize % live.len());
                }
                memory.process_releases();
                for &ask in &asked {
                    let exact = memory.new_page_size(ask, AllocationMode::Auto).unwrap();
                    let most = memory.new_page_size_at_most(ask, AllocationMode::Auto).unwrap();
                    prop_assert!(most >= exact, "{ask} bytes: at most {most}, exactly {exact}");
                }
            }
        }
    }

    #[test]
    fn a_tight_reservation_takes_a_page_just_large_enough() {
        use crate::memory::MemoryConfiguration;
        const MIB: u64 = 1 << 20;
        let mut memory = MemoryManager::new(
            VirtualStorage::new(),
            MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
        );
        // Below the adaptive arena's 2 MiB first page: one 1 MiB growth step.
        let small = memory
            .reserve_tight(300 << 10, AllocationMode::Auto)
            .unwrap();
        assert_eq!(memory.bytes_allocated(), MIB);
        // Above it: the size in steps, not a quarter to spare (8 MiB).
        let big = memory.reserve_tight(6 * MIB, AllocationMode::Auto).unwrap();
        assert_eq!(memory.bytes_allocated(), 7 * MIB);
        // And the pool's page size did not grow: the next ordinary page is
        // grown from 2 MiB for its own size, as it would have been.
        assert_eq!(
            memory.new_page_size(3 * MIB, AllocationMode::Auto).unwrap(),
            4 * MIB
        );
        // What fits in held room is served from it.
        let again = memory
            .reserve_tight(512 << 10, AllocationMode::Auto)
            .unwrap();
        assert_eq!(memory.bytes_allocated(), 7 * MIB);
        drop((small, big, again));
    }
}
