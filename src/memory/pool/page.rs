//! What every pool kind shares: where an allocation was put, a page's
//! backing, how large a growth may be, and the rounding every carve does.

use crate::storage::{DeviceStorage, StorageError, StorageHandle};
use std::fmt;

/// Where a pool put an allocation: the pool's page index, the arena node
/// of its block (`arena::NONE` for whole pages) and its offset in the page.
///
/// The page and the node share one word. A placement is made by the pool
/// and copied whole into the slot at every reservation; written as two
/// 32-bit halves and read back as one word, the copy's load waited for the
/// stores to reach the cache (store forwarding fails): 8 % of a reservation
/// and its release on a ring of 1 MiB, 15 % on `serving-s1`
/// (`docs/performance.md`, "The manager alone replaying the corpus").
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    /// The page above, the node below.
    page_and_node: u64,
    /// Offset in the page.
    pub(crate) offset: u64,
}

impl Placement {
    #[inline]
    pub(crate) fn new(page: u32, node: u32, offset: u64) -> Self {
        Self {
            page_and_node: (u64::from(page) << 32) | u64::from(node),
            offset,
        }
    }

    /// The pool's page index.
    #[inline]
    pub(crate) fn page(&self) -> u32 {
        (self.page_and_node >> 32) as u32
    }

    /// The arena node of a sliced or expandable pool's block
    /// (`arena::NONE` for whole pages).
    #[inline]
    pub(crate) fn node(&self) -> u32 {
        self.page_and_node as u32
    }
}

impl fmt::Debug for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Placement")
            .field("page", &self.page())
            .field("node", &self.node())
            .field("offset", &self.offset)
            .finish()
    }
}

/// A page as the manager sees it when deciding what to relocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageInfo {
    /// The pool's page index.
    pub(crate) page: u32,
    /// Bytes of the page.
    pub(crate) size: u64,
    /// Bytes carved from it (aligned).
    pub(crate) used: u64,
    /// Left behind by a growth of the page size.
    pub(crate) outdated: bool,
    /// Guarded: never moved from, carved from or released.
    pub(crate) guarded: bool,
}

/// What a pool's cleanup gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sweep {
    /// What stayed idle for the pool's period at this reservation serial.
    Idle {
        /// Reservations so far.
        serial: u64,
        /// The stream went quiet: what is idle goes back even where a pool
        /// keeps free room mapped for its next peak.
        quiet: bool,
    },
    /// Everything nothing holds.
    All,
}

/// What an expandable pool keeps mapped of the room its allocations let
/// go (`MemoryConfig::free_slack_one_in`, `MemoryConfig::keep_peak_mapped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FreeRoom {
    /// One in this many of the bytes in use stays mapped free after a
    /// reservation; `None`: free granules wait for the period.
    pub(crate) slack_one_in: Option<u64>,
    /// Free granules stay mapped up to the most the pool has had in use
    /// (and its slack) until memory is asked for back.
    pub(crate) keep_peak: bool,
}

/// What a growth is for: the bytes asked for and taken, and the slot.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wanted {
    /// Bytes asked for.
    pub(crate) size: u64,
    /// Bytes taken (aligned).
    pub(crate) aligned: u64,
    /// The slot the allocation fills.
    pub(crate) slot: u32,
}

/// How large a page a reservation that needs one may add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Growth {
    /// The pool's page size (an adaptive pool grows it for a larger
    /// reservation).
    Pool,
    /// Just this reservation, in growth steps; the page size stays.
    Tight,
}

/// A page's backing: its storage range and the address of its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backing {
    /// The whole page.
    pub(crate) handle: StorageHandle,
    /// Address of its first byte (what allocations publish for resolve).
    pub(crate) base: u64,
}

impl Backing {
    /// Queue a page's backing, if it has one, for deallocation.
    pub(crate) fn give_back(slot: &mut Option<Backing>, storage: &mut dyn DeviceStorage) {
        if let Some(backing) = slot.take() {
            storage.deallocate(backing.handle.id);
        }
    }

