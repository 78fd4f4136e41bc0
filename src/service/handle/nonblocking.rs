//! The async forms: the same requests, answered on a flume channel the
//! caller awaits. Cancel-safe: a future dropped after its request went
//! out drops the answer when it comes, which releases what it held.

use super::super::error::ServiceError;
use super::super::message::{ActorTurn, Request, job};
use super::super::protocol::{Allocations, Answer, Reply, ShutdownReport, Sizes};
use super::StreamHandle;
use super::reserve::one;
use super::resolve::pin_on_actor;
use crate::memory::{Allocation, PageUpdate, Pinned};
use crate::sync::channel::TrySendError;
use std::time::Duration;

/// Yields once to the executor (used while the inbox is full).
struct YieldNow(bool);

impl std::future::Future for YieldNow {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

impl StreamHandle {
    /// Ask the stream to shut down without waiting for its answer (what a
    /// cancelled awaitable shutdown leaves behind).
    pub(crate) fn shutdown_detached(&self) {
        let (tx, _rx) = crate::sync::channel::bounded(1);
        let _ = self.connection.send(Request::Shutdown {
            reply: Reply::Channel(tx),
        });
    }

    pub(crate) async fn call_async<T>(
        &self,
        make: impl FnOnce(Answer<T>) -> Request,
    ) -> Result<T, ServiceError> {
        let (tx, rx) = crate::sync::async_channel::bounded(1);
        let mut request = make(Reply::Async(tx));
        loop {
            let shared = &self.connection.shared;
            match self.connection.try_send(request) {
                Ok(()) => {
                    if shared.has_exited() {
                        // As in `send_and_wait`: refused, ours answers.
                        shared.refuse_leftovers(&self.terminal_error());
                    }
                    break;
                }
                Err(TrySendError::Full(back)) => {
                    if shared.has_exited() {
                        // Nobody serves this inbox: refused here.
                        back.reject(self.terminal_error());
                        break;
                    }
                    request = back;
                    YieldNow(false).await;
                }
                Err(TrySendError::Disconnected(back)) => {
                    back.reject(self.terminal_error());
                    break;
                }
            }
        }
        match rx.recv_async().await {
            Ok(answer) => answer,
            Err(_) => Err(self.terminal_error()),
        }
    }

    /// [`run`](Self::run), awaited.
    pub(crate) async fn run_async<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut dyn ActorTurn) -> Result<T, ServiceError> + Send + 'static,
    ) -> Result<T, ServiceError> {
        self.call_async(|reply| job(self.stream(), op, reply)).await
    }

    /// [`reserve`](Self::reserve), awaited.
    pub async fn reserve_async(&self, size: u64) -> Result<Allocation, ServiceError> {
        one(self
            .call_async(self.reserve_request(smallvec::smallvec![size], PageUpdate::Allow, None))
            .await)
    }

    /// [`reserve_timeout`](Self::reserve_timeout), awaited. Cancel-safe:
    /// an allocation served after the future was dropped is released.
    pub async fn reserve_timeout_async(
        &self,
        size: u64,
        wait: Duration,
    ) -> Result<Allocation, ServiceError> {
        let request =
            self.reserve_request(smallvec::smallvec![size], PageUpdate::Allow, Some(wait));
        one(self.call_async(request).await)
    }

    /// [`reserve_many`](Self::reserve_many), awaited.
    pub async fn reserve_many_async(&self, sizes: &[u64]) -> Result<Vec<Allocation>, ServiceError> {
        let request = self.reserve_request(Sizes::from_slice(sizes), PageUpdate::Allow, None);
        self.call_async(request).await.map(Allocations::into_vec)
    }

    /// [`resolve`](Self::resolve), awaited when the actor must answer.
    pub async fn resolve_async(&self, allocation: &Allocation) -> Result<Pinned, ServiceError> {
        match self.try_resolve(allocation)? {
            Some(pinned) => Ok(pinned),
            // On the stream that lent it, if another did.
            None => {
                let lender = self.lender_of(allocation)?;
                let on = lender.as_ref().unwrap_or(self);
                on.run_async(pin_on_actor(allocation.clone())).await
            }
        }
    }

    /// [`reserve_with`](Self::reserve_with), awaited.
    pub async fn reserve_with_async(
        &self,
        size: u64,
        update: PageUpdate,
    ) -> Result<Allocation, ServiceError> {
        one(self
            .call_async(self.reserve_request(smallvec::smallvec![size], update, None))
            .await)
    }

    /// [`shutdown`](Self::shutdown), awaited.
    pub(crate) async fn shutdown_async(&self) -> Result<ShutdownReport, ServiceError> {
        self.call_async(|reply| Request::Shutdown { reply }).await
    }
}
