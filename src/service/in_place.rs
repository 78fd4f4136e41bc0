//! Serving in place: the stream's actor behind one lock, taken in turns by
//! its own thread and by clients that serve their own requests.
//!
//! A request through the actor's thread is a round trip: two handoffs
//! between threads, each a context switch when the thread on the other side
//! parked, which costs 5-10 us on a machine whose other cores are busy
//! (`docs/performance.md`). A client that finds the actor free does better to
//! take the actor's turn itself: it locks the actor, serves its reservation
//! or job on its own thread exactly as the actor's thread would (the same
//! `StreamActor::serve`, control traffic drained before and after), and
//! unlocks. That is the cost of a lock, and the actor still serves one
//! request at a time: whoever holds the lock is the actor for that turn.
//!
//! What stays with the actor's thread: its inbox (async callers, shutdown,
//! wake-ups, refills ahead), the polling of parked requests'
//! deadlines, and the stream's end. A request served in place that parks
//! (the device is short) wakes the thread, which watches the parked
//! requests from then on; the answer comes to the caller's reply cell as
//! it would have. A panic in a turn taken in place marks the stream failed
//! before the lock is let go (no other turn sees a half-served actor) and
//! wakes the thread, which ends the stream as after its own panic.
//!
//! The protocol and what each side may assume: `docs/service.md`, "Serving
//! in place"; model: `loom-tests/in_place.rs`.

use super::actor::StreamActor;
use super::handle::Connection;
use super::message::Request;
use crate::sync::TurnLock;
use crate::sync::atomic::Ordering;

/// A stream's actor, shared by its thread and its clients; `None` once the
/// thread took it to end the stream.
#[derive(Debug)]
pub(crate) struct SharedActor(TurnLock<Option<StreamActor>>);

impl SharedActor {
    pub(crate) fn new(actor: StreamActor) -> Self {
        Self(TurnLock::new(Some(actor)))
    }

    /// Take the actor's turn: the actor, or `None` once the stream ended.
    pub(crate) fn turn(&self) -> impl std::ops::DerefMut<Target = Option<StreamActor>> + '_ {
        self.0.lock()
    }

    /// The lock itself, for a loom model that holds a turn across calls.
    #[cfg(streamalloc_loom)]
    pub(crate) fn turn_guard(&self) -> loom::sync::MutexGuard<'_, Option<StreamActor>> {
        self.0.lock()
    }

    /// Serve `request` on this thread, as the actor's thread would, when it
    /// is a reservation, a job or a barrier and the stream is running; the
    /// request back otherwise (the caller sends it). Served, its answer is
    /// in its reply, or it parked (the device is short) and the answer
    /// comes as it would through the inbox.
    pub(crate) fn serve_in_place(
        &self,
        request: Request,
        connection: &Connection,
    ) -> Result<(), Request> {
        // A barrier too: with nothing queued, control drained in the turn
        // is everything that came before it.
        if !matches!(
            request,
            Request::ReserveMany { .. } | Request::Run(_) | Request::Barrier { .. }
        ) {
            return Err(request);
        }
        let mut turn = self.0.lock();
        let Some(actor) = turn.as_mut() else {
            return Err(request);
        };
        // Both under the lock. A shutdown marks the stream stopping in its
        // own turn, so no turn after it serves anything; and a request this
        // client sent before (a refill ahead) is counted until the turn
        // that served it, so this one goes after it, through the inbox.
        if !actor.shared.is_running() || actor.shared.queued.load(Ordering::Relaxed) > 0 {
            return Err(request);
        }
        let parked = actor.parked.len();
        let served = guarded(actor, |actor| {
            actor.drain_control();
            if !matches!(request, Request::Barrier { .. }) {
                super::shared::bump(&actor.shared.served_in_place, 1);
            }
            actor.serve(request);
            actor.drain_control();
            actor.parked.len() > parked
        });
        drop(turn);
        if served != Some(false) {
            // Parked: the thread polls the request's deadline from now on.
            // Failed: the thread ends the stream.
            connection.wake();
        }
        Ok(())
    }
}

/// Run one turn on the actor; a panic inside marks the stream failed while
/// the turn's lock is still held, so no other turn serves a half-changed
/// actor, and gives `None`.
pub(crate) fn guarded<R>(
    actor: &mut StreamActor,
    turn: impl FnOnce(&mut StreamActor) -> R,
) -> Option<R> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| turn(&mut *actor))) {
        Ok(value) => Some(value),
        Err(panic) => {
            actor.shared.set_failed(panic_message(panic.as_ref()));
            None
        }
    }
}

/// What a panic said.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "the stream actor panicked".into())
}
