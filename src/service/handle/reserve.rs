//! The reserve forms a client calls, the hot cache's hits and misses among
//! them (`hot.rs`).

use super::super::error::ServiceError;
use super::super::hot::AHEAD_WHEN_LEFT;
use super::super::message::{Job, Pending, Request};
use super::super::protocol::{Allocations, Answer, Sizes};
use super::StreamHandle;
use crate::memory::{Allocation, PageUpdate};
use crate::sync::atomic::Ordering;
use std::time::Duration;

/// The one allocation of a single-size reservation.
pub(super) fn one(batch: Result<Allocations, ServiceError>) -> Result<Allocation, ServiceError> {
    batch.map(|mut batch| batch.pop().expect("one size, one allocation"))
}

impl StreamHandle {
    pub(super) fn reserve_request(
        &self,
        sizes: Sizes,
        update: PageUpdate,
        wait: Option<Duration>,
    ) -> impl FnOnce(Answer<Allocations>) -> Request {
        self.reserve_request_caching(sizes, update, wait, 0)
    }

    /// [`reserve_request`](Self::reserve_request) whose last `for_cache`
    /// sizes are for this client's hot cache.
    fn reserve_request_caching(
        &self,
        sizes: Sizes,
        update: PageUpdate,
        wait: Option<Duration>,
        for_cache: usize,
    ) -> impl FnOnce(Answer<Allocations>) -> Request {
        let mode = self.mode();
        move |reply| Request::ReserveMany(Pending::new(sizes, update, mode, wait, for_cache, reply))
    }

    /// Reserve `size` bytes in this client's mode. Outside every window,
    /// a size this client asked for lately may be served from its hot
    /// cache, on this thread with no round trip (`hot.rs`).
    pub fn reserve(&self, size: u64) -> Result<Allocation, ServiceError> {
        if !self.connection.hot_cache || self.open_windows.load(Ordering::Acquire) != 0 {
            return self.reserve_with(size, PageUpdate::Allow);
        }
        if let Some((allocation, left)) = self.hot.take(size) {
            if self.is_running() {
                if left <= AHEAD_WHEN_LEFT {
                    self.refill_ahead(size);
                }
                return Ok(allocation);
            }
            // Kept from before the stream stopped: the stream answers.
            drop(allocation);
        }
        self.reserve_missed(size)
    }

    /// A hit left few entries of `size` ([`AHEAD_WHEN_LEFT`]): ask the
    /// actor for more of it, and of every other size running low, without
    /// waiting (at most one such request out per cache), so that the next
    /// reserves of those sizes find some. The actor decides how many
    /// (`StreamActor::refill_hot`); a full inbox or a stopped stream drops
    /// the request, and the next miss refills as before.
    fn refill_ahead(&self, size: u64) {
        if !self.connection.refill_ahead || !self.hot.claim_ahead() {
            return;
        }
        let cache = self.hot.clone();
        let mode = self.mode();
        let request = Request::Run(Job::new(self.stream(), move |actor| {
            if let Ok(actor) = actor {
                actor.refill_hot(&cache, size, mode);
            }
            cache.ahead_done();
        }));
        // Refused, the job runs as refused and clears the claim.
        if self.connection.try_send(request).is_ok() && self.connection.shared.has_exited() {
            self.connection
                .shared
                .refuse_leftovers(&self.terminal_error());
        }
    }

    /// A reserve the hot cache could not serve: one round trip, which for
    /// a size missed lately also reserves a few more for the cache (none
    /// while a refill ahead is out: the two could pass the cache's part).
    fn reserve_missed(&self, size: u64) -> Result<Allocation, ServiceError> {
        let extra = if self.hot.missed(size) && !self.hot.ahead_out() {
            let shared = &self.connection.shared;
            let reserved = shared.bytes_reserved.load(Ordering::Acquire);
            self.hot
                .refill(size, reserved, shared.hot.refilling(&self.hot))
        } else {
            0
        };
        if extra == 0 {
            return self.reserve_with(size, PageUpdate::Allow);
        }
        let sizes: Sizes = std::iter::repeat_n(size, extra.saturating_add(1)).collect();
        let request = self.reserve_request_caching(sizes, PageUpdate::Allow, None, extra);
        match self.call_reserve(request) {
            Ok(mut batch) => {
                let first = batch.remove(0);
                for more in batch {
                    // Full (another thread of this clone filled it): back.
                    drop(self.hot.offer(more));
                }
                Ok(first)
            }
            // The extras asked too much of a short device: the one alone.
            Err(ServiceError::OutOfMemory(_)) => self.reserve_with(size, PageUpdate::Allow),
            Err(err) => Err(err),
        }
    }

    /// Reserve `size` bytes, changing pages only as far as `update` allows.
    pub fn reserve_with(&self, size: u64, update: PageUpdate) -> Result<Allocation, ServiceError> {
        one(self.call_reserve(self.reserve_request(smallvec::smallvec![size], update, None)))
    }

    /// Reserve `size` bytes, waiting up to `wait` for memory when the device
    /// is short (other streams' releases and cleanups are retried until
    /// then); `ServiceError::OutOfMemory` after that.
    pub fn reserve_timeout(&self, size: u64, wait: Duration) -> Result<Allocation, ServiceError> {
        one(self.call_reserve(self.reserve_request(
            smallvec::smallvec![size],
            PageUpdate::Allow,
            Some(wait),
        )))
    }

    /// Reserve a batch in one round trip: all of them, or none and the error.
    pub fn reserve_many(&self, sizes: &[u64]) -> Result<Vec<Allocation>, ServiceError> {
        self.call_reserve(self.reserve_request(Sizes::from_slice(sizes), PageUpdate::Allow, None))
            .map(Allocations::into_vec)
    }
}
