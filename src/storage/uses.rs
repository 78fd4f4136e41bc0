//! Memory that streams other than a storage's own use (PyTorch's
//! `record_stream`): before such memory is reused or given back, the work
//! those streams queued up to its release must be done. The storage
//! records a *use fence* on them at the release (an event on each, never a
//! wait) and answers, when asked at a cleanup point, whether it passed;
//! only the paths allowed to wait (the last try before running out of
//! memory, explicit cleanup, the end of a stream) wait for it.
//!
//! The manager keeps the released allocation in place, unmovable and
//! unreusable, until its fence passes (`memory/manager/uses.rs`); so a
//! granule under it is never unmapped, nor a page under it freed, while
//! the users may still touch it. `docs/memory.md`, "Memory other streams
//! use".

use super::DriverOps;
use super::give_back::LagClock;
use std::fmt;

/// A stream of the device as storages name it, for recording that it uses
/// memory it does not own: a CUDA storage's is its raw `CUstream`; a
/// storage that models its device ([`VirtualStorage`], [`HostStorage`])
/// takes any number, its streams all running as far behind as its own.
///
/// [`VirtualStorage`]: super::VirtualStorage
/// [`HostStorage`]: super::HostStorage
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserStream(pub u64);

impl fmt::Display for UserStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {:#x}", self.0)
    }
}

/// What says the work some user streams had queued at a release is done,
/// as one storage recorded it ([`DeviceStorage::fence_uses`]): asked with
/// [`uses_done`], waited for with [`wait_uses`], each once it passed
/// forgotten by the storage. Meaningful only to the storage that made it.
///
/// [`DeviceStorage::fence_uses`]: super::DeviceStorage::fence_uses
/// [`uses_done`]: super::DeviceStorage::uses_done
/// [`wait_uses`]: super::DeviceStorage::wait_uses
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UseFence {
    /// The storage's name for it (a modeled storage: the flush it is due
    /// at; CUDA: the key of its events).
    pub(crate) id: u64,
    /// Events it stands for, one per user stream.
    pub(crate) events: u32,
}

impl UseFence {
    /// The fence of a storage whose device work is done as it is asked
    /// (nothing runs behind the host): passed from the start.
    pub(crate) const PASSED: Self = Self { id: 0, events: 0 };
}

/// The events of a fence on `users`, as counted.
fn events(users: &[UserStream]) -> u32 {
    u32::try_from(users.len()).unwrap_or(u32::MAX)
}

/// A use fence of a storage with no stream of its own: the users' work
/// queued now is done at its next flush, or `lag` flushes after
/// (as the storage's own give-backs), so an idle stream's next cleanup
/// point still sees it pass and a replay stays the same on every run.
pub(crate) fn fence_lagged(
    clock: &LagClock,
    users: &[UserStream],
    ops: &mut DriverOps,
) -> UseFence {
    let events = events(users);
    for _ in 0..events {
        ops.event_recorded();
    }
    UseFence {
        id: clock.next_due().due,
        events,
    }
}

/// Whether the lagged `fence` passed, each of its events asked (as a
/// device asks until one has not passed).
pub(crate) fn done_lagged(clock: &LagClock, fence: UseFence, ops: &mut DriverOps) -> bool {
    let passed = clock.flushes >= fence.id;
    let asked = if passed {
        fence.events
    } else {
        fence.events.min(1)
    };
    for _ in 0..asked {
        ops.event_queried();
    }
    passed
}

/// A wait for the lagged `fence` (what a device would wait for, counted;
/// the modeled work is done once waited for).
pub(crate) fn wait_lagged(clock: &LagClock, fence: UseFence, ops: &mut DriverOps) {
    if clock.flushes < fence.id {
        for _ in 0..fence.events {
            ops.event_waited();
        }
    }
}
