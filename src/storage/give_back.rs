//! What a storage was asked to give back, in stream order: a device may
//! let memory go only once the work queued before can no longer touch it.
//! `deallocate` and `unmap` queue; a flush seals what is queued into a
//! *batch* behind a fence recorded on the stream (no wait) and gives back
//! every earlier batch whose fence has passed (asked, never waited for);
//! a drain waits for the stream and gives back everything.
//!
//! Granules given back stay mapped until their batch goes: the storage
//! marks them in its `GranuleMap` with the batch, so that a granule mapped
//! again before then is revived (no driver call) and its batch leaves it
//! alone (`GranuleMap::unmap_doomed`).

use super::{DriverOps, StorageHandle, StorageId};
use std::collections::VecDeque;

/// Pages and ranges to free, and granule runs to unmap, behind one fence.
#[derive(Debug)]
pub(crate) struct Batch<F> {
    /// Its number: what the granules it unmaps are marked with.
    pub(crate) id: u64,
    /// What says the stream's work before it is done.
    pub(crate) fence: F,
    /// Runs of granules of live ranges to unmap (those still waiting in
    /// this batch when it goes).
    pub(crate) unmaps: Vec<StorageHandle>,
    /// Pages and ranges to free, each once.
    pub(crate) frees: Vec<StorageId>,
}

/// The give-backs of one storage: those queued for the next fence, and
/// the batches in flight behind theirs, oldest first (a stream runs in
/// order, so their fences pass in order).
#[derive(Debug)]
pub(crate) struct GiveBack<F> {
    /// Pages and ranges queued to be freed, each once.
    frees: Vec<StorageId>,
    /// Runs of granules queued to be unmapped.
    unmaps: Vec<StorageHandle>,
    /// Sealed batches, oldest first.
    in_flight: VecDeque<Batch<F>>,
    /// The number the next sealed batch gets.
    next: u64,
}

impl<F> Default for GiveBack<F> {
    fn default() -> Self {
        Self {
            frees: Vec::new(),
            unmaps: Vec::new(),
            in_flight: VecDeque::new(),
            next: 0,
        }
    }
}

impl<F> GiveBack<F> {
    /// Queue the page or range `id` to be freed; `known`: the storage holds
    /// it (an unknown id, or one queued already, changes nothing).
    pub(crate) fn free(&mut self, id: StorageId, known: bool) {
        let queued = self.frees.contains(&id)
            || (self.in_flight.iter()).any(|batch| batch.frees.contains(&id));
        if known && !queued {
            self.frees.push(id);
        }
    }

    /// Queue the granules `run` names to be unmapped; `known`: the storage
    /// marked them given back in [`open_batch`](Self::open_batch).
    pub(crate) fn unmap(&mut self, run: &StorageHandle, known: bool) {
        if known {
            self.unmaps.push(*run);
        }
    }

    /// The number of the batch what is queued now will go in.
    pub(crate) fn open_batch(&self) -> u64 {
        self.next
    }

    /// Whether anything is queued or in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.frees.is_empty() && self.unmaps.is_empty() && self.in_flight.is_empty()
    }

    /// Whether anything is queued and not yet sealed.
    pub(crate) fn has_queued(&self) -> bool {
        !(self.frees.is_empty() && self.unmaps.is_empty())
    }

    /// Every page and range given back and not yet gone, queued or in
    /// flight.
    pub(crate) fn frees(&self) -> impl Iterator<Item = &StorageId> {
        (self.frees.iter()).chain(self.in_flight.iter().flat_map(|batch| batch.frees.iter()))
    }

    /// Seal what is queued into a batch behind `fence` (counted on `ops`
    /// as an event recorded); nothing when nothing is queued.
    pub(crate) fn seal(&mut self, ops: &mut DriverOps, fence: F) {
        if !self.has_queued() {
            return;
        }
        ops.event_recorded();
        self.in_flight.push_back(Batch {
            id: self.next,
            fence,
            unmaps: std::mem::take(&mut self.unmaps),
            frees: std::mem::take(&mut self.frees),
        });
        self.next = self.next.wrapping_add(1);
    }

    /// The batches whose fences have passed, oldest first: `passed` is
    /// asked of each in turn (counted on `ops` as an event queried; it
    /// counts any further query it makes) until one has not (the later
    /// ones wait behind it).
    pub(crate) fn ready(
        &mut self,
        ops: &mut DriverOps,
        mut passed: impl FnMut(&mut F, &mut DriverOps) -> bool,
    ) -> Vec<Batch<F>> {
        let mut ready = Vec::new();
        while let Some(front) = self.in_flight.front_mut() {
            ops.event_queried();
            if !passed(&mut front.fence, ops) {
                break;
            }
            ready.extend(self.in_flight.pop_front());
        }
        ready
    }

    /// Every batch, what is queued sealed last with `fence`, after a wait
    /// for the stream (counted on `ops`); empty (no wait) when nothing
    /// waits to go back.
    pub(crate) fn drain(&mut self, ops: &mut DriverOps, fence: F) -> Vec<Batch<F>> {
        if self.is_empty() {
            return Vec::new();
        }
        ops.waited();
        let mut all: Vec<Batch<F>> = self.in_flight.drain(..).collect();
        if self.has_queued() {
            all.push(Batch {
                id: self.next,
                fence,
                unmaps: std::mem::take(&mut self.unmaps),
                frees: std::mem::take(&mut self.frees),
            });
            self.next = self.next.wrapping_add(1);
        }
        all
    }
}

