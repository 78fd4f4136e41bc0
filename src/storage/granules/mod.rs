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

mod given_back;
mod spares;
use given_back::GivenBackTable;
pub(crate) use spares::Mapping;

/// By default a physical handle covers at most this fraction (one in this
/// many) of the granules its range holds once it is mapped (`most_per_handle`;
/// `DeviceStorage::set_handle_cut` changes it). What a handle partly in use keeps from going back is
/// bounded by it: at 16 or 32, lone streams that fragment held 1.09-1.17
/// of live after their load fell; at 64 every trace measured stays within
/// 1.05 (`docs/memory.md`, "Physical handles").
pub(crate) const HANDLE_SHARE_ONE_IN: u64 = 64;

/// How a storage cuts the physical handles of its later maps
/// ([`DeviceStorage::set_handle_cut`](super::DeviceStorage::set_handle_cut)):
/// at up to one `share_one_in`th of the granules a range holds once
/// mapped, or of the most it ever held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleCut {
    /// A handle covers at most this fraction (one in this many) of its
    /// range's granules (64 by default; 1 where 0 is asked).
    pub share_one_in: u64,
    /// Of the most granules the range ever held, instead of those it holds
    /// once the map is made: the same lengths while memory comes and goes,
    /// so that a handle given back fits the pieces its range cuts later
    /// (`docs/memory.md`, "Physical handles").
    pub of_most_held: bool,
}

impl Default for HandleCut {
    fn default() -> Self {
        Self {
            share_one_in: HANDLE_SHARE_ONE_IN,
            of_most_held: false,
        }
    }
}

/// How large one physical handle may be: at most `most` granules (at least
/// 1, [`DEFAULT_HANDLE_GRANULES`](super::DEFAULT_HANDLE_GRANULES) unless a
/// storage was told otherwise, `with_handle_granules`), and at most the
/// share `cut` says of its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandleSize {
    most: u64,
    cut: HandleCut,
}

impl HandleSize {
    /// At most `granules` granules a handle (1 where 0 is asked), and the
    /// default cut.
    pub(crate) fn new(granules: u64) -> Self {
        Self {
            most: granules.max(1),
            cut: HandleCut::default(),
        }
    }

    /// The same, cut as `cut` says.
    pub(crate) fn with_cut(self, cut: HandleCut) -> Self {
        Self {
            cut: HandleCut {
                share_one_in: cut.share_one_in.max(1),
                ..cut
            },
            ..self
        }
    }
}

impl Default for HandleSize {
    fn default() -> Self {
        Self::new(super::DEFAULT_HANDLE_GRANULES)
    }
}

/// Granules in `runs`.
pub(crate) fn granules_in(runs: &[Range<u64>]) -> u64 {
    runs.iter().fold(0, |sum, run| sum + (run.end - run.start))
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
    /// The most granules mapped at once (`HandleCut::of_most_held`).
    most_held: u64,
    /// The physical handles, by first granule: `start -> end`.
    handles: BTreeMap<u64, u64>,
    /// Granules given back but still mapped: the memory layer sees them
    /// unmapped, the driver still has memory behind them. One mapped
    /// again before it went is revived with no driver call; a batch
    /// unmaps only the granules still waiting in it, and only whole
    /// handles.
    doomed: GivenBackTable,
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
            most_held: 0,
            handles: BTreeMap::new(),
            doomed: GivenBackTable::default(),
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

    /// The lengths of the physical handles with memory behind them, in
    /// granules, in address order.
    pub(crate) fn handle_lengths(&self) -> Vec<u64> {
        (self.handles.iter())
            .map(|(start, end)| end - start)
            .collect()
    }

    /// Bytes with memory behind them.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.count.saturating_mul(self.granule)
    }

    /// Bytes given back and still mapped, waiting for their fence.
    pub(crate) fn doomed_bytes(&self) -> u64 {
        self.doomed.waiting().saturating_mul(self.granule)
    }

    /// Bytes given back whose fence passed, held because the rest of
    /// their physical handle is not.
    pub(crate) fn stranded_bytes(&self) -> u64 {
        self.doomed.stranded().saturating_mul(self.granule)
    }

    fn is_mapped(&self, index: u64) -> bool {
        self.mapped[(index / 64) as usize] & (1 << (index % 64)) != 0
    }

    /// Mapped and not given back: what the memory layer may touch.
    fn is_live(&self, index: u64) -> bool {
        self.is_mapped(index) && !self.doomed.contains(index)
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

    /// Bytes a [`map`](Self::map) of `handle` would put memory behind, the
    /// storage holding adopted handles of the lengths `loose` (all of it
    /// where the map would be refused: the caller finds out).
    pub(crate) fn bytes_a_map_adds(&self, handle: &StorageHandle, loose: &[u64]) -> u64 {
        match self.plan(handle, loose) {
            Ok(mapping) => mapping.created_granules() * self.granule,
            Err(_) => handle.size,
        }
    }

    /// The most granules a physical handle created for the fresh `runs`
    /// covers, each run being cut at multiples of it: the range's most
    /// (`handle_size`) or the largest power of two no more than the cut's
    /// share ([`HANDLE_SHARE_ONE_IN`]th by default) of the granules it
    /// holds once mapped (or of the most it ever held, where the cut says
    /// so), whichever is less. So a range that grew large maps in large
    /// handles, and a small one (or a large one's first granules) in small
    /// ones: a handle partly in use keeps at most about that share of its
    /// range from going back.
    fn most_per_handle(&self, runs: &[Range<u64>]) -> u64 {
        let cut = self.handle_size.cut;
        let mut after = self.count + granules_in(runs);
        if cut.of_most_held {
            after = after.max(self.most_held);
        }
        let share = (after / cut.share_one_in).max(1);
        self.handle_size.most.min(1 << share.ilog2())
    }

    /// Cut the handles of later maps as `cut` says (those mapped already
    /// stay as they are).
    pub(crate) fn set_handle_cut(&mut self, cut: HandleCut) {
        self.handle_size = self.handle_size.with_cut(cut);
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
            if self.doomed.get(index) != Some(GivenBack::Waiting(batch)) {
                continue;
            }
            let physical = self.handle_of(index);
            let passed = |state: Option<GivenBack>| match state {
                Some(GivenBack::Stranded) => true,
                Some(GivenBack::Waiting(at)) => at <= batch,
                None => false,
            };
            let complete = physical.clone().all(|at| passed(self.doomed.get(at)));
            if keep && complete {
                for at in physical.clone() {
                    self.doomed.insert(at, GivenBack::Stranded);
                }
                (self.spares).insert((physical.end - physical.start, physical.start));
                continue;
            }
            if !complete {
                self.doomed.insert(index, GivenBack::Stranded);
                continue;
            }
            for at in physical.clone() {
                self.doomed.remove(at);
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
                .all(|at| self.doomed.contains(at))
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

    /// Where the physical handle holding `handle`'s first granule ends, as
    /// a byte offset, at most `handle`'s end (its end where it is not whole
    /// granules of the range; the first granule's end where that is not
    /// mapped).
    pub(crate) fn first_handle_end(&self, handle: &StorageHandle) -> u64 {
        let Some(granules) = self.granules(handle) else {
            return handle.offset.saturating_add(handle.size);
        };
        let end = if self.is_mapped(granules.start) {
            self.handle_of(granules.start).end
        } else {
            granules.start + 1
        };
        end.min(granules.end) * self.granule
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
mod tests;
