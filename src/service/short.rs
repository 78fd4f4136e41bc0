//! Running short: what a stream actor does when a reservation finds no page.
//!
//! 1. Its own remedy first: an explicit cleanup and a compaction, then once
//!    more.
//! 2. Still short: the request is *parked* (the actor keeps serving its
//!    inbox) and the coordinator is told (`Notice::Short`, which never
//!    blocks). The coordinator asks every other stream to give back cached
//!    pages and compact (`Control::GiveBack`), collects their answers, then
//!    tells this stream to retry (`Control::Retry`).
//! 3. On `Retry` every parked request is tried again: served, or answered
//!    with an `OutOfMemory` breakdown. A request that asked to wait
//!    (`reserve_timeout`) stays parked and is retried on a short poll until
//!    its deadline, asking for further rounds (at most one per
//!    `ASK_INTERVAL`).
//!
//! No actor ever waits on another actor or on the coordinator, and all
//! control traffic is on unbounded channels: two streams short at once
//! cannot deadlock.

use super::actor::StreamActor;
use super::device::Notice;
use super::error::ServiceError;
use super::events::SupervisorEvent;
use super::message::{Answer, Control};
use crate::memory::{
    Allocation, AllocationMode, Cleanup, MemoryError, PageUpdate, RelocationReason,
};
use crate::storage::StorageError;
use crate::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How often a stream with waiting requests asks for another recovery round.
const ASK_INTERVAL: Duration = Duration::from_millis(20);
/// A parked request that did not ask to wait is answered at the latest
/// after this long, even if no `Retry` came (the coordinator is gone).
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(2);

/// A reservation being served (or parked).
#[derive(Debug)]
pub(crate) struct Pending {
    /// Sizes (one for `reserve`).
    pub(crate) sizes: Vec<u64>,
    /// Page update allowed.
    pub(crate) update: PageUpdate,
    /// The caller's mode.
    pub(crate) mode: AllocationMode,
    /// Where the answer goes.
    pub(crate) reply: Answer<Vec<Allocation>>,
    /// Until when the caller waits for memory (`None`: one recovery round).
    pub(crate) deadline: Option<Instant>,
    /// When it was parked.
    pub(crate) parked_at: Option<Instant>,
}

impl Pending {
    fn requested(&self) -> u64 {
        self.sizes.iter().sum()
    }

    pub(crate) fn answer(self, result: Result<Vec<Allocation>, ServiceError>) {
        self.reply.send(result);
    }
}

fn is_out_of_memory(err: &MemoryError) -> bool {
    matches!(err, MemoryError::Storage(StorageError::OutOfMemory { .. }))
}

impl StreamActor {
    /// Serve a reservation, or park it if the device is short.
    pub(crate) fn serve_reserve(&mut self, pending: Pending) {
        match self.try_reserve(&pending) {
            Ok(batch) => return self.answer_served(pending, batch, false),
            Err(err) if !is_out_of_memory(&err) || pending.update == PageUpdate::Forbidden => {
                return pending.answer(Err(err.into()));
            }
            Err(_) => {}
        }
        // Our own cached pages and fragmentation first.
        self.memory.cleanup(Cleanup::Explicit);
        let _ = self.memory.relocate(RelocationReason::Short);
        match self.try_reserve(&pending) {
            Ok(batch) => self.answer_served(pending, batch, false),
            Err(err) if is_out_of_memory(&err) => self.park(pending),
            Err(err) => pending.answer(Err(err.into())),
        }
    }

    /// All of the sizes or none.
    fn try_reserve(&mut self, pending: &Pending) -> Result<Vec<Allocation>, MemoryError> {
        pending
            .sizes
            .iter()
            .map(|&size| self.memory.reserve_in(size, pending.update, pending.mode))
            .collect()
    }

    fn answer_served(&mut self, pending: Pending, batch: Vec<Allocation>, recovered: bool) {
        self.shared
            .reservations
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        if recovered {
            self.device
                .notify(Notice::Event(SupervisorEvent::Recovered {
                    stream: self.shared.stream,
                    requested: pending.requested(),
                }));
        }
        pending.answer(Ok(batch));
    }

    fn fail(&mut self, pending: Pending) {
        let requested = pending.requested();
        let stream = self.shared.stream;
        self.device
            .notify(Notice::Event(SupervisorEvent::OutOfMemory {
                stream,
                requested,
            }));
        let report = self.device.out_of_memory(stream, requested);
        pending.answer(Err(ServiceError::OutOfMemory(Box::new(report))));
    }

    fn park(&mut self, mut pending: Pending) {
        if !self.device.has_coordinator() && pending.deadline.is_none() {
            return self.fail(pending);
        }
        pending.parked_at = Some(Instant::now());
        let requested = pending.requested();
        self.parked.push_back(pending);
        self.ask_for_memory(requested);
    }

    /// Tell the coordinator we are short, unless a round is under way or
    /// one was asked for just now.
    fn ask_for_memory(&mut self, requested: u64) {
        if self.short_pending || !self.device.has_coordinator() {
            return;
        }
        if self.last_ask.is_some_and(|at| at.elapsed() < ASK_INTERVAL) {
            return;
        }
        self.short_pending = true;
        self.last_ask = Some(Instant::now());
        self.device.notify(Notice::Short {
            stream: self.shared.stream,
            requested,
        });
    }

    /// Whether requests are parked (the loop then polls).
    pub(crate) fn has_parked(&self) -> bool {
        !self.parked.is_empty()
    }

    /// Try every parked request again. `round_over`: the coordinator's
    /// recovery round for us ended, so requests that did not ask to wait
    /// get their final answer.
    pub(crate) fn retry_parked(&mut self, round_over: bool) {
        if self.parked.is_empty() {
            return;
        }
        self.memory.process_releases();
        let now = Instant::now();
        let mut still_short = None;
        for pending in std::mem::take(&mut self.parked) {
            match self.try_reserve(&pending) {
                Ok(batch) => self.answer_served(pending, batch, true),
                Err(err) if !is_out_of_memory(&err) => pending.answer(Err(err.into())),
                Err(_) => {
                    let waiting = pending.deadline.is_some_and(|deadline| now < deadline);
                    let recovering = pending.deadline.is_none()
                        && !round_over
                        && pending
                            .parked_at
                            .is_some_and(|at| now.duration_since(at) < RECOVERY_TIMEOUT);
                    if waiting || recovering {
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

    /// Serve what the coordinator sent.
    pub(crate) fn handle_control(&mut self, control: Control) {
        match control {
            Control::GiveBack { episode } => {
                let before = self.memory.bytes_allocated();
                self.memory.cleanup(Cleanup::Explicit);
                if let Ok(report) = self.memory.relocate(RelocationReason::Short) {
                    self.shared
                        .relocated
                        .fetch_add(report.moved, Ordering::Relaxed);
                }
                self.memory.flush();
                let freed = before.saturating_sub(self.memory.bytes_allocated());
                self.device.notify(Notice::GaveBack {
                    stream: self.shared.stream,
                    episode,
                    freed,
                });
            }
            Control::Retry => {
                self.short_pending = false;
                self.retry_parked(true);
            }
            Control::Compact => {
                if let Ok(report) = self.memory.relocate(RelocationReason::Compaction) {
                    self.shared
                        .relocated
                        .fetch_add(report.moved, Ordering::Relaxed);
                }
            }
        }
        self.publish();
    }
}