impl<F> GiveBack<F> {
    /// Bytes given back and not yet gone: the pages and ranges queued or
    /// in flight (`held` says each one's bytes), and the granules given
    /// back in the other ranges (`doomed`: each range with its bytes).
    pub(crate) fn bytes_waiting<'a>(
        &self,
        held: impl Fn(&StorageId) -> u64,
        doomed: impl Iterator<Item = (&'a StorageId, u64)>,
    ) -> u64 {
        // Granules are given back only through a queued or sealed unmap.
        if self.is_empty() {
            return 0;
        }
        let freed = self.frees().map(held);
        let doomed = doomed
            .filter(|(id, _)| !self.frees().any(|freed| freed == *id))
            .map(|(_, bytes)| bytes);
        freed.chain(doomed).fold(0, u64::saturating_add)
    }
}

impl GiveBack<Lag> {
    /// A flush of a storage with no stream of its own: seal what is
    /// queued behind a fence `clock.lag` flushes on, and the batches whose
    /// fences passed.
    pub(crate) fn flush_lagged(
        &mut self,
        clock: &mut LagClock,
        ops: &mut DriverOps,
    ) -> Vec<Batch<Lag>> {
        self.seal(ops, clock.tick());
        let clock = *clock;
        self.ready(ops, |fence, _| clock.passed(fence))
    }

    /// A drain of a storage with no stream of its own: every batch.
    pub(crate) fn drain_lagged(
        &mut self,
        clock: &mut LagClock,
        ops: &mut DriverOps,
    ) -> Vec<Batch<Lag>> {
        let fence = clock.tick();
        self.drain(ops, fence)
    }
}

/// The fence of a storage with no stream of its own ([`VirtualStorage`],
/// [`HostStorage`]): the work before it is done once the storage has been
/// flushed `lag` more times (how far a GPU runs behind its host, counted
/// in the storage's own cleanup points, so a replay stays the same on
/// every run; 0: done at once, as for a trace with no kernels).
///
/// [`VirtualStorage`]: super::VirtualStorage
/// [`HostStorage`]: super::HostStorage
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Lag {
    /// The flush at which the work before it is done.
    pub(crate) due: u64,
}

/// A storage's flushes, counted, and how many a fence lags.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LagClock {
    /// Flushes so far.
    pub(crate) flushes: u64,
    /// Flushes a fence lags behind the one that records it.
    pub(crate) lag: u64,
}

impl LagClock {
    /// Count a flush; the fence it records.
    pub(crate) fn tick(&mut self) -> Lag {
        self.flushes = self.flushes.saturating_add(1);
        Lag {
            due: self.flushes.saturating_add(self.lag),
        }
    }

    /// The fence of work queued now, recorded without a flush: due with
    /// the batch the next flush seals.
    pub(crate) fn next_due(&self) -> Lag {
        Lag {
            due: self.flushes.saturating_add(1).saturating_add(self.lag),
        }
    }

    /// Whether the work before `fence` is done.
    pub(crate) fn passed(&self, fence: &Lag) -> bool {
        fence.due <= self.flushes
    }
}
