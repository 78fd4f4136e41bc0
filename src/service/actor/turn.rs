//! A turn on a stream's actor: the seat its thread and its clients take
//! in turns (`in_place.rs`), and what a turn that panics leaves behind.

use super::StreamActor;
use crate::service::seat::Seat;

/// A stream's actor, shared by its thread and its clients; `None` once the
/// thread took it to end the stream.
pub(crate) type SharedActor = Seat<Option<StreamActor>>;

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
            actor.shared().set_failed(panic_message(panic.as_ref()));
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
