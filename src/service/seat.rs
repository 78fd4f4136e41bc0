//! Serving in the owner's turn: an owner (a stream's actor, a device's
//! coordinator) behind one lock that its own thread and its callers take in
//! turns. A caller that finds nothing queued ahead of it serves its own work
//! on its thread, as the owner's thread would, instead of a round trip of
//! two thread handoffs; otherwise it queues the work for the owner's thread.
//! Whoever holds the turn is the owner for that turn (`docs/service.md`,
//! "Serving in place"; models: `loom-tests/in_place.rs`, `tick.rs`).

use crate::sync::TurnLock;

/// An owner served in turns.
#[derive(Debug)]
pub(crate) struct Seat<T>(TurnLock<T>);

impl<T> Seat<T> {
    pub(crate) fn new(owner: T) -> Self {
        Self(TurnLock::new(owner))
    }

    /// Take the owner's turn (its thread's, between requests).
    pub(crate) fn turn(&self) -> impl std::ops::DerefMut<Target = T> + '_ {
        self.0.lock()
    }

    /// Serve `work` in the owner's turn on this thread when `idle` says
    /// nothing is queued ahead of it, the two in one turn (so nothing can
    /// be queued between the look and the work); `work` back otherwise, for
    /// the owner's thread. The turn ends before this returns.
    pub(crate) fn serve_in_turn<W, R>(
        &self,
        work: W,
        idle: impl FnOnce(&T) -> bool,
        serve: impl FnOnce(&mut T, W) -> R,
    ) -> Result<R, W> {
        let mut owner = self.0.lock();
        if !idle(&owner) {
            return Err(work);
        }
        Ok(serve(&mut owner, work))
    }

    /// The lock itself, for a loom model that holds a turn across calls.
    #[cfg(streamalloc_loom)]
    pub(crate) fn turn_guard(&self) -> loom::sync::MutexGuard<'_, T> {
        self.0.lock()
    }
}
