//! The production primitives: `std` atomics, `Arc` and threads,
//! `parking_lot` locks, `crossbeam-channel` channels.

pub(crate) use std::sync::Arc;

/// The reply channel an async caller awaits (flume's, whose receiver is a
/// future). Not under loom: the async forms are compiled out there.
pub(crate) mod async_channel {
    pub(crate) use flume::{Receiver, Sender, bounded};
}

pub(crate) mod atomic {
    pub(crate) use std::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
}

/// `UnsafeCell` with loom's closure API (`with`, `with_mut`), so code that
/// owns a cell's contents through an atomic protocol is model-checked too.
pub(crate) mod cell {
    #[derive(Debug, Default)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

/// A mutex whose `lock` never reports poisoning (a panicking holder does not
/// make the data unreachable; the actor boundary handles panics).
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(parking_lot::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, T> {
        self.0.lock()
    }

    /// The value, the mutex consumed.
    pub(crate) fn into_inner(self) -> T {
        self.0.into_inner()
    }
}

/// A mutex that waits without yielding: `std`'s, which on Linux spins a
/// hundred times and then sleeps on a futex. `parking_lot`'s spins with
/// `sched_yield` between attempts before it parks; for a stream's turns,
/// taken by several clients at once, that cost 1.6x the time idle
/// (`service/in_place.rs`; `git show d502a2e:docs/performance.md`,
/// "Serving in place").
#[derive(Debug, Default)]
pub(crate) struct TurnLock<T>(std::sync::Mutex<T>);

impl<T> TurnLock<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(std::sync::Mutex::new(value))
    }

    /// The guard; a panic in an earlier holder does not poison it (turns
    /// catch their panics and mark the stream failed themselves).
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

pub(crate) mod thread {
    pub(crate) use std::thread::{JoinHandle, Thread, current, park_timeout, sleep, yield_now};

    /// Spawn a named thread.
    pub(crate) fn spawn<F, T>(name: String, f: F) -> std::io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        std::thread::Builder::new().name(name).spawn(f)
    }
}

pub(crate) mod channel {
    //! Thin wrappers giving crossbeam's channels the API the loom side has.
    use std::time::Duration;

    /// Sending half.
    #[derive(Debug)]
    pub(crate) struct Sender<T>(crossbeam_channel::Sender<T>);
    /// Receiving half.
    #[derive(Debug)]
    pub(crate) struct Receiver<T>(crossbeam_channel::Receiver<T>);

    impl<T> Clone for Sender<T> {
        fn clone(&self) -> Self {
            Self(self.0.clone())
        }
    }

    /// A channel holding at most `capacity` messages.
    pub(crate) fn bounded<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
        let (tx, rx) = crossbeam_channel::bounded(capacity);
        (Sender(tx), Receiver(rx))
    }

    /// A channel that never blocks its senders.
    pub(crate) fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        (Sender(tx), Receiver(rx))
    }

    /// Why a `try_send` did not deliver; the message comes back.
    #[derive(Debug)]
    pub(crate) enum TrySendError<T> {
        /// The channel is full.
        Full(T),
        /// The receiver is gone.
        Disconnected(T),
    }

    /// Why a receive returned nothing.
    #[derive(Debug, PartialEq, Eq)]
    pub(crate) enum RecvError {
        /// Nothing arrived (in time).
        Empty,
        /// Every sender is gone and the channel is empty.
        Disconnected,
    }

    impl<T> Sender<T> {
        /// Block until there is room; the message comes back if the receiver is gone.
        pub(crate) fn send(&self, value: T) -> Result<(), T> {
            self.0.send(value).map_err(|err| err.0)
        }

        pub(crate) fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
            self.0.try_send(value).map_err(|err| match err {
                crossbeam_channel::TrySendError::Full(v) => TrySendError::Full(v),
                crossbeam_channel::TrySendError::Disconnected(v) => TrySendError::Disconnected(v),
            })
        }
    }

    impl<T> Receiver<T> {
        pub(crate) fn recv(&self) -> Result<T, RecvError> {
            self.0.recv().map_err(|_| RecvError::Disconnected)
        }

        /// Whether nothing waits to be received (a look, no receive).
        pub(crate) fn is_empty(&self) -> bool {
            self.0.is_empty()
        }

        pub(crate) fn try_recv(&self) -> Result<T, RecvError> {
            self.0.try_recv().map_err(|err| match err {
                crossbeam_channel::TryRecvError::Empty => RecvError::Empty,
                crossbeam_channel::TryRecvError::Disconnected => RecvError::Disconnected,
            })
        }

        pub(crate) fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvError> {
            self.0.recv_timeout(timeout).map_err(|err| match err {
                crossbeam_channel::RecvTimeoutError::Timeout => RecvError::Empty,
                crossbeam_channel::RecvTimeoutError::Disconnected => RecvError::Disconnected,
            })
        }
    }
}
