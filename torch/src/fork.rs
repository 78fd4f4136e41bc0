//! Whether this is still the process a library was made in, asked at
//! every call without a system call. `getpid` is one (glibc no longer
//! caches the pid): a tenth of what a malloc and a free through the
//! library cost. Instead a child handler registered once with
//! `pthread_atfork` counts the forks, and a library compares the count it
//! was made at with the count now: a child after `fork` (a data-loader
//! worker) sees one more.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Forks that led to this process (since the handler was registered).
static FORKS: AtomicU64 = AtomicU64::new(0);
/// Whether the handler is registered (else the pid is asked, as before).
static COUNTING: AtomicBool = AtomicBool::new(false);
static REGISTER: Once = Once::new();

/// Runs in the child of every `fork`, before `fork` returns there: one
/// atomic add, which is async-signal-safe.
extern "C" fn in_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// The process a library was made in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Process {
    forks: u64,
    pid: u32,
}

impl Process {
    /// This process, now.
    pub(crate) fn this() -> Self {
        REGISTER.call_once(|| {
            // SAFETY: registers a handler that only adds to an atomic.
            let registered = unsafe { libc::pthread_atfork(None, None, Some(in_child)) } == 0;
            COUNTING.store(registered, Ordering::Release);
        });
        Self {
            forks: FORKS.load(Ordering::Relaxed),
            pid: std::process::id(),
        }
    }

    /// Whether the calling process is this one (not a child forked since).
    /// The handler ran in the calling thread before `fork` returned, so
    /// its count is seen without ordering.
    pub(crate) fn is_current(&self) -> bool {
        if COUNTING.load(Ordering::Relaxed) {
            FORKS.load(Ordering::Relaxed) == self.forks
        } else {
            std::process::id() == self.pid
        }
    }
}
