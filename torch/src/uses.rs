//! Memory used on streams other than its own (PyTorch's `record_stream`):
//! its free waits until each of them has done the work queued on it when
//! the free came. An event recorded on each such stream at that moment
//! says when; the library asks (`cuEventQuery`, never waiting) at its next
//! calls on the device, and only then gives the memory back to its stream.

use cudarc::driver::result::event;
use cudarc::driver::sys::{self, CUevent};
use cudarc::driver::{CudaContext, DriverError};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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

/// The frees waiting on one stream, oldest first.
type Queue<T> = VecDeque<(Uses, T)>;

/// A device's frees that wait for the streams that used their memory: a
/// queue per stream (the first that used each), in the order they came.
pub(crate) struct Waiting<T> {
    /// (stream, its queue).
    queues: Mutex<Vec<(usize, Queue<T>)>>,
    /// How many wait: the calls of a program that never records a stream
    /// find none without taking the lock.
    count: AtomicUsize,
}

impl<T> Default for Waiting<T> {
    fn default() -> Self {
        Self {
            queues: Mutex::new(Vec::new()),
            count: AtomicUsize::new(0),
        }
    }
}

impl<T> Waiting<T> {
    /// `held` waits for `uses`, recorded on `stream` first.
    pub(crate) fn push(&self, stream: usize, uses: Uses, held: T) {
        let mut queues = self.queues.lock();
        match queues.iter_mut().find(|(on, _)| *on == stream) {
            Some((_, queue)) => queue.push_back((uses, held)),
            None => queues.push((stream, VecDeque::from([(uses, held)]))),
        }
        self.count.fetch_add(1, Ordering::Release);
    }

    /// Let go of what waited for streams that are done: from each queue,
    /// oldest first, up to the first whose streams are not (a stream runs
    /// its work in order), as PyTorch's caching allocator asks its events.
    /// A call asks at most one event a queue more than it lets go, where
    /// asking every free's events at every call cost calls in proportion
    /// to the frees waiting. What it lets go drops after the lock.
    pub(crate) fn release_finished(&self, context: &Arc<CudaContext>) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut done = Vec::new();
        {
            let mut queues = self.queues.lock();
            for (_, queue) in queues.iter_mut() {
                while queue.front().is_some_and(|(uses, _)| uses.done(context)) {
                    done.extend(queue.pop_front());
                }
            }
            queues.retain(|(_, queue)| !queue.is_empty());
            self.count.fetch_sub(done.len(), Ordering::Release);
        }
        drop(done);
    }

    /// Let go of everything (the device is done: shutdown).
    pub(crate) fn clear(&self) {
        let mut queues = self.queues.lock();
        queues.clear();
        self.count.store(0, Ordering::Release);
    }
}
