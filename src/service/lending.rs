//! Lending between streams, run by whoever served the asker's request,
//! between turns (`docs/service.md`, "Serving another stream").
//!
//! A request past the device's headroom that its stream's own room cannot
//! serve leaves the asker's turn as a [`LendJob`]: the request with the
//! streams that may serve it from their room (the *lenders*, the roomiest
//! first). Once that turn is over, the thread that took it (a client
//! serving in place, or the asker's own thread) takes each lender's turn
//! in order, as any client of that stream would, until one serves it; then
//! the asker's turn again, to answer the request with the loan or, when
//! none lent, to go on as before the loan was tried (a round, or growth).
//!
//! No turn waits for another: a job holds one stream's turn at a time, and
//! never its own asker's while it waits for a lender's. Two streams asking
//! each other at once each wait for one lock only, never held across.

use super::actor::StreamActor;
use super::coordinator::{room_of_others, roomiest_first};
use super::events::SupervisorEvent;
use super::in_place::{SharedActor, guarded};
use super::message::Pending;
use super::protocol::{Allocations, LendAsk};
use super::registry::StreamEntry;
use crate::memory::StreamId;
use crate::sync::Arc;
use std::collections::BTreeMap;

/// A request past the headroom asks at most this many streams, the
/// roomiest first, to serve it from their room before a round asks any to
/// give back: past the second, a stream's room rarely holds a block the
/// first two lacked, and each ask is a turn of its own.
pub(crate) const MAX_LENDERS: usize = 2;

/// A request past the headroom, out of its stream's turn to be served by
/// another stream's room.
#[derive(Debug)]
pub(crate) struct LendJob {
    /// The asking stream.
    pub(crate) asker: StreamId,
    /// The request (`PendingState::ParkedForHeadroom`).
    pub(crate) pending: Pending,
    /// What a lender serves of it.
    pub(crate) ask: LendAsk,
    /// The streams asked, in order.
    pub(crate) lenders: Vec<Lender>,
}

/// A stream asked to lend, and its actor's seat.
#[derive(Debug)]
pub(crate) struct Lender {
    pub(crate) stream: StreamId,
    pub(crate) seat: Arc<SharedActor>,
}

/// The streams that may serve `ask` for `asker`, in order: those whose
/// room their clients do not use holds the request, the roomiest first
/// (ties by stream, so every run asks the same), at most [`MAX_LENDERS`].
/// Room is not a block: a lender whose free room is in pieces refuses,
/// and the next is asked.
pub(crate) fn lenders(
    streams: &BTreeMap<StreamId, StreamEntry>,
    asker: StreamId,
    ask: &LendAsk,
) -> Vec<Lender> {
    let requested = super::message::requested(&ask.sizes);
    let mut room = room_of_others(streams, asker, requested);
    roomiest_first(&mut room);
    room.into_iter()
        .take(MAX_LENDERS)
        .map(|(_, stream)| Lender {
            stream,
            seat: streams[&stream].seat.clone(),
        })
        .collect()
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
        let lent = lenders
            .iter()
            .find_map(|lender| lend_from(lender, &ask).map(|lent| (lender.stream, lent)));
        parked |= back_to_asker(asker, stream, pending, lent);
    }
    parked
}

/// One lender's turn: what it served of `ask` from its room, or `None`
/// (refused, stopped, failed).
fn lend_from(lender: &Lender, ask: &LendAsk) -> Option<Allocations> {
    let mut turn = lender.seat.turn();
    let actor = turn.as_mut().filter(|actor| {
        let shared = actor.shared();
        shared.is_running() && !shared.has_failed()
    })?;
    guarded(actor, |actor| {
        // Control sent before this turn is served first, as in any turn.
        actor.drain_control();
        let lent = actor.lend(ask);
        actor.drain_control();
        lent
    })
    .flatten()
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
    let Some(actor) = turn
        .as_mut()
        .filter(|actor| actor.shared().is_running() && !actor.shared().has_failed())
    else {
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
    guarded(actor, |actor: &mut StreamActor| {
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
