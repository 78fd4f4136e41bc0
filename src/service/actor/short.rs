//! Running short: what a stream actor does when a reservation finds no page.
//!
//! The long form: `docs/modules.md`, "`src/service/actor/short.rs`".

use super::stream::{Stream, is_out_of_memory};
use crate::service::device::Notice;
use crate::service::message::{LendJob, Pending, PendingState};
use std::collections::VecDeque;
use std::time::Duration;

/// How often a stream with waiting requests asks for another recovery round.
const ASK_INTERVAL: Duration = Duration::from_millis(20);
/// A parked request that did not ask to wait is answered at the latest
/// after this long, even if no `Retry` came (the coordinator is gone).
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(2);

/// Running short: the reservations parked for memory and the recovery
/// round asked for, as one stream keeps them.
#[derive(Debug, Default)]
pub(crate) struct RunningShort {
    /// Reservations waiting for memory, oldest first.
    parked: VecDeque<Pending>,
    /// A `Short` notice is out and its `Retry` has not come.
    asked: bool,
    /// When the last `Short` notice went out.
    last_ask: Option<Duration>,
    /// Requests past the headroom that leave this turn to be lent
    /// (`lending.rs`), for whoever ends the turn.
    lend_out: Vec<LendJob>,
}

impl RunningShort {
    /// Whether a recovery round for this stream is under way.
    pub(crate) fn round_out(&self) -> bool {
        self.asked
    }

    /// Requests parked for memory now.
    pub(crate) fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Every parked request, taken to be answered (the stream's end),
    /// those still to be lent included.
    pub(crate) fn take_parked(&mut self) -> VecDeque<Pending> {
        let mut parked = std::mem::take(&mut self.parked);
        parked.extend(self.lend_out.drain(..).map(|job| job.pending));
        parked
    }

    /// Hand `job` to whoever ends this turn.
    pub(super) fn lend_after_turn(&mut self, job: LendJob) {
        self.lend_out.push(job);
    }

    /// The requests this turn leaves to be lent.
    pub(crate) fn take_lend_jobs(&mut self) -> Vec<LendJob> {
        std::mem::take(&mut self.lend_out)
    }

    /// Park `pending` to be served when the round ends (headroom).
    pub(super) fn park_for_round(&mut self, pending: Pending) {
        self.parked.push_back(pending);
    }

    /// The coordinator's round for this stream ended (`Control::Retry`):
    /// every parked request gets tried, and those that did not ask to wait
    /// get their final answer.
    pub(crate) fn round_over(&mut self, stream: &mut Stream) {
        self.asked = false;
        self.retry_parked(stream, true);
    }

    pub(super) fn park(&mut self, stream: &mut Stream, mut pending: Pending) {
        if pending.deadline.is_none()
            && (!stream.device.has_coordinator() || hopeless(stream, &pending))
        {
            return stream.fail(pending);
        }
        pending.state = PendingState::ParkedShort {
            since: stream.now(),
        };
        let requested = pending.requested();
        let waits = pending.deadline.is_some();
        self.parked.push_back(pending);
        if waits {
            self.ask_for_memory(stream, requested);
        } else {
            self.ask_now(stream, requested, None);
        }
    }

    /// Tell the coordinator we are short, unless a round is under way or
    /// one was asked for just now (a request waiting for a deadline asks
    /// again as it polls).
    fn ask_for_memory(&mut self, stream: &Stream, requested: u64) {
        let now = stream.now();
        if self
            .last_ask
            .is_some_and(|at| now.saturating_sub(at) < ASK_INTERVAL)
        {
            return;
        }
        self.ask_now(stream, requested, None);
    }

    /// Tell the coordinator we are short (or, with what the device `lacks`,
    /// about to grow past its headroom), unless a round is under way.
    pub(super) fn ask_now(&mut self, stream: &Stream, requested: u64, lacks: Option<u64>) {
        if self.asked || !stream.device.has_coordinator() {
            return;
        }
        self.asked = true;
        self.last_ask = Some(stream.now());
        stream.device.notify(Notice::Short {
            stream: stream.shared.stream,
            requested,
            lacks,
        });
    }

    /// Whether the loop should poll for parked requests: one waits for a
    /// deadline, or (on the wall clock) a round's safety net may run out.
    /// On a manual clock a request parked for a round waits for its
    /// `Retry` alone.
    pub(crate) fn polls_parked(&self, stream: &Stream) -> bool {
        self.parked.iter().any(|pending| pending.deadline.is_some())
            || (!self.parked.is_empty() && stream.device.clock.as_manual().is_none())
    }

    /// Try every parked request again. `round_over`: the coordinator's
    /// recovery round for us ended, so requests that did not ask to wait
    /// get their final answer.
    pub(crate) fn retry_parked(&mut self, stream: &mut Stream, round_over: bool) {
        if self.parked.is_empty() {
            return;
        }
        stream.memory.process_releases();
        let now = stream.now();
        let mut still_short = None;
        for mut pending in std::mem::take(&mut self.parked) {
            let waited_out = pending
                .state
                .parked_since()
                .is_some_and(|at| now.saturating_sub(at) >= RECOVERY_TIMEOUT);
            if let PendingState::ParkedForHeadroom { .. } = pending.state {
                if !round_over && self.asked && !waited_out {
                    self.parked.push_back(pending);
                    continue;
                }
                // The others have given back what they could: grow (or, if
                // the device is really short, go the running-short way).
                pending.state = stream.growth_state(&pending);
                self.serve_growing(stream, pending);
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
            match stream.try_reserve(&pending) {
                Ok(batch) => stream.answer_served(pending, batch, true),
                Err(err) if !is_out_of_memory(&err) => pending.answer(Err(err.into())),
                Err(_) => {
                    let waiting = pending.deadline.is_some_and(|deadline| now < deadline);
                    if waiting {
                        still_short.get_or_insert(pending.requested());
                        self.parked.push_back(pending);
                    } else {
                        stream.fail(pending);
                    }
                }
            }
        }
        if let Some(requested) = still_short {
            self.ask_for_memory(stream, requested);
        }
    }
}

/// Whether no round could make `pending` fit: the others hold nothing
/// beyond their clients' bytes, or (under a budget) less than the
/// budget lacks for its smallest size. Both counts are exact at this
/// moment (`memory/live.rs`), so the outcome is the same on every run.
fn hopeless(stream: &Stream, pending: &Pending) -> bool {
    let others = stream.device.others_excess(stream.shared.stream);
    if others == 0 {
        return true;
    }
    let Some(budget) = &stream.device.budget else {
        return false;
    };
    let room = budget.limit().saturating_sub(budget.granted());
    let smallest = pending.sizes.iter().copied().min().unwrap_or(0);
    others < smallest.saturating_sub(room)
}
