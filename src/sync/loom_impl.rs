//! The model-checked primitives, used under `--cfg streamalloc_loom`.

pub(crate) use loom::sync::Arc;
pub(crate) mod atomic {
    pub(crate) use loom::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
}

pub(crate) mod cell {
    pub(crate) use loom::cell::UnsafeCell;
}

/// loom's mutex with the poison-free `lock` of the production side.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        // A loom model that panics while holding the lock fails anyway.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The production side's yield-free mutex; under loom, loom's mutex.
pub(crate) type TurnLock<T> = Mutex<T>;

pub(crate) mod thread {
    pub(crate) use loom::thread::{JoinHandle, Thread, current, yield_now};

    /// Time is not modelled: a timed park waits for its unpark (a model
    /// that needs the timeout to make progress deadlocks, and fails).
    pub(crate) fn park_timeout(_: std::time::Duration) {
        loom::thread::park();
    }

    /// Time is not modelled: a sleep is a yield.
    pub(crate) fn sleep(_: std::time::Duration) {
        loom::thread::yield_now();
    }

    /// Spawn a loom thread (names are not modelled).
    pub(crate) fn spawn<F, T>(_name: String, f: F) -> std::io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        Ok(loom::thread::spawn(f))
    }
}

pub(crate) mod channel {
    //! A small Mutex + Condvar channel: crossbeam and flume are not
    //! loom-aware. Time is not modelled, so a receive with a timeout is a
    //! plain receive (a timeout never fires), which keeps models finite.
    use loom::sync::{Arc, Condvar, Mutex};
    use std::collections::VecDeque;
    use std::time::Duration;

    #[derive(Debug)]
    struct State<T> {
        queue: VecDeque<T>,
        senders: usize,
        receiver: bool,
    }

    #[derive(Debug)]
    struct Shared<T> {
        state: Mutex<State<T>>,
        changed: Condvar,
        capacity: Option<usize>,
    }

    /// Sending half.
    #[derive(Debug)]
    pub(crate) struct Sender<T>(Arc<Shared<T>>);
    /// Receiving half.
    #[derive(Debug)]
    pub(crate) struct Receiver<T>(Arc<Shared<T>>);

    fn channel<T>(capacity: Option<usize>) -> (Sender<T>, Receiver<T>) {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                senders: 1,
                receiver: true,
            }),
            changed: Condvar::new(),
            capacity,
        });
        (Sender(shared.clone()), Receiver(shared))
    }

    pub(crate) fn bounded<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
        channel(Some(capacity.max(1)))
    }

    pub(crate) fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
        channel(None)
    }

    #[derive(Debug)]
    pub(crate) enum TrySendError<T> {
        Full(T),
        Disconnected(T),
    }

    #[derive(Debug, PartialEq, Eq)]
    pub(crate) enum RecvError {
        Empty,
        Disconnected,
    }

    impl<T> Clone for Sender<T> {
        fn clone(&self) -> Self {
            self.0.state.lock().unwrap().senders += 1;
            Self(self.0.clone())
        }
    }

    impl<T> Drop for Sender<T> {
        fn drop(&mut self) {
            self.0.state.lock().unwrap().senders -= 1;
            self.0.changed.notify_all();
        }
    }

    impl<T> Drop for Receiver<T> {
        fn drop(&mut self) {
            let mut state = self.0.state.lock().unwrap();
            state.receiver = false;
            // Messages left behind drop here, as crossbeam's do.
            let _left: Vec<T> = state.queue.drain(..).collect();
            drop(state);
            self.0.changed.notify_all();
        }
    }

    impl<T> Sender<T> {
        pub(crate) fn send(&self, value: T) -> Result<(), T> {
            let mut state = self.0.state.lock().unwrap();
            loop {
                if !state.receiver {
                    return Err(value);
                }
                if self.0.capacity.is_none_or(|cap| state.queue.len() < cap) {
                    state.queue.push_back(value);
                    drop(state);
                    self.0.changed.notify_all();
                    return Ok(());
                }
                state = self.0.changed.wait(state).unwrap();
            }
        }

        pub(crate) fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
            let mut state = self.0.state.lock().unwrap();
            if !state.receiver {
                return Err(TrySendError::Disconnected(value));
            }
            if self.0.capacity.is_some_and(|cap| state.queue.len() >= cap) {
                return Err(TrySendError::Full(value));
            }
            state.queue.push_back(value);
            drop(state);
            self.0.changed.notify_all();
            Ok(())
        }
    }

    impl<T> Receiver<T> {
        pub(crate) fn recv(&self) -> Result<T, RecvError> {
            let mut state = self.0.state.lock().unwrap();
            loop {
                if let Some(value) = state.queue.pop_front() {
                    drop(state);
                    self.0.changed.notify_all();
                    return Ok(value);
                }
                if state.senders == 0 {
                    return Err(RecvError::Disconnected);
                }
                state = self.0.changed.wait(state).unwrap();
            }
        }

        /// Whether nothing waits to be received (a look, no receive).
        pub(crate) fn is_empty(&self) -> bool {
            self.0.state.lock().unwrap().queue.is_empty()
        }

        pub(crate) fn try_recv(&self) -> Result<T, RecvError> {
            let mut state = self.0.state.lock().unwrap();
            match state.queue.pop_front() {
                Some(value) => {
                    drop(state);
                    self.0.changed.notify_all();
                    Ok(value)
                }
                None if state.senders == 0 => Err(RecvError::Disconnected),
                None => Err(RecvError::Empty),
            }
        }

        pub(crate) fn recv_timeout(&self, _timeout: Duration) -> Result<T, RecvError> {
            self.recv()
        }
    }
}
