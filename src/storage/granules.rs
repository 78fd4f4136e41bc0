//! Which granules of a reserved range have memory behind them, and which
//! physical handles hold it: the bookkeeping every storage with virtual
//! memory keeps.
//!
//! A map of fresh granules gets physical handles of up to the storage's
//! `HandleSize` in granules each (one driver call creates, maps and
//! grants a handle, whatever its size), cut at multiples of that size so
//! the same calls give the same handles. The driver frees only whole
//! handles: a granule given back whose handle still has granules in use
//! stays *stranded*, its memory held, until the last of them goes (or it is
//! mapped again, with no driver call). `docs/memory.md`, "Physical
//! handles".
//!
//! While its owner holds spares ([`GranuleMap::unmap_doomed`]'s `keep`),
//! a handle whose every granule went back past its fence is not released
//! but kept as a *spare*, still mapped where it was: the next map of fresh
//! granules moves it there (unmapped and mapped again, no handle created
//! or released) before it creates any. `docs/memory.md`, "Spare
//! handles".

// The granule is checked non-zero when a map is made, and every index is
// below the range's granule count (checked against its size first).
#![allow(clippy::arithmetic_side_effects)]

use super::{StorageError, StorageHandle, check_range};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// A physical handle covers at most this fraction (one in this many) of
/// the granules its range holds once it is mapped (`handles_for`). What a
/// handle partly in use keeps from going back is bounded by it: at 16 or
/// 32, two held-out traces held 1.09-1.14 of live after their load fell;
/// at 64 every trace measured stays within 1.05 (`docs/memory.md`,
/// "Physical handles").
pub(crate) const HANDLE_SHARE_ONE_IN: u64 = 64;

/// The most granules one physical handle may cover: at least 1, and
/// [`DEFAULT_HANDLE_GRANULES`](super::DEFAULT_HANDLE_GRANULES) unless a
/// storage was told otherwise (`with_handle_granules`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandleSize(u64);

impl HandleSize {
    /// At most `granules` granules a handle (1 where 0 is asked).
    pub(crate) fn new(granules: u64) -> Self {
        Self(granules.max(1))
    }
}

impl Default for HandleSize {
    fn default() -> Self {
        Self(super::DEFAULT_HANDLE_GRANULES)
    }
}

/// Granules in `runs`.
pub(crate) fn granules_in(runs: &[Range<u64>]) -> u64 {
    runs.iter().fold(0, |sum, run| sum + (run.end - run.start))
}

/// A spare physical handle moved by a map: unmapped from the granules
/// `from` and mapped at `to` (as many), with no handle created or
/// released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HandleMove {
    /// Where it was mapped.
    pub(crate) from: Range<u64>,
    /// Where it is mapped now.
    pub(crate) to: Range<u64>,
}

/// What a map of fresh granules asks of the driver: spare handles moved
/// to some, new handles created for the rest, and (only where it creates
/// any) the spares it does not move released first, so that a storage
/// never holds spares and new memory at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Mapping {
    /// Spare handles moved to fresh granules, in order.
    pub(crate) moved: Vec<HandleMove>,
    /// Spare handles released before any is created.
    pub(crate) released: Vec<Range<u64>>,
    /// Physical handles created, in order.
    pub(crate) created: Vec<Range<u64>>,
}

impl Mapping {
    /// Granules the map puts new memory behind.
    pub(crate) fn created_granules(&self) -> u64 {
        granules_in(&self.created)
    }

    /// Granules of the spares it moves.
    pub(crate) fn moved_granules(&self) -> u64 {
        self.moved
            .iter()
            .fold(0, |sum, moved| sum + (moved.to.end - moved.to.start))
    }
}

/// Where a granule given back but still backed by the driver stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GivenBack {
    /// Waiting in this batch of give-backs for its fence
    /// (`give_back.rs`).
    Waiting(u64),
    /// Its fence passed, but its physical handle still has granules in
    /// use or waiting: it goes with the last of them.
    Stranded,
}

