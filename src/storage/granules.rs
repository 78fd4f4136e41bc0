//! Which granules of a reserved range have memory behind them: the
//! bookkeeping every storage with virtual memory keeps.

// The granule is checked non-zero when a map is made, and every index is
// below the range's granule count (checked against its size first).
#![allow(clippy::arithmetic_side_effects)]

use super::{StorageError, StorageHandle, check_range};

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
        })
    }

    /// Bytes of address space.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Granules mapped.
    pub(crate) fn mapped_granules(&self) -> u64 {
        self.count
    }

    /// Bytes mapped.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.count.saturating_mul(self.granule)
    }

    fn is_mapped(&self, index: u64) -> bool {
        self.mapped[(index / 64) as usize] & (1 << (index % 64)) != 0
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

    /// Mark `handle`'s granules mapped: all of them were unmapped.
    pub(crate) fn map(&mut self, handle: &StorageHandle) -> Result<(), StorageError> {
        let refused = StorageError::Unmapped {
            id: handle.id,
            offset: handle.offset,
            len: handle.size,
            expected: "whole unmapped granules of the range",
        };
        let granules = self.granules(handle).ok_or(refused.clone())?;
        if granules.clone().any(|index| self.is_mapped(index)) {
            return Err(refused);
        }
        for index in granules {
            self.set(index, true);
            self.count = self.count.saturating_add(1);
        }
        Ok(())
    }

    /// Mark `handle`'s granules unmapped; whether it named whole, mapped
    /// granules (nothing changes otherwise).
    pub(crate) fn unmap(&mut self, handle: &StorageHandle) -> bool {
        let Some(granules) = self.granules(handle) else {
            return false;
        };
        if !granules.clone().all(|index| self.is_mapped(index)) {
            return false;
        }
        for index in granules {
            self.set(index, false);
            self.count = self.count.saturating_sub(1);
        }
        true
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
        if (first..=last).all(|index| self.is_mapped(index)) {
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
