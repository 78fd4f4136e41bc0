//! The model-checked primitives, used under `--cfg streamalloc_loom`.

pub(crate) use loom::sync::Arc;
pub(crate) mod atomic {
    pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
}

/// loom's mutex with the poison-free `lock` of the production side.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

impl<T> Mutex<T> {
    #[allow(dead_code)] // the service's locks use it
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
