//! A request's round trip: served in place or sent, then waited for; the
//! error a stream that no longer answers gives.

use super::super::error::ServiceError;
use super::super::message::Request;
use super::super::protocol::{Allocations, Answer, Reply};
use super::StreamHandle;
use crate::sync::atomic::{AtomicPtr, Ordering};
use crate::sync::reply::ReplyCell;
use std::time::Duration;

/// How often a caller waiting for an answer looks whether the actor left.
const EXIT_POLL: Duration = Duration::from_millis(10);

/// A reservation's answer.
pub(super) type Batch = Result<Allocations, ServiceError>;
/// One kept reply cell, taken and put back without a lock: a swap to take
/// it (a second concurrent call on the same clone finds the slot empty and
/// makes a cell of its own), a CAS from null to put it back (the loser's box
/// is dropped). The box is reused, so keeping costs no allocation after the
/// first call.
#[derive(Debug, Default)]
pub(super) struct ReplySlot(AtomicPtr<ReplyCell<Batch>>);

impl ReplySlot {
    fn take(&self) -> Option<Box<ReplyCell<Batch>>> {
        let raw = self.0.swap(std::ptr::null_mut(), Ordering::Acquire);
        // SAFETY: a non-null slot holds a box `put` leaked, and the swap
        // made this thread its only owner.
        (!raw.is_null()).then(|| unsafe { Box::from_raw(raw) })
    }

    fn put(&self, reply: Box<ReplyCell<Batch>>) {
        let raw = Box::into_raw(reply);
        if self
            .0
            .compare_exchange(
                std::ptr::null_mut(),
                raw,
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_err()
        {
            // SAFETY: `raw` was leaked just above and stored nowhere.
            drop(unsafe { Box::from_raw(raw) });
        }
    }
}

impl Drop for ReplySlot {
    fn drop(&mut self) {
        drop(self.take());
    }
}

impl StreamHandle {
    /// The error for a stream that no longer answers: failed or stopped.
    pub(super) fn terminal_error(&self) -> ServiceError {
        let shared = &self.connection.shared;
        // The actor sets its final state right after its loop ends; a
        // caller whose request went unanswered (dropped as a panicking
        // actor unwound) can see that first, and waits for the state:
        // yields, then sleeps, since the panic hook may be printing a
        // backtrace meanwhile (tens of milliseconds). Bounded, so a caller
        // never hangs on a state that never comes.
        for attempt in 0..1000 {
            if !shared.is_running() {
                break;
            }
            if attempt < 100 {
                crate::sync::thread::yield_now();
            } else {
                crate::sync::thread::sleep(Duration::from_millis(1));
            }
        }
        shared.refusal()
    }

    /// Send a request and block for its answer.
    pub(crate) fn call<T>(
        &self,
        make: impl FnOnce(Answer<T>) -> Request,
    ) -> Result<T, ServiceError> {
        self.send_and_wait(make, &mut ReplyCell::new())
            .unwrap_or_else(|| Err(self.terminal_error()))
    }

    /// [`call`](Self::call) for a reservation, on the reply cell kept from
    /// an earlier call when there is one.
    pub(super) fn call_reserve(&self, make: impl FnOnce(Answer<Allocations>) -> Request) -> Batch {
        let mut cell = self.replies.take().unwrap_or_default();
        let answer = self.send_and_wait(make, &mut cell);
        self.replies.put(cell);
        answer.unwrap_or_else(|| Err(self.terminal_error()))
    }

    /// Send the request `make` builds around a sender of `cell`, and wait
    /// for its answer; `None` when the stream is gone and no answer will
    /// come.
    fn send_and_wait<T>(
        &self,
        make: impl FnOnce(Answer<T>) -> Request,
        cell: &mut ReplyCell<Result<T, ServiceError>>,
    ) -> Option<Result<T, ServiceError>> {
        let mut request = make(Reply::Waiter(cell.reply_to()));
        let shared = &self.connection.shared;
        if let Some(actor) = &self.connection.actor {
            match actor.serve_in_place(request, &self.connection) {
                Ok(()) => return self.wait_for(cell),
                Err(refused) => request = refused,
            }
        }
        if let Err(request) = self.connection.send(request) {
            // The stream is gone: the refused request answers its caller
            // itself (a bind's hands its reservation back that way).
            request.reject(self.terminal_error());
        } else if shared.has_exited() {
            // Sent past the actor's last look: ours is among the leftovers,
            // and refused it answers in the cell (`StreamShared::set_exited`).
            shared.refuse_leftovers(&self.terminal_error());
        }
        self.wait_for(cell)
    }

    /// The answer to the request sent with a sender of `cell`; `None`
    /// when the stream is gone and no answer will come.
    fn wait_for<T>(
        &self,
        cell: &mut ReplyCell<Result<T, ServiceError>>,
    ) -> Option<Result<T, ServiceError>> {
        let shared = &self.connection.shared;
        cell.wait(&self.connection.spin, EXIT_POLL, || {
            // A request that reached the inbox just as the actor left is
            // never answered; the exit flag says so, and refused from the
            // leftovers, ours answers before the wait gives up.
            let gone = shared.has_exited();
            if gone {
                shared.refuse_leftovers(&self.terminal_error());
            }
            gone
        })
    }
}
