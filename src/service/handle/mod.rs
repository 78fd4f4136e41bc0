//! `StreamHandle`: what a client holds to talk to a stream.
//!
//! A blocking call whose stream has nothing queued is served in place, on
//! the caller's thread in the actor's turn (`in_place.rs`); otherwise, and
//! for every async call, the request goes on the stream's bounded inbox.
//! Dropping an allocation and resolving one need no round trip. Each clone
//! is one client, with its own windows and hot cache. The long form is in
//! `docs/service.md`.

mod call;
mod connection;
#[cfg(not(streamalloc_loom))]
mod nonblocking;
mod reserve;
mod resolve;
mod window;

pub(crate) use connection::{Connection, ServeInPlace};
pub use window::ModeWindow;

use super::error::ServiceError;
use super::hot::HotCache;
use super::message::{ActorTurn, Request, job};
use super::protocol::ShutdownReport;
use super::shared::StreamStats;
use crate::memory::{Allocation, AllocationMode, StreamId};
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Arc, Mutex};
use call::ReplySlot;

/// A client's handle to one stream: `Clone + Send + Sync`.
#[derive(Debug)]
pub struct StreamHandle {
    /// Shared by every clone.
    pub(crate) connection: Arc<Connection>,
    /// This client's open windows, innermost last: (token, mode).
    windows: Mutex<Vec<(u64, AllocationMode)>>,
    /// How many are open: a reserve outside every window reads this, not
    /// the lock.
    open_windows: AtomicU64,
    /// This client's hot allocations (`hot.rs`), listed on the stream.
    hot: Arc<HotCache>,
    /// The next window token.
    next_window: AtomicU64,
    /// The reply cell for reservations, kept for the next call: a fresh
    /// cell per call is a heap block that the actor's thread would often
    /// free, and cross-thread frees are what a busy client pays most for in
    /// glibc's allocator.
    replies: ReplySlot,
}

impl Clone for StreamHandle {
    /// A new client of the same stream, with no window open.
    fn clone(&self) -> Self {
        Self::new(self.connection.clone())
    }
}

impl Drop for StreamHandle {
    /// The client is gone: what its hot cache held goes back.
    fn drop(&mut self) {
        self.connection.shared.hot.close(&self.hot);
    }
}

impl StreamHandle {
    pub(crate) fn new(connection: Arc<Connection>) -> Self {
        // Listed only where it may fill: the actor looks at every listed
        // cache before each growth.
        let hot = if connection.hot_cache {
            connection.shared.hot.open()
        } else {
            Arc::new(HotCache::new())
        };
        Self {
            connection,
            windows: Mutex::new(Vec::new()),
            open_windows: AtomicU64::new(0),
            hot,
            next_window: AtomicU64::new(0),
            replies: ReplySlot::default(),
        }
    }

    /// This client's hot cache (the loom models fill it).
    #[cfg(streamalloc_loom)]
    pub(crate) fn hot_cache(&self) -> &HotCache {
        &self.hot
    }

    /// The stream.
    pub fn stream(&self) -> StreamId {
        self.connection.shared.stream
    }

    /// The stream's counters, read without a round trip: as the actor
    /// published them after the last request it finished (a reply can come
    /// before its request's counters; once [`report`](Self::report)
    /// returns, they include everything before it).
    pub fn stats(&self) -> StreamStats {
        self.connection.shared.stats()
    }

    /// A clone of `allocation` to send, once it is checked to belong here.
    pub(crate) fn owned(&self, allocation: &Allocation) -> Result<Allocation, ServiceError> {
        self.own(allocation)?;
        Ok(allocation.clone())
    }

    /// The one generic call: run `op` on the actor's thread, against its
    /// manager, and wait for its answer (see `operations.rs`).
    pub(crate) fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut dyn ActorTurn) -> Result<T, ServiceError> + Send + 'static,
    ) -> Result<T, ServiceError> {
        self.call(|reply| job(self.stream(), op, reply))
    }

    /// Whether the stream is serving requests.
    pub(crate) fn is_running(&self) -> bool {
        self.connection.shared.is_running()
    }

    /// Wait until the actor has served everything sent before, its control
    /// traffic included, without counting as a request of its clients.
    pub(crate) fn barrier(&self) -> Result<(), ServiceError> {
        self.call(|reply| Request::Barrier { reply })
    }

    /// The stream that lent `allocation` to this one's clients, through a
    /// handle of its own that runs the operation there (`None`: the
    /// allocation is this stream's). An allocation of another stream that
    /// was not lent here is refused as before ([`ServiceError::WrongStream`]);
    /// one whose lender stopped, with [`ServiceError::StreamStopped`].
    pub(crate) fn lender_of(
        &self,
        allocation: &Allocation,
    ) -> Result<Option<StreamHandle>, ServiceError> {
        self.may_use(allocation)?;
        let cell = &allocation.cell;
        if cell.owner == self.connection.owner {
            return Ok(None);
        }
        let lender = (self.connection.device.registry.lock())
            .get(&cell.stream)
            .filter(|entry| entry.handle.connection.owner == cell.owner)
            .map(|entry| entry.handle.connection.clone());
        match lender {
            Some(connection) => Ok(Some(StreamHandle::borrowed_from(connection))),
            None => Err(ServiceError::StreamStopped(cell.stream)),
        }
    }

    /// A handle of a stream that lent to another's clients, for one of
    /// their operations: no hot cache of its own.
    fn borrowed_from(connection: Arc<Connection>) -> Self {
        Self {
            connection,
            windows: Mutex::new(Vec::new()),
            open_windows: AtomicU64::new(0),
            hot: Arc::new(HotCache::new()),
            next_window: AtomicU64::new(0),
            replies: ReplySlot::default(),
        }
    }

    /// Check that this stream's clients may use `allocation`: it is the
    /// stream's own, or another stream of the device lent it here.
    pub(crate) fn may_use(&self, allocation: &Allocation) -> Result<(), ServiceError> {
        let cell = &allocation.cell;
        if cell.owner == self.connection.owner
            || cell.lent_to.load(Ordering::Acquire) == self.connection.owner
        {
            return Ok(());
        }
        Err(ServiceError::WrongStream {
            owner: cell.stream,
            used_on: self.stream(),
        })
    }

    /// Check that `allocation` belongs to this stream before sending it.
    pub(crate) fn own(&self, allocation: &Allocation) -> Result<(), ServiceError> {
        if allocation.cell.owner == self.connection.owner {
            return Ok(());
        }
        Err(ServiceError::WrongStream {
            owner: allocation.cell.stream,
            used_on: self.stream(),
        })
    }

    /// Shut the stream down: queued requests are refused, pins get a
    /// bounded wait, every page is returned. Later calls answer
    /// `StreamStopped`. Not public: a handle is one client among its
    /// clones, and the stream belongs to the device, so only the
    /// [`Supervisor`](super::Supervisor) ends it (`remove_stream`,
    /// `shutdown`).
    pub(crate) fn shutdown(&self) -> Result<ShutdownReport, ServiceError> {
        self.call(|reply| Request::Shutdown { reply })
    }
}
