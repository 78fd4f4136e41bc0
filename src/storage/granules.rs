//! Which granules of a reserved range have memory behind them: the
//! bookkeeping every storage with virtual memory keeps.

// The granule is checked non-zero when a map is made, and every index is
// below the range's granule count (checked against its size first).
#![allow(clippy::arithmetic_side_effects)]

use super::{StorageError, StorageHandle, check_range};
use std::collections::BTreeMap;
use std::ops::Range;

/// Granules in `runs`.
pub(crate) fn granules_in(runs: &[Range<u64>]) -> u64 {
    runs.iter().fold(0, |sum, run| sum + (run.end - run.start))
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
    /// One bit per granule.
    mapped: Vec<u64>,
    /// Granules mapped.
    count: u64,
    /// Granules given back but still mapped, each with the batch of
    /// give-backs it waits in (`give_back.rs`): the memory layer sees
    /// them unmapped, the driver still has memory behind them. One mapped
    /// again before its batch's fence passed is revived with no driver
    /// call; a batch unmaps only the granules still waiting in it.
    doomed: BTreeMap<u64, u64>,
}

impl GranuleMap {
    /// A range of `size` bytes (a multiple of `granule`), nothing mapped.
    pub(crate) fn new(granule: u64, size: u64) -> Result<Self, StorageError> {
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
            mapped,
            count: 0,
            doomed: BTreeMap::new(),
        })
    }

    /// Bytes of address space.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Granules with memory behind them (those given back and waiting
    /// for their fence included).
    pub(crate) fn mapped_granules(&self) -> u64 {
        self.count
    }

    /// Bytes with memory behind them.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.count.saturating_mul(self.granule)
    }

    /// Bytes given back and still mapped, waiting for their fence.
    pub(crate) fn doomed_bytes(&self) -> u64 {
        (self.doomed.len() as u64).saturating_mul(self.granule)
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
    /// memory for from the driver (the others were given back and are
    /// not yet gone), in order; refused where `handle` is not whole
    /// granules of the range or any of them is live.
    pub(crate) fn fresh_runs(
        &self,
        handle: &StorageHandle,
    ) -> Result<Vec<Range<u64>>, StorageError> {
        let refused = StorageError::Unmapped {
            id: handle.id,
            offset: handle.offset,
            len: handle.size,
            expected: "whole unmapped granules of the range",
        };
        let granules = self.granules(handle).ok_or(refused.clone())?;
        let mut fresh: Vec<Range<u64>> = Vec::new();
        for index in granules {
            if self.is_live(index) {
                return Err(refused);
            }
            if self.is_mapped(index) {
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
        match self.fresh_runs(handle) {
            Ok(runs) => granules_in(&runs) * self.granule,
            Err(_) => handle.size,
        }
    }

    /// Mark `handle`'s granules mapped: none of them may be live. Those
    /// given back and still waiting for their fence are revived (their
    /// memory never left); the runs of granules that need memory from the
    /// driver are returned, in order.
    pub(crate) fn map(&mut self, handle: &StorageHandle) -> Result<Vec<Range<u64>>, StorageError> {
        let fresh = self.fresh_runs(handle)?;
        for index in self.granules(handle).unwrap_or(0..0) {
            if self.doomed.remove(&index).is_none() {
                self.set(index, true);
                self.count = self.count.saturating_add(1);
            }
        }
        Ok(fresh)
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
            self.doomed.insert(index, batch);
        }
        true
    }

    /// Unmap the granules of `handle` still waiting in `batch` (not
    /// revived since, nor given back again in a later batch): the runs the
    /// driver unmaps, in order.
    pub(crate) fn unmap_doomed(&mut self, handle: &StorageHandle, batch: u64) -> Vec<Range<u64>> {
        let mut gone: Vec<Range<u64>> = Vec::new();
        for index in self.granules(handle).unwrap_or(0..0) {
            if self.doomed.get(&index) != Some(&batch) {
                continue;
            }
            self.doomed.remove(&index);
            self.set(index, false);
            self.count = self.count.saturating_sub(1);
            match gone.last_mut() {
                Some(run) if run.end == index => run.end = index + 1,
                _ => gone.push(index..index + 1),
            }
        }
        gone
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
