//! Memory used on streams other than its own (PyTorch's `record_stream`):
//! its free waits until each of them has done the work queued on it when
//! the free came. An event recorded on each such stream at that moment
//! says when; the library asks (`cuEventQuery`, never waiting) at its next
//! calls on the device, and only then gives the memory back to its stream.

use cudarc::driver::result::event;
use cudarc::driver::sys::{self, CUevent};
use cudarc::driver::{CudaContext, DriverError};
use std::sync::Arc;

/// Events recorded on the streams that used one allocation, at its free.
pub(crate) struct Uses {
    events: Vec<CUevent>,
}

// SAFETY: events are plain driver handles, used only with the context
// bound to the calling thread and destroyed once (`Drop`).
unsafe impl Send for Uses {}

impl Uses {
    /// Record an event on each of `streams` (raw `cudaStream_t`s PyTorch
    /// passed) now.
    pub(crate) fn record(
        context: &Arc<CudaContext>,
        streams: &[usize],
    ) -> Result<Self, DriverError> {
        context.bind_to_thread()?;
        let mut uses = Self { events: Vec::new() };
        for &stream in streams {
            let made = event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
            uses.events.push(made);
            // SAFETY: a live stream of this context, as PyTorch passed it
            // to record_stream; the event was just made.
            unsafe { event::record(made, stream as sys::CUstream) }?;
        }
        Ok(uses)
    }

    /// Whether every stream has done what it had queued at the free.
    pub(crate) fn done(&self, context: &Arc<CudaContext>) -> bool {
        if context.bind_to_thread().is_err() {
            return false;
        }
        // SAFETY: each event was made and recorded by `record`.
        self.events
            .iter()
            .all(|&made| unsafe { event::query(made) }.is_ok())
    }
}

impl Drop for Uses {
    fn drop(&mut self) {
        for made in self.events.drain(..) {
            // SAFETY: made by `record`, destroyed once, here.
            let _ = unsafe { event::destroy(made) };
        }
    }
}