/// Which granules of a reserved range have memory behind them: the
/// bookkeeping every storage with virtual memory keeps, so that a map or an
/// access past what is mapped is refused instead of faulting.
#[derive(Debug, Clone)]
pub(crate) struct GranuleMap {
    /// Bytes of one granule.
    granule: u64,
    /// Bytes of address space.
    size: u64,
    /// The most granules one physical handle covers.
    handle_size: HandleSize,
    /// One bit per granule.
    mapped: Vec<u64>,
    /// Granules mapped.
    count: u64,
    /// The physical handles, by first granule: `start -> end`.
    handles: BTreeMap<u64, u64>,
    /// Granules given back but still mapped: the memory layer sees them
    /// unmapped, the driver still has memory behind them. One mapped
    /// again before it went is revived with no driver call; a batch
    /// unmaps only the granules still waiting in it, and only whole
    /// handles.
    doomed: BTreeMap<u64, GivenBack>,
    /// Granules in `doomed` waiting for a fence.
    waiting: u64,
    /// Spare handles, as `(granules, first granule)`: every granule given
    /// back and past its fence (`Stranded` in `doomed`), kept for a map to
    /// move (`unmap_doomed`'s `keep`).
    spares: BTreeSet<(u64, u64)>,
}

impl GranuleMap {
    /// A range of `size` bytes (a multiple of `granule`), nothing mapped,
    /// whose maps get physical handles of up to `handle_size` granules.
    pub(crate) fn new(
        granule: u64,
        size: u64,
        handle_size: HandleSize,
    ) -> Result<Self, StorageError> {
        if granule == 0 || size == 0 || size % granule != 0 {
            return Err(StorageError::InvalidSize(size));
        }
        let granules =
            usize::try_from(size / granule).map_err(|_| StorageError::InvalidSize(size))?;
        // Asked, not assumed: a range of 2^62 bytes needs a bitmap of 256
        // GiB, and an allocation the host refuses must be an error, not
        // an abort of the process.
        let words = granules.div_ceil(64);
        let mut mapped = Vec::new();
        mapped
            .try_reserve_exact(words)
            .map_err(|_| StorageError::OutOfMemory {
                requested: size,
                held: 0,
                capacity: 0,
            })?;
        mapped.resize(words, 0);
        Ok(Self {
            granule,
            size,
            handle_size,
            mapped,
            count: 0,
            handles: BTreeMap::new(),
            doomed: BTreeMap::new(),
            waiting: 0,
            spares: BTreeSet::new(),
        })
    }

    /// Bytes of address space.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Granules with memory behind them (those given back and waiting
    /// for their fence, or stranded, included).
    pub(crate) fn mapped_granules(&self) -> u64 {
        self.count
    }

    /// Physical handles with memory behind them.
    pub(crate) fn handle_count(&self) -> u64 {
        self.handles.len() as u64
    }