    /// A page's backing, allocated now if the page was carved lazily.
    pub(crate) fn get_or_allocate(
        slot: &mut Option<Backing>,
        storage: &mut dyn DeviceStorage,
        size: u64,
    ) -> Result<StorageHandle, StorageError> {
        if let Some(backing) = slot {
            return Ok(backing.handle);
        }
        let backing = Self::allocate(storage, size)?;
        *slot = Some(backing);
        Ok(backing.handle)
    }

    /// Allocate a page of `size` bytes and learn its address.
    pub(crate) fn allocate(
        storage: &mut dyn DeviceStorage,
        size: u64,
    ) -> Result<Self, StorageError> {
        let handle = storage.allocate(size)?;
        match storage.resource(&handle) {
            Ok(resource) => Ok(Self {
                handle,
                base: resource.addr,
            }),
            Err(err) => {
                storage.deallocate(handle.id);
                Err(err)
            }
        }
    }
}

/// `size` rounded up to a multiple of `alignment` (any alignment >= 1).
#[inline]
pub(crate) fn align_up(size: u64, alignment: u64) -> u64 {
    // The common case (every real device) without a division.
    if alignment.is_power_of_two() {
        let mask = alignment - 1;
        return size.checked_add(mask).map_or(u64::MAX, |end| end & !mask);
    }
    size.div_ceil(alignment).saturating_mul(alignment)
}

/// `size` rounded down to a multiple of `alignment`.
#[inline]
pub(crate) fn align_down(size: u64, alignment: u64) -> u64 {
    // As in `align_up`: a planner's walk calls this for every block.
    if alignment.is_power_of_two() {
        return size & !(alignment - 1);
    }
    size / alignment * alignment
}

/// How many whole `unit`s lie below `bytes` (`bytes / unit`), without a
/// division where the unit is a power of two (every real device's
/// granule): every release asks it of the granules it let go, and every
/// allocation an evacuation weighs of the granules it touches (the
/// manager alone replayed the serving traces 4-6 % faster without those
/// divisions: `docs/performance.md`, "The manager alone replaying the
/// corpus").
#[inline]
pub(crate) fn units_below(bytes: u64, unit: u64) -> u64 {
    if unit.is_power_of_two() {
        return bytes >> unit.trailing_zeros();
    }
    bytes / unit
}

/// How many `unit`s `bytes` reach into (`bytes.div_ceil(unit)`), as
/// [`units_below`].
#[inline]
pub(crate) fn units_over(bytes: u64, unit: u64) -> u64 {
    if unit.is_power_of_two() {
        return (bytes >> unit.trailing_zeros()) + u64::from(bytes & (unit - 1) != 0);
    }
    bytes.div_ceil(unit)
}

#[cfg(test)]
mod tests {
    use super::{Placement, units_below, units_over};
    use crate::memory::pool::arena::NONE;

    /// The page and the node come back as they went in, at both ends of
    /// their ranges: neither spills into the other's half of the word.
    #[test]
    fn a_placement_keeps_its_page_and_node_apart() {
        for (page, node) in [
            (0, 0),
            (0, NONE),
            (u32::MAX, 0),
            (7, NONE - 1),
            (u32::MAX, NONE),
        ] {
            let placement = Placement::new(page, node, u64::MAX);
            assert_eq!((placement.page(), placement.node()), (page, node));
            assert_eq!(placement.offset, u64::MAX);
        }
        assert_ne!(Placement::new(1, 0, 0), Placement::new(0, 1 << 31, 0));
    }

    /// The shifts give what the divisions give, for units that are powers
    /// of two and units that are not, at the edges of a unit and of `u64`.
    #[test]
    fn units_agree_with_the_division() {
        for unit in [1, 2, 3, 4096, 2 << 20, 3 << 20, 1 << 63, u64::MAX] {
            for bytes in [
                0,
                1,
                unit - 1,
                unit,
                unit.saturating_add(1),
                5 * (2 << 20) + 7,
                u64::MAX,
            ] {
                assert_eq!(units_below(bytes, unit), bytes / unit, "{bytes} / {unit}");
                assert_eq!(
                    units_over(bytes, unit),
                    bytes.div_ceil(unit),
                    "{bytes} / {unit}"
                );
            }
        }
    }
}
