//! Making the moves the planners chose, with the manager's [`Mover`]: a
//! move into a free block (a window, an evacuation group) copies the bytes;
//! a slide moves them down over the free block right below with the
//! storage's overlapping [`slide`](crate::storage::DeviceStorage::slide).
//! Each claims its allocation first and publishes the new place before the
//! claim is dropped (`pool/mover.rs`).

use super::ExpandablePool;
use crate::memory::error::MemoryError;
use crate::memory::pool::mover::{Claim, Mover, Pages};
use crate::memory::pool::page::{Backing, Placement};

use crate::storage::{DeviceStorage, StagedMove, StorageError, StorageHandle};
use smallvec::SmallVec;
use std::ops::Range;

/// What one move of a planned run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Moved down: this many allocations, of these bytes.
    Moved { allocations: u64, bytes: u64 },
    /// Nothing free right below it (it stays, and needs not move).
    InPlace,
    /// Pinned by a client (it stays).
    Pinned,
}

impl ExpandablePool {
    /// Move the allocation of `slot` to the start of the free block `hole`.
    /// `Ok(None)` when it is pinned (or the block has no room for it),
    /// `Ok(Some(bytes))` when moved.
    pub(super) fn move_into(
        &mut self,
        mover: &mut Mover<'_>,
        slot: u32,
        hole: u32,
    ) -> Result<Option<u64>, MemoryError> {
        mover.move_claimed(slot, |mover, moving| {
            let Some(to) = self.reserve_into(hole, moving.size, moving.aligned, slot) else {
                return Ok(None);
            };
            mover.carry(self, slot, moving, to)
        })
    }

    /// How many of `slots` (in address order) lie one right after another
    /// from the first, no free room between: one slide moves them all by
    /// the same distance, as one span.
    pub(super) fn adjacent(&self, mover: &Mover<'_>, slots: &[u32]) -> usize {
        let node = |slot: u32| mover.slots.get(slot).expect("live").placement.node();
        1 + slots
            .windows(2)
            .take_while(|pair| self.arena.next(node(pair[0])) == node(pair[1]))
            .count()
    }

    /// Slide the allocations of `slots` (adjacent, in address order) down
    /// over the free block right below the first, as one span: those a
    /// client does not pin, up to the first it does. What it did, and how
    /// many of `slots` it is done with. A failed copy leaves their bytes
    /// where they were (the storage, or the staging, undoes a partial
    /// one).
    pub(super) fn slide_adjacent(
        &mut self,
        mover: &mut Mover<'_>,
        slots: &[u32],
    ) -> Result<(Step, usize), MemoryError> {
        let first = mover.slots.get(slots[0]).expect("live").placement;
        let Some(to) = self.slide_target(first.node()) else {
            // Nothing free below the first, so none below the others.
            return Ok((Step::InPlace, slots.len()));
        };
        let claims: SmallVec<[Claim; 8]> =
            slots.iter().map_while(|&slot| mover.claim(slot)).collect();
        let claimed = &slots[..claims.len()];
        let Some(&last) = claimed.last() else {
            return Ok((Step::Pinned, 0));
        };
        let last = mover.slots.get(last).expect("live");
        let span = last.placement.offset + last.size - first.offset;
        if let Some(backing) = self.page_backing(first.page()) {
            let at = |offset: u64| StorageHandle {
                id: backing.handle.id,
                offset: backing.handle.offset + offset,
                size: span,
            };
            let (source, target) = (at(first.offset), at(to));
            match self.staging(first.page(), span, to..first.offset + span) {
                Some(staging) => mover.storage.stage(&StagedMove {
                    source,
                    staging,
                    target,
                })?,
                None => mover.storage.slide(&source, &target)?,
            }
        }
        // Each lands where the span put it: the one before it slid by the
        // same distance, leaving the free block right below it.
        let mut bytes = 0;
        for &slot in claimed {
            let live = mover.slots.get(slot).expect("live");
            let (node, size) = (live.placement.node(), live.size);
            let placement = self.slid(node, slot, mover.serial);
            mover.publish(self, slot, placement);
            bytes += size;
        }
        drop(claims);
        let allocations = claimed.len() as u64;
        Ok((Step::Moved { allocations, bytes }, claimed.len()))
    }

    /// Where to stage `size` bytes that slide down over `span` of range
    /// `page` (from the target's start to the source's end), when that
    /// takes fewer copies than a slide in place: that copies in pieces no
    /// longer than the distance (`DeviceStorage::slide`), each queued copy
    /// costing the host about as much as moving 15 MB (7.5 us on an H200),
    /// while staging takes two a piece as long as the staging block. A
    /// free block of the pool apart from the span that holds all of it, or
    /// else one of the largest; `None` when none pays.
    fn staging(&self, page: u32, size: u64, span: Range<u64>) -> Option<StorageHandle> {
        let distance = span.end - size - span.start;
        let in_place = size.div_ceil(distance.max(1));
        if in_place <= 2 {
            return None;
        }
        let node = self
            .arena
            .free_apart(size, page, span.clone())
            .or_else(|| self.arena.largest_apart(page, span))?;
        let piece = self.arena.size(node).min(size);
        if size.div_ceil(piece).saturating_mul(2) >= in_place {
            return None;
        }
        let backing = self.page_backing(self.arena.page(node))?;
        Some(StorageHandle {
            id: backing.handle.id,
            offset: backing.handle.offset + self.arena.offset(node),
            size: piece,
        })
    }
}

impl Pages for ExpandablePool {
    fn page_backing(&self, index: u32) -> Option<Backing> {
        self.ranges[index as usize].backing
    }

    /// Ranges have their reservation from the start: nothing to back later.
    fn materialize(
        &mut self,
        _storage: &mut dyn DeviceStorage,
        index: u32,
    ) -> Result<StorageHandle, StorageError> {
        self.ranges[index as usize]
            .backing
            .map(|backing| backing.handle)
            .ok_or(StorageError::NoVirtualMemory)
    }

    fn free(&mut self, placement: Placement, size: u64, aligned: u64, serial: u64) {
        Self::free(self, placement, size, aligned, serial);
    }
}
