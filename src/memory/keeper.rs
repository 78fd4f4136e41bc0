//! Where a retired manager waits for its last pin (the protocol is in
//! `manager/retire.rs`): one per release queue, which every cell of the
//! manager reaches, so the last unpin finds it.

use crate::sync::Mutex;
use crate::sync::atomic::{AtomicUsize, Ordering};
use std::fmt;

/// What returns the pages a retired manager kept for its pins.
pub(crate) type Keep = Box<dyn FnOnce() + Send>;

/// Where a retired manager waits for its last pin (one per release queue,
/// which every cell of the manager reaches).
#[derive(Default)]
pub(crate) struct PinKeeper {
    /// Orphaned cells still pinned, plus one while the owner hands over.
    holds: AtomicUsize,
    /// Frees the kept pages; run by whoever takes `holds` to zero.
    pub(crate) keep: Mutex<Option<Keep>>,
}

impl fmt::Debug for PinKeeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinKeeper")
            .field("holds", &self.holds.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl PinKeeper {
    /// The last pin of an orphaned cell dropped.
    pub(crate) fn unpinned(&self) {
        self.let_go();
    }

    pub(crate) fn hold(&self) {
        self.holds.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn let_go(&self) {
        if self.holds.fetch_sub(1, Ordering::SeqCst) == 1 {
            let keep = self.keep.lock().take();
            if let Some(keep) = keep {
                keep();
            }
        }
    }
}
