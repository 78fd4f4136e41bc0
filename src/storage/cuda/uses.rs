//! Fences on the streams that used a CUDA storage's memory
//! (`DeviceStorage::fence_uses`): an event recorded on each user stream
//! at the release, asked (`cuEventQuery`) at cleanup points and waited
//! for only where waiting is allowed (`storage/uses.rs`).

use super::{CudaStorage, driver};
use crate::storage::{StorageError, UseFence, UserStream};
use cudarc::driver::result;
use cudarc::driver::sys::{self, CUevent};

impl CudaStorage {
    /// An event recorded now on each of `users`, kept under a new fence.
    pub(super) fn record_uses(&mut self, users: &[UserStream]) -> Result<UseFence, StorageError> {
        self.bind()?;
        let mut events: Vec<CUevent> = Vec::with_capacity(users.len());
        for user in users {
            let recorded = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .and_then(|event| {
                    // SAFETY: a fresh event, recorded on a stream the
                    // caller names as a live stream of this context
                    // (`UserStream`); destroyed at once if it cannot be.
                    match unsafe { result::event::record(event, user.0 as sys::CUstream) } {
                        Ok(()) => Ok(event),
                        Err(err) => {
                            // SAFETY: made above, recorded nowhere.
                            let _ = unsafe { result::event::destroy(event) };
                            Err(err)
                        }
                    }
                });
            match recorded {
                Ok(event) => {
                    self.ops.event_recorded();
                    events.push(event);
                }
                Err(err) => {
                    destroy(events);
                    return Err(driver(err));
                }
            }
        }
        let id = self.next_use;
        self.next_use = self.next_use.wrapping_add(1);
        let count = u32::try_from(events.len()).unwrap_or(u32::MAX);
        self.uses.insert(id, events);
        Ok(UseFence { id, events: count })
    }

    /// Whether every event of `fence` passed (asked, never waited for);
    /// the events go once they all have.
    pub(super) fn uses_passed(&mut self, fence: UseFence) -> bool {
        let Some(events) = self.uses.get(&fence.id) else {
            return true;
        };
        if self.bind().is_err() {
            return false;
        }
        let ops = &mut self.ops;
        let passed = events.iter().all(|&event| {
            ops.event_queried();
            // SAFETY: recorded by `record_uses`, destroyed only once it
            // left `uses`.
            unsafe { result::event::query(event) }.is_ok()
        });
        if passed && let Some(events) = self.uses.remove(&fence.id) {
            destroy(events);
        }
        passed
    }

    /// Wait for every event of `fence`, then let them go.
    pub(super) fn wait_for_uses(&mut self, fence: UseFence) {
        let Some(events) = self.uses.remove(&fence.id) else {
            return;
        };
        if self.bind().is_err() {
            return;
        }
        for &event in &events {
            self.ops.event_waited();
            // SAFETY: recorded by `record_uses`; destroyed below, once.
            let _ = unsafe { result::event::synchronize(event) };
        }
        destroy(events);
    }

    /// Make `user`'s work queued from now on wait, on the device, for the
    /// work this storage's stream queued so far. No host wait.
    pub(super) fn order_stream(&mut self, user: UserStream) -> Result<(), StorageError> {
        self.bind()?;
        let own = self.stream.cu_stream();
        queue_wait(own, user.0 as sys::CUstream).map_err(driver)?;
        self.ops.ordered_stream();
        Ok(())
    }

    /// Make this storage's stream wait, on the device, for the work each
    /// of `users` queued so far. No host wait.
    pub(super) fn wait_for_streams(&mut self, users: &[UserStream]) -> Result<(), StorageError> {
        self.bind()?;
        let own = self.stream.cu_stream();
        for user in users {
            queue_wait(user.0 as sys::CUstream, own).map_err(driver)?;
            self.ops.ordered_stream();
        }
        Ok(())
    }

    /// Let every fence go, waited for or not: the storage ends (a
    /// destroyed event that has not passed is freed by the driver once it
    /// does).
    pub(super) fn forget_uses(&mut self) {
        for (_, events) in std::mem::take(&mut self.uses) {
            destroy(events);
        }
    }
}

/// Make `waiting`'s work queued from now on wait for the work `done`
/// queued so far: an event recorded on `done`, waited on by `waiting`
/// (`cuStreamWaitEvent`), and let go at once (the driver frees it once
/// the wait is done). Both are live streams of the bound context: this
/// storage's own, or one a caller names (`UserStream`).
fn queue_wait(done: sys::CUstream, waiting: sys::CUstream) -> Result<(), result::DriverError> {
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
    // SAFETY: a fresh event, recorded on and waited on by live streams of
    // the bound context (above); destroyed once, below, whatever happened.
    let queued = unsafe {
        result::event::record(event, done).and_then(|()| {
            result::stream::wait_event(
                waiting,
                event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        })
    };
    // SAFETY: made above, destroyed once.
    let _ = unsafe { result::event::destroy(event) };
    queued
}

/// Destroy events made by `record_uses`, each once.
fn destroy(events: Vec<CUevent>) {
    for event in events {
        // SAFETY: each event is destroyed once, here.
        let _ = unsafe { result::event::destroy(event) };
    }
}
