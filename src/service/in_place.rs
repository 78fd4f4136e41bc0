//! Serving in place: the stream's actor behind one lock, taken in turns by
//! its own thread and by clients that serve their own requests.
//!
//! The long form: `docs/modules.md`, "`src/service/in_place.rs`".

use super::actor::{Flow, SharedActor, StreamActor, guarded};
use super::handle::{Connection, ServeInPlace};
use super::lending::lend_for;
use super::message::Request;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use crate::sync::channel::{Receiver, RecvError};
use crate::sync::reply::AdaptiveSpin;
use std::time::Duration;

/// How often an actor whose parked requests wait for a deadline (or for a
/// round's safety net) looks at the clock again.
const PARK_POLL: Duration = Duration::from_millis(2);

impl ServeInPlace for Arc<SharedActor> {
    /// Serve `request` on this thread, as the actor's thread would, when it
    /// is a reservation, a job or a barrier and the stream is running; the
    /// request back otherwise (the caller sends it). Served, its answer is
    /// in its reply, or it parked (the device is short) and the answer
    /// comes as it would through the inbox.
    fn serve_in_place(&self, request: Request, connection: &Connection) -> Result<(), Request> {
        // A barrier too: with nothing queued, control drained in the turn
        // is everything that came before it.
        if !matches!(
            request,
            Request::ReserveMany { .. } | Request::Run(_) | Request::Barrier { .. }
        ) {
            return Err(request);
        }
        // In one turn. A shutdown marks the stream stopping in its own
        // turn, so no turn after it serves anything; and a request this
        // client sent before (a refill ahead) is counted until the turn
        // that served it, so this one goes after it, through the inbox.
        let idle = |actor: &Option<StreamActor>| {
            actor.as_ref().is_some_and(|actor| {
                let shared = actor.shared();
                shared.is_running() && shared.queued.load(Ordering::Relaxed) == 0
            })
        };
        let served = self.serve_in_turn(request, idle, |actor, request| {
            let actor = actor.as_mut().expect("idle: the actor is there");
            let parked = actor.parked();
            guarded(actor, |actor| {
                actor.drain_control();
                if !matches!(request, Request::Barrier { .. }) {
                    super::shared::bump(&actor.shared().served_in_place, 1);
                }
                actor.serve(request);
                actor.drain_control();
                (actor.parked() > parked, actor.take_lend_jobs())
            })
        })?;
        // A request past the headroom another stream may lend for: its
        // lenders' turns, then the asker's again, now this one is over.
        let parked = match served {
            Some((parked, jobs)) if !jobs.is_empty() => parked | lend_for(self, jobs),
            Some((parked, _)) => parked,
            None => true,
        };
        if parked {
            // Parked: the thread polls the request's deadline from now on.
            // Failed: the thread ends the stream.
            connection.wake();
        }
        Ok(())
    }
}

/// The loop of a stream's thread: serve its inbox until shut down or every
/// handle is gone, taking the actor's turn for each request (clients
/// serving in place take it between); a panic in a turn marks the stream
/// failed (its clients get `StreamFailed`, never a hang).
pub(crate) fn run(seat: Arc<SharedActor>, inbox: Receiver<Request>) {
    let spin = match seat.turn().as_ref() {
        Some(actor) => AdaptiveSpin::new(actor.spin()),
        None => return,
    };
    let in_hand = serve(&seat, &inbox, &spin);
    if let Some(actor) = seat.turn().take() {
        actor.end(in_hand, inbox);
    }
}

/// Serve until the stream stops (a shutdown, a failed turn) or every
/// sender is gone; a request received but not served (the stream failed
/// in a turn taken in place meanwhile) comes back, to be refused.
fn serve(seat: &SharedActor, inbox: &Receiver<Request>, spin: &AdaptiveSpin) -> Option<Request> {
    while let Some(request) = next(seat, inbox, spin) {
        let mut turn = seat.turn();
        let Some(actor) = turn.as_mut().filter(|actor| !actor.shared().has_failed()) else {
            return Some(request);
        };
        let flow = guarded(actor, |actor| {
            actor.drain_control();
            let flow = actor.handle(request, inbox);
            if flow == Flow::Continue {
                actor.drain_control();
            }
            (flow, actor.take_lend_jobs())
        });
        drop(turn);
        let Some((Flow::Continue, jobs)) = flow else {
            return None;
        };
        if !jobs.is_empty() {
            // Its own thread watches what parked: no wake-up to send.
            lend_for(seat, jobs);
        }
    }
    None
}

/// The next request, `None` once every sender is gone or the stream
/// failed: a short adaptive spin (`sync/reply.rs`), then a blocking
/// receive, which parks the thread until a sender wakes it, so an idle
/// stream costs no CPU. Control traffic and parked requests are served in
/// turns of their own meanwhile.
fn next(seat: &SharedActor, inbox: &Receiver<Request>, spin: &AdaptiveSpin) -> Option<Request> {
    // Releases are not taken while waiting: which of a client's drops
    // would land before the next request would then be a race, and
    // placement (and so a replay) would differ from run to run. Every
    // request takes them first, all at once.
    let mut received = None;
    spin.spin(|| match inbox.try_recv() {
        Ok(request) => {
            received = Some(Some(request));
            true
        }
        Err(RecvError::Disconnected) => {
            received = Some(None);
            true
        }
        Err(RecvError::Empty) => false,
    });
    if let Some(received) = received {
        return received;
    }
    loop {
        let polls = idle_turn(seat, |actor| {
            actor.drain_control();
            actor.polls_parked()
        })?;
        let received = if polls {
            inbox.recv_timeout(PARK_POLL)
        } else {
            inbox.recv()
        };
        match received {
            Ok(request) => return Some(request),
            Err(RecvError::Disconnected) => return None,
            Err(RecvError::Empty) => idle_turn(seat, |actor| actor.retry_parked(false))?,
        }
    }
}

/// A turn of the thread's own between requests; `None` when the stream
/// failed (in this turn or an earlier one).
fn idle_turn<R>(seat: &SharedActor, turn: impl FnOnce(&mut StreamActor) -> R) -> Option<R> {
    let mut seat = seat.turn();
    let actor = seat.as_mut().filter(|actor| !actor.shared().has_failed())?;
    guarded(actor, turn)
}
