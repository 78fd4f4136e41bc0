//! Running short: what a stream actor does when a reservation finds no page.
//!
//! The long form: `docs/modules.md`, "`src/service/actor/short.rs`".

use super::StreamActor;
use crate::memory::{Cleanup, MemoryError, PageUpdate, RelocationReason};
use crate::service::device::Notice;
use crate::service::error::ServiceError;
use crate::service::events::SupervisorEvent;
use crate::service::message::{Pending, PendingState};
use crate::service::protocol::Allocations;
use crate::storage::StorageError;
use std::time::Duration;

/// How often a stream with waiting requests asks for another recovery round.
const ASK_INTERVAL: Duration = Duration::from_millis(20);
/// A parked request that did not ask to wait is answered at the latest
/// after this long, even if no `Retry` came (the coordinator is gone).
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(2);

fn is_out_of_memory(err: &MemoryError) -> bool {
    matches!(err, MemoryError::Storage(StorageError::OutOfMemory { .. }))
}

impl StreamActor {
    /// Serve a reservation, or park it if the device is short.
    pub(crate) fn serve_reserve(&mut self, mut pending: Pending) {
        if pending.for_cache > 0 && (self.over_headroom(&pending) || self.short_pending) {
            // No spare allocations for a cache on a device that is tight.
            let asked = pending.sizes.len().saturating_sub(pending.for_cache);
            pending.sizes.truncate(asked);
            pending.for_cache = 0;
        }
        if pending.update != PageUpdate::Forbidden && self.over_headroom(&pending) {
            return self.serve_within_headroom(pending);
        }
        self.serve_growing(pending);
    }

    /// Serve a reservation, taking pages as needed; park it if the device
    /// is short.
    pub(crate) fn serve_growing(&mut self, pending: Pending) {
        match self.try_reserve(&pending) {
            Ok(batch) => return self.answer_served(pending, batch, false),
            Err(err) if !is_out_of_memory(&err) || pending.update == PageUpdate::Forbidden => {
                return pending.answer(Err(err.into()));
            }
            Err(_) => {}
        }
        // Our own cached pages (and our clients' hot allocations) and
        // fragmentation first.
        self.take_back_hot();
        self.memory.cleanup(Cleanup::Explicit);
        let _ = self.memory.relocate(RelocationReason::Short);
        match self.try_reserve(&pending) {
            Ok(batch) => self.answer_served(pending, batch, false),
            Err(err) if is_out_of_memory(&err) => self.park(pending),
            Err(err) => pending.answer(Err(err.into())),
        }
    }

    /// All of the sizes or none (in pages just large enough when the
    /// device is past its headroom).
    fn try_reserve(&mut self, pending: &Pending) -> Result<Allocations, MemoryError> {
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
    pub(crate) fn try_reserve_held(
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

    pub(crate) fn answer_served(&mut self, pending: Pending, batch: Allocations, recovered: bool) {
        crate::service::shared::bump(&self.shared.reservations, batch.len() as u64);
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

    fn fail(&mut self, pending: Pending) {
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

    fn park(&mut self, mut pending: Pending) {
        if pending.deadline.is_none() && (!self.device.has_coordinator() || self.hopeless(&pending))
        {
            return self.fail(pending);
        }
        pending.state = PendingState::ParkedShort { since: self.now() };
        let requested = pending.requested();
        let waits = pending.deadline.is_some();
        self.parked.push_back(pending);
        if waits {
            self.ask_for_memory(requested);
        } else {
            self.ask_now(requested, false);
        }
    }

    /// Whether no round could make `pending` fit: the others hold nothing
    /// beyond their clients' bytes, or (under a budget) less than the
    /// budget lacks for its smallest size. Both counts are exact at this
    /// moment (`memory/live.rs`), so the outcome is the same on every run.
    fn hopeless(&self, pending: &Pending) -> bool {
        let others = self.device.others_excess(self.shared.stream);
        if others == 0 {
            return true;
        }
        let Some(budget) = &self.device.budget else {
            return false;
        };
        let room = budget.limit().saturating_sub(budget.granted());
        let smallest = pending.sizes.iter().copied().min().unwrap_or(0);
        others < smallest.saturating_sub(room)
    }

    /// Tell the coordinator we are short, unless a round is under way or
    /// one was asked for just now (a request waiting for a deadline asks
    /// again as it polls).
    fn ask_for_memory(&mut self, requested: u64) {
        let now = self.now();
        if self
            .last_ask
            .is_some_and(|at| now.saturating_sub(at) < ASK_INTERVAL)
        {
            return;
        }
        self.ask_now(requested, false);
    }

    /// Tell the coordinator we are short (or, with `headroom`, about to grow
    /// past the device's headroom), unless a round is under way.
    pub(crate) fn ask_now(&mut self, requested: u64, headroom: bool) {
        if self.short_pending || !self.device.has_coordinator() {
            return;
        }
        self.short_pending = true;
        self.last_ask = Some(self.now());
        self.device.notify(Notice::Short {
            stream: self.shared.stream,
            requested,
            headroom,
        });
    }

    /// Whether the loop should poll for parked requests: one waits for a
    /// deadline, or (on the wall clock) a round's safety net may run out.
    /// On a manual clock a request parked for a round waits for its
    /// `Retry` alone.
    pub(crate) fn polls_parked(&self) -> bool {
        self.parked.iter().any(|pending| pending.deadline.is_some())
            || (!self.parked.is_empty() && self.device.clock.as_manual().is_none())
    }

    /// Try every parked request again. `round_over`: the coordinator's
    /// recovery round for us ended, so requests that did not ask to wait
    /// get their final answer.
    pub(crate) fn retry_parked(&mut self, round_over: bool) {
        if self.parked.is_empty() {
            return;
        }
        self.memory.process_releases();
        let now = self.now();
        let mut still_short = None;
        for mut pending in std::mem::take(&mut self.parked) {
            let waited_out = pending
                .state
                .parked_since()
                .is_some_and(|at| now.saturating_sub(at) >= RECOVERY_TIMEOUT);
            if let PendingState::ParkedForHeadroom { .. } = pending.state {
                if !round_over && self.short_pending && !waited_out {
                    self.parked.push_back(pending);
                    continue;
                }
                // The others have given back what they could: grow (or, if
                // the device is really short, go the running-short way).
                pending.state = self.growth_state(&pending);
                self.serve_growing(pending);
                continue;
            }
            // A request that waits for its round's answers is tried only
            // when they are in: its outcome must not depend on when a poll
            // came round.
            let recovering = pending.deadline.is_none() && !round_over && !waited_out;
            if recovering {
                self.parked.push_back(pending);
                continue;
            }
            match self.try_reserve(&pending) {
                Ok(batch) => self.answer_served(pending, batch, true),
                Err(err) if !is_out_of_memory(&err) => pending.answer(Err(err.into())),
                Err(_) => {
                    let waiting = pending.deadline.is_some_and(|deadline| now < deadline);
                    if waiting {
                        still_short.get_or_insert(pending.requested());
                        self.parked.push_back(pending);
                    } else {
                        self.fail(pending);
                    }
                }
            }
        }
        if let Some(requested) = still_short {
            self.ask_for_memory(requested);
        }
    }
}
