//! What says a CUDA stream's work before a batch of give-backs is done:
//! the event a `CudaStorage` records at its flush (`docs/memory.md`,
//! "Memory goes back in stream order"). Memory other streams used waits
//! for their fences in the manager before it is given back (`uses.rs`).

use super::DriverOps;
use cudarc::driver::result;
use cudarc::driver::sys::CUevent;

/// What says the work that may touch a batch of give-backs is done: an
/// event recorded on the storage's stream at the flush that sealed it.
#[derive(Debug)]
pub(super) struct CudaFence {
    /// Its own stream's event first.
    pub(super) events: Vec<CUevent>,
}

impl CudaFence {
    /// Whether every event has passed (asked, never waited for; the first
    /// query is counted by `GiveBack::ready`, the others here).
    pub(super) fn passed(&self, ops: &mut DriverOps) -> bool {
        self.events.iter().enumerate().all(|(at, &event)| {
            if at > 0 {
                ops.event_queried();
            }
            // SAFETY: recorded by `flush`, destroyed only
            // in `destroy`.
            unsafe { result::event::query(event) }.is_ok()
        })
    }

    /// Destroy the events once they passed (or were waited for: `wait`,
    /// each counted as an event waited for but the stream's own, which
    /// the caller waited for with the stream).
    pub(super) fn destroy(self, wait: bool, ops: &mut DriverOps) {
        for (at, event) in self.events.into_iter().enumerate() {
            // SAFETY: each event is destroyed once, here.
            unsafe {
                if wait && at > 0 {
                    ops.event_waited();
                    let _ = result::event::synchronize(event);
                }
                let _ = result::event::destroy(event);
            }
        }
    }
}
