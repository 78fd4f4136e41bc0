//! Lending between streams, run by whoever served the asker's request,
//! between turns (`docs/service.md`, "Serving another stream").
//!
//! A request past the device's headroom that its stream's own room cannot
//! serve leaves the asker's turn as a [`LendJob`]: the request with the
//! streams that may serve it from their room (the *lenders*, the roomiest
//! first: `registry::lenders`). Once that turn is over, the thread that
//! took it (a client serving in place, or the asker's own thread) takes
//! each lender's turn in order, as any client of that stream would, until
//! one serves it; then the asker's turn again, to answer the request with
//! the loan or, when none lent, to go on as before the loan was tried (a
//! round, or growth).
//!
//! No turn waits for another: a job holds one stream's turn at a time, and
//! never its own asker's while it waits for a lender's. Two streams asking
//! each other at once each wait for one lock only, never held across.

use super::actor::{SharedActor, StreamActor, guarded};
use super::events::SupervisorEvent;
use super::message::{LendJob, Lends, Pending};
use super::protocol::{Allocations, LendAsk};
use crate::memory::StreamId;
use crate::sync::Arc;

impl Lends for Arc<SharedActor> {
    /// A turn of this stream's, taken as any client's: control first (as
    /// every turn serves it), then the loan.
    fn lend(&self, ask: &LendAsk) -> Option<Allocations> {
        let mut turn = self.turn();
        let actor = turn.as_mut().filter(|actor| runs(actor))?;
        guarded(actor, |actor| {
            actor.drain_control();
            let lent = actor.lend(ask);
            actor.drain_control();
            lent
        })
        .flatten()
    }

    fn cloned(&self) -> Box<dyn Lends> {
        Box::new(self.clone())
    }
}

/// Run the jobs the asker's turn just ended with (the caller holds no
/// turn): each lender asked in its own turn, then the asker's turn to
/// answer or go on. Whether a request was parked for a round meanwhile
/// (its deadline is then the asker's thread's to watch).
pub(crate) fn lend_for(asker: &SharedActor, jobs: Vec<LendJob>) -> bool {
    let mut parked = false;
    for LendJob {
        asker: stream,
        pending,
        ask,
        lenders,
    } in jobs
    {
        let lent = (lenders.iter())
            .find_map(|lender| lender.seat.lend(&ask).map(|lent| (lender.stream, lent)));
        parked |= back_to_asker(asker, stream, pending, lent);
    }
    parked
}

/// Whether a stream's actor still serves (not stopping, stopped or
/// failed).
fn runs(actor: &StreamActor) -> bool {
    actor.shared().is_running()
}

/// The asker's turn after its lenders: `lent` answers the request, or it
/// goes on as it would have without lending. Whether it parked for a
/// round (or the turn failed: the asker's thread ends the stream).
fn back_to_asker(
    asker: &SharedActor,
    stream: StreamId,
    pending: Pending,
    lent: Option<(StreamId, Allocations)>,
) -> bool {
    let mut turn = asker.turn();
    let Some(actor) = turn.as_mut().filter(|actor| runs(actor)) else {
        // Refused as anything sent after its end (what was lent drops,
        // back to its lender).
        let refusal = match turn.as_ref() {
            Some(actor) => actor.shared().refusal(),
            None => super::ServiceError::StreamStopped(stream),
        };
        pending.answer(Err(refusal));
        return false;
    };
    let parked_before = actor.parked();
    guarded(actor, |actor| {
        actor.drain_control();
        match lent {
            Some((lender, allocations)) => {
                actor.tell(SupervisorEvent::Lent {
                    stream,
                    lender,
                    bytes: super::message::requested(&pending.sizes),
                });
                actor.answer_borrowed(pending, allocations);
            }
            None => actor.go_on_unlent(pending),
        }
        actor.drain_control();
        actor.parked() > parked_before
    })
    .unwrap_or(true)
}
