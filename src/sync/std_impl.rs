//! The production primitives: `std` atomics and `Arc`, `parking_lot` locks.

pub(crate) use std::sync::Arc;
pub(crate) mod atomic {
    pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
}

/// A mutex whose `lock` never reports poisoning (a panicking holder does not
/// make the data unreachable; the actor boundary handles panics).
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

impl<T> Mutex<T> {
    #[allow(dead_code)] // the service's locks use it
    pub(crate) fn new(value: T) -> Self {
        Self(parking_lot::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, T> {
        self.0.lock()
    }
}
