//! What every policy of a stream's actor works on: the stream's manager,
//! the state it publishes to handles, and what the device's streams share.
//! The steps that need nothing more live here; running short
//! (`short.rs`) keeps state of its own.

use crate::memory::{MemoryError, MemoryManager, PageUpdate, RelocationNeed, RelocationReason};
use crate::service::device::DeviceShared;
use crate::service::error::ServiceError;
use crate::service::events::SupervisorEvent;
use crate::service::message::{Pending, PendingState};
use crate::service::protocol::Allocations;
use crate::service::shared::{StreamShared, bump};
use crate::storage::DeviceStorage;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use std::time::Duration;

/// A stream's pools and the shared state its policies read and publish.
pub(crate) struct Stream {
    /// The pools.
    pub(super) memory: MemoryManager<Box<dyn DeviceStorage>>,
    /// What handles and the supervisor read.
    pub(super) shared: Arc<StreamShared>,
    /// What the device's streams share (budget, registry, coordinator).
    pub(super) device: Arc<DeviceShared>,
}

impl Stream {
    /// The service's clock now.
    pub(super) fn now(&self) -> Duration {
        self.device.clock.now()
    }

    /// Publish what handles and the other streams' decisions read without
    /// a round trip: the pages held (bytes in use are counted as they
    /// change, `memory/live.rs`). The actor is the only writer: plain
    /// stores, and none when nothing changed.
    pub(super) fn publish(&mut self) {
        let reserved = self.memory.bytes_reserved();
        // Its own last store: what it published is what the counter holds.
        if reserved == self.shared.bytes_reserved.load(Ordering::Relaxed) {
            return;
        }
        self.shared
            .bytes_reserved
            .store(reserved, Ordering::Release);
        if reserved > self.shared.peak_bytes_reserved.load(Ordering::Relaxed) {
            self.shared
                .peak_bytes_reserved
                .store(reserved, Ordering::Relaxed);
        }
    }

    /// Take back every allocation the stream's clients keep in their hot
    /// caches (`hot.rs`): swapped out of their slots without their threads,
    /// dropped here, processed as releases at once.
    pub(super) fn take_back_hot(&mut self) {
        let taken = self.shared.hot.take_back();
        if taken > 0 {
            bump(&self.shared.hot_taken_back, taken);
            self.memory.process_releases();
        }
    }

    /// No request for a whole tick: run the cleanup a reservation would,
    /// with the clock moved past every pool's period (an idle stream gives
    /// back what sits unused), and empty outdated pages.
    pub(super) fn idle_tick(&mut self) {
        self.take_back_hot();
        self.memory.cleanup_idle();
        if self.memory.relocation_need() != RelocationNeed::None
            && let Ok(report) = self.memory.relocate(RelocationReason::Compaction)
        {
            bump(&self.shared.relocated, report.moved);
        }
        bump(&self.shared.idle_cleanups, 1);
        self.publish();
    }

    /// All of the sizes or none (in pages just large enough when the
    /// device is past its headroom).
    pub(super) fn try_reserve(&mut self, pending: &Pending) -> Result<Allocations, MemoryError> {
        let tight =
            pending.state == PendingState::ServingTight && pending.update == PageUpdate::Allow;
        let asked = pending.sizes.len().saturating_sub(pending.for_cache);
        let mut batch = Allocations::with_capacity(pending.sizes.len());
        for &size in &pending.sizes[..asked] {
            let reserved =
                self.memory
                    .reserve_within_caches(size, pending.update, pending.mode, tight)?;
            let allocation = match reserved {
                Some(allocation) => allocation,
                // It would grow past what the stream needed while clients'
                // caches hold room: that room first.
                None => {
                    self.take_back_hot();
                    if tight {
                        self.memory.reserve_tight(size, pending.mode)?
                    } else {
                        self.memory.reserve_in(size, pending.update, pending.mode)?
                    }
                }
            };
            batch.push(allocation);
        }
        // Spares for the caller's cache: as many as the room held has.
        for &size in &pending.sizes[asked..] {
            match self.memory.reserve_for_cache(size, pending.mode)? {
                Some(spare) => batch.push(spare),
                None => break,
            }
        }
        Ok(batch)
    }

    /// All of the sizes from the room held, or `None` (what was served
    /// goes back when the partial batch drops).
    pub(super) fn try_reserve_held(
        &mut self,
        pending: &Pending,
    ) -> Result<Option<Allocations>, MemoryError> {
        let mut batch = Allocations::with_capacity(pending.sizes.len());
        for &size in &pending.sizes {
            match self.memory.reserve_held(size, pending.mode)? {
                Some(allocation) => batch.push(allocation),
                None => return Ok(None),
            }
        }
        Ok(Some(batch))
    }

    /// Answer `pending` with `batch`; `recovered`: it waited for memory.
    pub(super) fn answer_served(&mut self, pending: Pending, batch: Allocations, recovered: bool) {
        bump(&self.shared.reservations, batch.len() as u64);
        if recovered {
            self.device.tell(SupervisorEvent::Recovered {
                stream: self.shared.stream,
                requested: pending.requested(),
            });
        }
        // Everything another stream's decision reads is in place before
        // the caller hears back (`actor.rs`).
        self.trim_to_headroom();
        self.publish();
        pending.answer(Ok(batch));
    }

    /// Answer `pending` with an `OutOfMemory` breakdown of the device.
    pub(super) fn fail(&mut self, pending: Pending) {
        let requested = pending.requested();
        let stream = self.shared.stream;
        self.publish();
        self.device
            .tell(SupervisorEvent::OutOfMemory { stream, requested });
        let needed = self
            .memory
            .new_page_size(requested, crate::memory::AllocationMode::Auto)
            .ok();
        let report = self.device.out_of_memory(stream, requested, needed);
        pending.answer(Err(ServiceError::OutOfMemory(Box::new(report))));
    }
}