    /// Bytes with memory behind them.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.count.saturating_mul(self.granule)
    }

    /// Bytes given back and still mapped, waiting for their fence.
    pub(crate) fn doomed_bytes(&self) -> u64 {
        self.waiting.saturating_mul(self.granule)
    }

    /// Bytes given back whose fence passed, held because the rest of
    /// their physical handle is not.
    pub(crate) fn stranded_bytes(&self) -> u64 {
        let stranded = (self.doomed.len() as u64).saturating_sub(self.waiting);
        stranded.saturating_mul(self.granule)
    }

    fn is_mapped(&self, index: u64) -> bool {
        self.mapped[(index / 64) as usize] & (1 << (index % 64)) != 0
    }

    /// Mapped and not given back: what the memory layer may touch.
    fn is_live(&self, index: u64) -> bool {
        self.is_mapped(index) && !self.doomed.contains_key(&index)
    }

    fn set(&mut self, index: u64, mapped: bool) {
        let word = &mut self.mapped[(index / 64) as usize];
        if mapped {
            *word |= 1 << (index % 64);
        } else {
            *word &= !(1 << (index % 64));
        }
    }

    /// Bytes of one granule.
    pub(crate) fn granule(&self) -> u64 {
        self.granule
    }

    /// The granules `handle` covers, if it starts and ends on granules
    /// inside the range.
    pub(crate) fn granules(&self, handle: &StorageHandle) -> Option<std::ops::Range<u64>> {
        let end = handle.offset.checked_add(handle.size)?;
        (handle.size > 0
            && handle.offset % self.granule == 0
            && end % self.granule == 0
            && end <= self.size)
            .then(|| handle.offset / self.granule..end / self.granule)
    }

    /// The runs of `handle`'s granules a [`map`](Self::map) would need
    /// memory for from the driver, in order: all but those given back and
    /// not yet gone, which are revived, unless they belong to a spare
    /// handle that reaches outside `handle` (`partial`: released first,
    /// since reviving part of it would strand the rest). Refused where
    /// `handle` is not whole granules of the range or any of them is live.
    fn fresh_runs(
        &self,
        handle: &StorageHandle,
        partial: &[Range<u64>],
    ) -> Result<Vec<Range<u64>>, StorageError> {
        let refused = StorageError::Unmapped {
            id: handle.id,
            offset: handle.offset,
            len: handle.size,
            expected: "whole unmapped granules of the range",
        };
        let granules = self.granules(handle).ok_or(refused.clone())?;
        let released = |index: u64| partial.iter().any(|spare| spare.contains(&index));
        let mut fresh: Vec<Range<u64>> = Vec::new();
        for index in granules {
            if self.is_live(index) {
                return Err(refused);
            }
            if self.is_mapped(index) && !released(index) {
                continue;
            }
            match fresh.last_mut() {
                Some(run) if run.end == index => run.end = index + 1,
                _ => fresh.push(index..index + 1),
            }
        }
        Ok(fresh)
    }

    /// Bytes a [`map`](Self::map) of `handle` would put memory behind
    /// (all of it where the map would be refused: the caller finds out).
    pub(crate) fn bytes_a_map_adds(&self, handle: &StorageHandle) -> u64 {
        match self.plan(handle) {
            Ok(mapping) => mapping.created_granules() * self.granule,
            Err(_) => handle.size,
        }
    }

    /// The physical handles a map of the fresh `runs` creates where no
    /// spare is moved, in order: each run cut at multiples of the handle
    /// size, which is the range's most (`handle_size`) or the largest power
    /// of two no more than [`HANDLE_SHARE_ONE_IN`]th of the granules it
    /// holds once mapped, whichever is less. So a range that grew large
    /// maps in large handles, and a small one (or a large one's first
    /// granules) in small ones: a handle partly in use keeps at most about
    /// that share of its range from going back.
    pub(crate) fn handles_for(&self, runs: &[Range<u64>]) -> Vec<Range<u64>> {
        let mut handles = Vec::new();
        let most = self.most_per_handle(runs);
        for run in runs {
            Self::cut(run.clone(), most, &mut handles);
        }
        handles
    }

    /// The most granules a handle created for `runs` covers.
    fn most_per_handle(&self, runs: &[Range<u64>]) -> u64 {
        let after = self.count + granules_in(runs);
        let share = (after / HANDLE_SHARE_ONE_IN).max(1);
        self.handle_size.0.min(1 << share.ilog2())
    }

    /// Cut `run` into handles of at most `most` granules, at multiples of it.
    fn cut(run: Range<u64>, most: u64, into: &mut Vec<Range<u64>>) {
        let mut start = run.start;
        while start < run.end {
            let end = ((start / most + 1) * most).min(run.end);
            into.push(start..end);
            start = end;
        }
    }

    /// What a [`map`](Self::map) of `handle` asks of the driver. Its
    /// granules given back and not yet gone are revived where they are,
    /// except a spare handle's that reaches outside it (released, and its
    /// granules inside mapped fresh). The fresh granules are cut into
    /// handles as [`handles_for`](Self::handles_for) cuts them, so a map
    /// gives the same handles whatever it moves, and each takes a spare
    /// of its size where one is kept (none inside `handle`), or is
    /// created. Where any is created, the spares not moved are released
    /// first. Refused where `handle` is not whole granules of the range
    /// or any of them is live.
    pub(crate) fn plan(&self, handle: &StorageHandle) -> Result<Mapping, StorageError> {
        let inside = self.granules(handle).unwrap_or(0..0);
        let mut mapping = Mapping::default();
        let mut free = BTreeSet::new();
        for &(len, start) in &self.spares {
            let spare = start..start + len;
            if spare.end <= inside.start || spare.start >= inside.end {
                free.insert((len, start));
            } else if spare.start < inside.start || spare.end > inside.end {
                mapping.released.push(spare);
            }
        }
        let runs = self.fresh_runs(handle, &mapping.released)?;
        for piece in self.handles_for(&runs) {
            let len = piece.end - piece.start;
            let spare = free.range((len, 0)..=(len, u64::MAX)).next().copied();
            match spare {
                Some((_, start)) => {
                    free.remove(&(len, start));
                    mapping.moved.push(HandleMove {
                        from: start..start + len,
                        to: piece,
                    });
                }
                None => mapping.created.push(piece),
            }
        }
        if !mapping.created.is_empty() {
            (mapping.released).extend(free.iter().map(|&(len, start)| start..start + len));
        }
        Ok(mapping)
    }

    /// Mark `handle`'s granules mapped: none of them may be live. The
    /// driver's part is what [`plan`](Self::plan) says, which is returned.
    pub(crate) fn map(&mut self, handle: &StorageHandle) -> Result<Mapping, StorageError> {
        let mapping = self.plan(handle)?;
        self.apply(handle, &mapping);
        Ok(mapping)
    }

    /// Record `mapping`, the [`plan`](Self::plan) of a map of `handle`
    /// that the driver carried out.
    pub(crate) fn apply(&mut self, handle: &StorageHandle, mapping: &Mapping) {
        for spare in &mapping.released {
            self.forget_spare(spare);
        }
        for moved in &mapping.moved {
            self.forget_spare(&moved.from);
        }
        for index in self.granules(handle).unwrap_or(0..0) {
            match self.doomed.remove(&index) {
                Some(GivenBack::Waiting(_)) => self.waiting -= 1,
                Some(GivenBack::Stranded) => {
                    // A spare inside the map, revived whole: no spare now.
                    let physical = self.handle_of(index);
                    self.spares
                        .remove(&(physical.end - physical.start, physical.start));
                }
                None => {
                    self.set(index, true);
                    self.count += 1;
                }
            }
        }
        for moved in &mapping.moved {
            self.handles.insert(moved.to.start, moved.to.end);
        }
        (self.handles).extend(mapping.created.iter().map(|run| (run.start, run.end)));
    }

    /// The spare handles `spares` went (a map failed after giving them
    /// back): their granules are unmapped.
    pub(crate) fn forget_spares(&mut self, spares: &[Range<u64>]) {
        for spare in spares {
            self.forget_spare(spare);
        }
    }

    /// The spare handle `spare` leaves these granules: they are unmapped.
    fn forget_spare(&mut self, spare: &Range<u64>) {
        self.spares.remove(&(spare.end - spare.start, spare.start));
        self.handles.remove(&spare.start);
        for at in spare.clone() {
            self.doomed.remove(&at);
            self.set(at, false);
            self.count -= 1;
        }
    }

    /// Bytes of the spare handles kept.
    pub(crate) fn spare_bytes(&self) -> u64 {
        let granules = self.spares.iter().fold(0, |sum, (len, _)| sum + len);
        granules * self.granule
    }

    /// Release every spare handle (the handles the driver unmaps and
    /// releases, in order).
    pub(crate) fn release_spares(&mut self) -> Vec<Range<u64>> {
        let spares: Vec<Range<u64>> = (self.spares.iter())
            .map(|&(len, start)| start..start + len)
            .collect();
        for spare in &spares {
            self.forget_spare(spare);
        }
        spares
    }

    /// Give `handle`'s granules back in `batch`: they stay mapped until
    /// the batch's fence passes ([`unmap_doomed`](Self::unmap_doomed)).
    /// Whether it named whole, live granules (nothing changes otherwise).
    pub(crate) fn doom(&mut self, handle: &StorageHandle, batch: u64) -> bool {
        let Some(granules) = self.granules(handle) else {
            return false;
        };
        if !granules.clone().all(|index| self.is_live(index)) {
            return false;
        }
        self.waiting += granules.end - granules.start;
        for index in granules {
            self.doomed.insert(index, GivenBack::Waiting(batch));
        }
        true
    }

    /// `batch`'s fence passed (and every earlier one's): the granules of
    /// `handle` still waiting in it go, as the whole physical handles
    /// whose every granule is now given back and past its fence (the
    /// handles the driver unmaps and releases, in order), or, with
    /// `keep`, those handles stay mapped as spares for the next maps to
    /// move ([`release_spares`](Self::release_spares) lets them go). The
    /// others stay stranded until the last granule of their handle goes.
    pub(crate) fn unmap_doomed(
        &mut self,
        handle: &StorageHandle,
        batch: u64,
        keep: bool,
    ) -> Vec<Range<u64>> {
        let mut gone: Vec<Range<u64>> = Vec::new();
        for index in self.granules(handle).unwrap_or(0..0) {
            if self.doomed.get(&index) != Some(&GivenBack::Waiting(batch)) {
                continue;
            }
            let physical = self.handle_of(index);
            let passed = |state: Option<&GivenBack>| match state {
                Some(GivenBack::Stranded) => true,
                Some(GivenBack::Waiting(at)) => *at <= batch,
                None => false,
            };
            let complete = physical.clone().all(|at| passed(self.doomed.get(&at)));
            if keep && complete {
                for at in physical.clone() {
                    if let Some(GivenBack::Waiting(_)) = self.doomed.insert(at, GivenBack::Stranded)
                    {
                        self.waiting -= 1;
                    }
                }
                (self.spares).insert((physical.end - physical.start, physical.start));
                continue;
            }
            if !complete {
                self.doomed.insert(index, GivenBack::Stranded);
                self.waiting -= 1;
                continue;
            }
            for at in physical.clone() {
                if let Some(GivenBack::Waiting(_)) = self.doomed.remove(&at) {
                    self.waiting -= 1;
                }
                self.set(at, false);
                self.count -= 1;
            }
            self.handles.remove(&physical.start);
            gone.push(physical);
        }
        gone
    }

    /// The largest part of `handle` (whole granules of the range) whose
    /// give-back would leave no physical handle partly held: the handles
    /// it covers whose granules outside it are given back already. Only
    /// the first and last handle it touches can reach outside it, so the
    /// part is one run; empty (size 0) where there is none.
    pub(crate) fn whole_handles(&self, handle: &StorageHandle) -> StorageHandle {
        let Some(granules) = self.granules(handle) else {
            return *handle;
        };
        let outside_given_back = |physical: &Range<u64>| {
            (physical.start..granules.start.max(physical.start))
                .chain(granules.end.min(physical.end)..physical.end)
                .all(|at| self.doomed.contains_key(&at))
        };
        let mut start = granules.start;
        if self.is_mapped(start) {
            let first = self.handle_of(start);
            if !outside_given_back(&first) {
                start = first.end.min(granules.end);
            }
        }
        let mut end = granules.end;
        if end > start && self.is_mapped(end - 1) {
            let last = self.handle_of(end - 1);
            if !outside_given_back(&last) {
                end = last.start;
            }
        }
        let end = end.max(start);
        StorageHandle {
            id: handle.id,
            offset: start * self.granule,
            size: (end - start) * self.granule,
        }
    }

    /// The physical handle a mapped granule belongs to.
    fn handle_of(&self, index: u64) -> Range<u64> {
        match self.handles.range(..=index).next_back() {
            Some((&start, &end)) if index < end => start..end,
            // Every mapped granule has its handle; alone if not.
            _ => index..index + 1,
        }
    }

    /// Check that an access of `len` bytes at `handle`'s start (or the
    /// whole of `handle`, whichever is longer) touches mapped bytes only.
    pub(crate) fn check_access(
        &self,
        handle: &StorageHandle,
        len: u64,
    ) -> Result<(), StorageError> {
        check_range(handle, self.size, len)?;
        let bytes = handle.size.max(len);
        if bytes == 0 {
            return Ok(());
        }
        let first = handle.offset / self.granule;
        let last = (handle.offset.saturating_add(bytes).saturating_sub(1)) / self.granule;
        if (first..=last).all(|index| self.is_live(index)) {
            Ok(())
        } else {
            Err(StorageError::Unmapped {
                id: handle.id,
                offset: handle.offset,
                len: bytes,
                expected: "mapped",
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::StorageId;

    const GRANULE: u64 = 2 << 20;

    /// Granules `run` of the range, as a handle.
    fn granules(run: Range<u64>) -> StorageHandle {
        StorageHandle {
            id: StorageId(1),
            offset: run.start * GRANULE,
            size: (run.end - run.start) * GRANULE,
        }
    }

    /// A range of 4,096 granules with 1,024 of them mapped at once: large
    /// enough for handles of 16 granules.
    fn mapped_1024() -> GranuleMap {
        let mut map = GranuleMap::new(GRANULE, 4096 * GRANULE, HandleSize::new(16)).unwrap();
        let created = map.map(&granules(0..1024)).unwrap().created;
        assert_eq!(created.len(), 64, "1,024 granules in handles of 16");
        assert!(
            created
                .iter()
                .all(|run| run.end - run.start == 16 && run.start % 16 == 0)
        );
        map
    }

    #[test]
    fn a_small_range_maps_a_handle_per_granule_and_a_large_one_larger_handles() {
        let mut map = GranuleMap::new(GRANULE, 4096 * GRANULE, HandleSize::new(16)).unwrap();
        // 10 granules: a handle may cover at most 1/64 of the range's.
        assert_eq!(map.map(&granules(0..10)).unwrap().created.len(), 10);
        // 256 more: 266 held once mapped, so handles of 4, cut at multiples
        // of 4 (10..12 first, to reach one).
        let created = map.map(&granules(10..266)).unwrap().created;
        assert_eq!(created.first(), Some(&(10..12)));
        assert_eq!(created.get(1), Some(&(12..16)));
        assert_eq!(created.last(), Some(&(264..266)));
        assert_eq!(granules_in(&created), 256);
        assert_eq!(map.handle_count(), 10 + created.len() as u64);
    }

    #[test]
    fn a_handle_goes_back_only_whole_and_its_given_back_part_waits_stranded() {
        let mut map = mapped_1024();
        assert!(map.doom(&granules(0..8), 1));
        assert_eq!(map.doomed_bytes(), 8 * GRANULE);
        assert!(
            map.unmap_doomed(&granules(0..8), 1, false).is_empty(),
            "8..16 in use"
        );
        assert_eq!((map.doomed_bytes(), map.stranded_bytes()), (0, 8 * GRANULE));
        assert_eq!(map.mapped_granules(), 1024, "the driver still holds them");
        assert!(map.check_access(&granules(0..1), 0).is_err(), "given back");
        // The rest of the handle goes in a later batch: the whole handle with it.
        assert!(map.doom(&granules(8..16), 2));
        assert_eq!(map.unmap_doomed(&granules(8..16), 2, false), vec![0..16]);
        assert_eq!((map.stranded_bytes(), map.mapped_granules()), (0, 1008));
        assert_eq!(map.handle_count(), 63);
    }

    #[test]
    fn a_handle_waits_for_its_latest_batch() {
        let mut map = mapped_1024();
        assert!(map.doom(&granules(16..24), 1));
        assert!(map.doom(&granules(24..32), 2));
        // Batch 1's fence passed, batch 2's not yet: nothing goes.
        assert!(map.unmap_doomed(&granules(16..24), 1, false).is_empty());
        assert_eq!(map.doomed_bytes(), 8 * GRANULE, "batch 2's still wait");
        assert_eq!(map.unmap_doomed(&granules(24..32), 2, false), vec![16..32]);
        assert_eq!(map.doomed_bytes() + map.stranded_bytes(), 0);
    }

    #[test]
    fn a_stranded_granule_mapped_again_needs_no_driver_call() {
        let mut map = mapped_1024();
        assert!(map.doom(&granules(32..40), 1));
        assert!(map.unmap_doomed(&granules(32..40), 1, false).is_empty());
        assert_eq!(map.fresh_runs(&granules(32..40), &[]).unwrap(), vec![]);
        assert_eq!(map.bytes_a_map_adds(&granules(32..40)), 0);
        assert_eq!(map.map(&granules(32..40)).unwrap(), Mapping::default());
        assert_eq!(map.stranded_bytes(), 0);
        assert!(map.check_access(&granules(32..40), 0).is_ok());
    }

    #[test]
    fn whole_handles_is_the_part_that_frees_handles_whole() {
        let mut map = mapped_1024();
        // 4..40 touches handles 0..16, 16..32 and 32..48: only the middle
        // one lies inside it.
        assert_eq!(map.whole_handles(&granules(4..40)), granules(16..32));
        assert_eq!(map.whole_handles(&granules(4..12)).size, 0);
        // With 0..4 and 40..48 given back, the edges complete their
        // handles too.
        assert!(map.doom(&granules(0..4), 1));
        assert!(map.doom(&granules(40..48), 1));
        assert_eq!(map.whole_handles(&granules(4..40)), granules(4..40));
        // Unmapped granules are nobody's handle.
        assert_eq!(
            map.whole_handles(&granules(1024..1030)),
            granules(1024..1030)
        );
    }

    /// A small range (handles of one granule) with granules 0..8 mapped,
    /// and 0..3 given back and past their fence while spares are held.
    fn three_spares() -> GranuleMap {
        let mut map = GranuleMap::new(GRANULE, 64 * GRANULE, HandleSize::new(16)).unwrap();
        assert_eq!(map.map(&granules(0..8)).unwrap().created.len(), 8);
        assert!(map.doom(&granules(0..3), 1));
        assert!(
            map.unmap_doomed(&granules(0..3), 1, true).is_empty(),
            "kept"
        );
        assert_eq!(map.stranded_bytes(), 3 * GRANULE, "still held");
        map
    }

    #[test]
    fn a_map_moves_spares_before_it_creates_any() {
        let mut map = three_spares();
        let mapping = map.map(&granules(8..10)).unwrap();
        let moved: Vec<_> = mapping
            .moved
            .iter()
            .map(|m| (m.from.clone(), m.to.clone()))
            .collect();
        assert_eq!(moved, vec![(0..1, 8..9), (1..2, 9..10)]);
        assert!(mapping.created.is_empty() && mapping.released.is_empty());
        assert_eq!(map.mapped_granules(), 8, "5 live, 2 moved, 1 spare");
        assert!(map.check_access(&granules(8..10), 0).is_ok());
        // The spare left and the two it cannot cover: moved, then created.
        let mapping = map.map(&granules(10..13)).unwrap();
        assert_eq!(mapping.moved.len(), 1);
        assert_eq!(mapping.created, vec![11..12, 12..13]);
        assert_eq!(map.release_spares(), vec![], "none left");
        assert_eq!(map.mapped_granules(), 10);
        assert_eq!(map.stranded_bytes(), 0);
    }

    #[test]
    fn a_map_that_must_create_releases_the_spares_it_cannot_move_first() {
        let mut map = GranuleMap::new(GRANULE, 4096 * GRANULE, HandleSize::new(16)).unwrap();
        map.map(&granules(0..1024)).unwrap();
        // One spare of 16 granules; a map of 4 cannot take it.
        assert!(map.doom(&granules(0..16), 1));
        assert!(map.unmap_doomed(&granules(0..16), 1, true).is_empty());
        assert_eq!(map.bytes_a_map_adds(&granules(1024..1028)), 4 * GRANULE);
        let mapping = map.map(&granules(1024..1028)).unwrap();
        assert_eq!(mapping.released, vec![0..16]);
        assert_eq!(mapping.created, vec![1024..1028]);
        assert_eq!(map.mapped_granules(), 1024 - 16 + 4);
        assert!(map.check_access(&granules(0..1), 0).is_err());
    }

    #[test]
    fn a_spare_inside_a_map_is_revived_whole_and_one_reaching_out_is_released() {
        let mut map = GranuleMap::new(GRANULE, 4096 * GRANULE, HandleSize::new(16)).unwrap();
        map.map(&granules(0..1024)).unwrap();
        assert!(map.doom(&granules(0..32), 1));
        assert!(map.unmap_doomed(&granules(0..32), 1, true).is_empty());
        // 0..16 lies inside: revived where it is, no driver call.
        assert_eq!(map.map(&granules(0..16)).unwrap(), Mapping::default());
        // 16..32 reaches past 16..20: released, and 16..20 mapped fresh.
        let mapping = map.map(&granules(16..20)).unwrap();
        assert_eq!(mapping.released, vec![16..32]);
        assert_eq!(mapping.created, vec![16..20]);
        assert_eq!(map.mapped_granules(), 1024 - 12);
        assert_eq!(map.stranded_bytes(), 0, "nothing left half held");
    }

    #[test]
    fn spares_go_when_released_and_none_are_kept_unless_asked() {
        let mut map = three_spares();
        assert_eq!(map.release_spares(), vec![0..1, 1..2, 2..3]);
        assert_eq!((map.mapped_granules(), map.stranded_bytes()), (5, 0));
        assert!(map.doom(&granules(3..4), 2));
        assert_eq!(map.unmap_doomed(&granules(3..4), 2, false), vec![3..4]);
        assert_eq!(map.release_spares(), vec![]);
    }
}
