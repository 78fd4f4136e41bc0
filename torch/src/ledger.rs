//! What the library has handed out, in calls and bytes, and its peak,
//! counted by every call; and the trace of the calls while one is
//! recorded.
//!
//! Counting takes no lock: two atomics, so that threads calling at once
//! (a program's main thread and its autograd thread) do not queue behind
//! each other. While a trace is recorded, each count and its event are
//! made under the trace's lock, so the trace's order is the order the
//! counts were made in and its replay finds the same peak (a call in
//! flight as recording is switched on may be counted outside it: the trace
//! begins after it).

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use streamalloc::trace::{TraceAction, TraceEvent};

/// The counts every call writes, on a cache line of their own: beside the
/// library's fields that every call only reads (its process, whether it
/// is shut), each write would take those from the other threads' caches.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct Ledger {
    allocations: AtomicU64,
    frees: AtomicU64,
    live: AtomicU64,
    peak: AtomicU64,
    /// Whether `trace` is `Some` (read without its lock).
    recording: AtomicBool,
    trace: Mutex<Option<Vec<TraceEvent>>>,
}

impl Ledger {
    /// A ledger, recording from the start when `record`.
    pub(crate) fn new(record: bool) -> Self {
        Self {
            recording: AtomicBool::new(record),
            trace: Mutex::new(record.then(Vec::new)),
            ..Self::default()
        }
    }

    /// Count an allocation or a free of `size` bytes; `event` makes its
    /// trace event, asked only while recording.
    pub(crate) fn count(&self, action: TraceAction, size: u64, event: impl FnOnce() -> TraceEvent) {
        if !self.recording.load(Ordering::Acquire) {
            self.tally(action, size);
            return;
        }
        let mut trace = self.trace.lock();
        self.tally(action, size);
        if let Some(events) = trace.as_mut() {
            events.push(event());
        }
    }

    fn tally(&self, action: TraceAction, size: u64) {
        if action == TraceAction::Alloc {
            self.allocations.fetch_add(1, Ordering::Relaxed);
            // An allocation is counted before its pointer is returned, so
            // a free (after it, on any thread) never takes off more than
            // was added.
            let live = self
                .live
                .fetch_add(size, Ordering::AcqRel)
                .saturating_add(size);
            self.peak.fetch_max(live, Ordering::AcqRel);
        } else {
            self.frees.fetch_add(1, Ordering::Relaxed);
            self.live.fetch_sub(size, Ordering::AcqRel);
        }
    }

    /// Allocations and frees counted.
    pub(crate) fn calls(&self) -> (u64, u64) {
        (
            self.allocations.load(Ordering::Relaxed),
            self.frees.load(Ordering::Relaxed),
        )
    }

    /// Bytes handed out and not freed.
    pub(crate) fn live(&self) -> u64 {
        self.live.load(Ordering::Acquire)
    }

    /// The most at once.
    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(Ordering::Acquire)
    }

    /// Whether a trace is recorded.
    pub(crate) fn recording(&self) -> bool {
        self.recording.load(Ordering::Acquire)
    }

    /// Start recording (a fresh trace) or stop (the trace goes).
    pub(crate) fn set_recording(&self, on: bool) {
        let mut trace = self.trace.lock();
        match (on, trace.is_some()) {
            (true, false) => *trace = Some(Vec::new()),
            (false, true) => *trace = None,
            _ => {}
        }
        self.recording.store(on, Ordering::Release);
    }

    /// The trace so far, if one is recorded.
    pub(crate) fn trace(&self) -> Option<Vec<TraceEvent>> {
        self.trace.lock().clone()
    }
}
