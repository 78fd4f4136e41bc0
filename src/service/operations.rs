//! The cold operations of a [`StreamHandle`]: everything but reservations,
//! resolve and shutdown. Each is written once, below: what it checks and
//! captures on the caller's thread (a `?` refuses before anything is sent)
//! and the closure the actor runs on its manager. The macro makes the
//! blocking method and its awaitable `_async` twin from that one place, and
//! both go through the handle's one generic call (`run` / `run_async`).
//!
//! An entry marked `[on allocation]` runs on the stream that lent the
//! allocation to this one's clients, if another did (`lender_of`).
//!
//! Adding an operation: one entry here. The actor needs no new arm, the
//! request enum no new variant, and refusal (a stopped or failed stream)
//! comes for free: a refused job answers its caller with the error.

use super::error::ServiceError;
use super::handle::StreamHandle;
use super::message::{ActorTurn, Job, Request};
use super::protocol::Answer;
use crate::memory::{
    Allocation, Cleanup, FailureId, HandedBack, MemoryReport, PageGuard, RelocationReason,
    RelocationReport, StreamId,
};
use crate::storage::UserStream;
use std::ops::Range;

/// Each entry: doc, `fn blocking / awaitable (&self, args) -> Output`, and a
/// block that evaluates to the actor's closure.
macro_rules! operations {
    // An allocation another stream lent: the operation runs there.
    (@lent $this:ident, $name:ident, [$($arg:ident),*]) => {};
    (@lent $this:ident, $name:ident, [$($arg:ident),*], $on:ident) => {
        if let Some(lender) = $this.lender_of($on)? {
            return lender.$name($($arg),*);
        }
    };
    (@lent_async $this:ident, $name:ident, [$($arg:ident),*]) => {};
    (@lent_async $this:ident, $name:ident, [$($arg:ident),*], $on:ident) => {
        if let Some(lender) = $this.lender_of($on)? {
            return Box::pin(lender.$name($($arg),*)).await;
        }
    };
    ($(
        $(#[$doc:meta])*
        $([on $on:ident])?
        fn $name:ident / $awaited:ident (&$this:ident $(, $arg:ident : $ty:ty)*) -> $out:ty $body:block
    )*) => {
        impl StreamHandle {
            $(
                $(#[$doc])*
                pub fn $name(&$this $(, $arg: $ty)*) -> Result<$out, ServiceError> {
                    operations!(@lent $this, $name, [$($arg),*] $(, $on)?);
                    $this.run($body)
                }
            )*
        }

        #[cfg(not(streamalloc_loom))]
        impl StreamHandle {
            $(
                #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), "), awaited.")]
                pub async fn $awaited(&$this $(, $arg: $ty)*) -> Result<$out, ServiceError> {
                    operations!(@lent_async $this, $awaited, [$($arg),*] $(, $on)?);
                    $this.run_async($body).await
                }
            )*
        }
    };
}

/// The closure of `relocate` (and `compact`): moves counted in the stream's
/// stats.
fn relocating(
    reason: RelocationReason,
) -> impl FnOnce(&mut dyn ActorTurn) -> Result<RelocationReport, ServiceError> + Send + 'static {
    move |actor: &mut dyn ActorTurn| {
        let report = actor.memory().relocate(reason)?;
        super::shared::bump(&actor.shared().relocated, report.moved);
        Ok(report)
    }
}

operations! {
    /// A handle bound to nothing, for [`bind`](Self::bind).
    fn unbound / unbound_async(&self) -> Allocation {
        |actor: &mut dyn ActorTurn| Ok(actor.memory().unbound())
    }

    /// Read `len` bytes from `offset`.
    [on allocation]
    fn read / read_async(&self, allocation: &Allocation, offset: u64, len: u64) -> Vec<u8> {
        let allocation = self.owned(allocation)?;
        move |actor: &mut dyn ActorTurn| Ok(actor.memory().read(&allocation, offset, len)?)
    }

    /// Write `data` at `offset`.
    [on allocation]
    fn write / write_async(&self, allocation: &Allocation, offset: u64, data: &[u8]) -> () {
        let (allocation, data) = (self.owned(allocation)?, data.to_vec());
        move |actor: &mut dyn ActorTurn| Ok(actor.memory().write(&allocation, offset, &data)?)
    }

    /// Copy every byte of `from` to the start of `to` (both this stream's,
    /// or both lent by the same stream).
    [on from]
    fn copy / copy_async(&self, from: &Allocation, to: &Allocation) -> () {
        let (from, to) = (self.owned(from)?, self.owned(to)?);
        move |actor: &mut dyn ActorTurn| Ok(actor.memory().copy(&from, &to)?)
    }

    /// Run a cleanup on the stream.
    fn cleanup / cleanup_async(&self, cleanup: Cleanup) -> () {
        move |actor: &mut dyn ActorTurn| {
            actor.memory().cleanup(cleanup);
            Ok(())
        }
    }

    /// Relocate as `reason` allows.
    fn relocate / relocate_async(&self, reason: RelocationReason) -> RelocationReport {
        relocating(reason)
    }

    /// Compact the stream's pages.
    fn compact / compact_async(&self) -> RelocationReport {
        relocating(RelocationReason::Compaction)
    }

    /// Guard the page that holds `allocation`.
    [on allocation]
    fn guard / guard_async(&self, allocation: &Allocation) -> PageGuard {
        let allocation = self.owned(allocation)?;
        move |actor: &mut dyn ActorTurn| Ok(actor.memory().guard(&allocation)?)
    }

    /// Record a failure (caused by `causes`) for taint to point at.
    fn record_failure / record_failure_async(&self, message: &str, causes: &[FailureId]) -> FailureId {
        let (message, causes) = (message.to_string(), causes.to_vec());
        move |actor: &mut dyn ActorTurn| Ok(actor.memory().record_failure(message, &causes))
    }

    /// Point bytes `range` of `allocation` at `failure`.
    [on allocation]
    fn taint / taint_async(&self, allocation: &Allocation, range: Range<u64>, failure: FailureId) -> () {
        let allocation = self.owned(allocation)?;
        move |actor: &mut dyn ActorTurn| Ok(actor.memory().taint(&allocation, range, failure)?)
    }

    /// Bytes `range` were written: no failure claims them.
    [on allocation]
    fn written / written_async(&self, allocation: &Allocation, range: Range<u64>) -> () {
        let allocation = self.owned(allocation)?;
        move |actor: &mut dyn ActorTurn| Ok(actor.memory().written(&allocation, range)?)
    }

    /// The failure claiming the lowest tainted byte of `range`.
    [on allocation]
    fn failure / failure_async(&self, allocation: &Allocation, range: Range<u64>) -> Option<FailureId> {
        let allocation = self.owned(allocation)?;
        move |actor: &mut dyn ActorTurn| Ok(actor.memory().failure(&allocation, range)?)
    }

    /// How other streams name this stream's device stream when its work
    /// uses their memory ([`record_use`](Self::record_use)): a CUDA
    /// storage's `CUstream`; for a storage that models its device, the
    /// stream's id.
    fn user_stream / user_stream_async(&self) -> UserStream {
        |actor: &mut dyn ActorTurn| {
            let named = actor.memory().storage().stream_name();
            Ok(actor.shared().user_stream(named))
        }
    }

    /// Record that `user` (another stream of the device: another
    /// handle's [`user_stream`](Self::user_stream), or a stream of other
    /// code, as PyTorch's `record_stream` names it) uses `allocation`'s
    /// bytes: they stay in place, and once its last handle goes they are
    /// neither reused nor given back before the work `user` queued by
    /// then is done (`docs/memory.md`, "Memory other streams use").
    [on allocation]
    fn record_use / record_use_async(&self, allocation: &Allocation, user: UserStream) -> () {
        let allocation = self.owned(allocation)?;
        move |actor: &mut dyn ActorTurn| Ok(actor.memory().record_use(&allocation, user)?)
    }

    /// The stream's pools, usage and peaks. Its counters are published
    /// first: once the report is back, [`stats`](Self::stats) agree.
    fn report / report_async(&self) -> MemoryReport {
        |actor: &mut dyn ActorTurn| {
            actor.memory().process_releases();
            actor.publish();
            Ok(actor.memory().memory_report())
        }
    }
}

/// `bind` hands its reservation back when it fails, so its job answers with
/// the allocation even when the stream refuses it: it is written out here
/// rather than through `operations!`, whose jobs drop what they hold when
/// refused.
impl StreamHandle {
    /// Hand `reserved`'s memory to `assigned` with `cursor` (same stream
    /// only: for an allocation another stream lent, an unbound handle of
    /// that stream). On failure `reserved` is dropped; [`try_bind`](Self::try_bind)
    /// hands it back.
    pub fn bind(
        &self,
        reserved: Allocation,
        assigned: &Allocation,
        cursor: u64,
    ) -> Result<(), ServiceError> {
        self.try_bind(reserved, assigned, cursor)
            .map_err(|failed| failed.error)
    }

    /// [`bind`](Self::bind), handing `reserved` back untouched when it
    /// fails (a foreign or stale handle, a stopped stream).
    pub fn try_bind(
        &self,
        reserved: Allocation,
        assigned: &Allocation,
        cursor: u64,
    ) -> Result<(), HandedBack<ServiceError>> {
        match self.lender_of(&reserved) {
            // Lent by another stream: bound there, into one of its handles.
            Ok(Some(lender)) => return lender.try_bind(reserved, assigned, cursor),
            Ok(None) => {}
            Err(error) => {
                return Err(HandedBack {
                    error,
                    allocation: Some(reserved),
                });
            }
        }
        let (reserved, assigned) = self.bind_checked(reserved, assigned)?;
        let answer = self.call(|reply| bind_job(self.stream(), reserved, assigned, cursor, reply));
        flatten(answer)
    }

    fn bind_checked(
        &self,
        reserved: Allocation,
        assigned: &Allocation,
    ) -> Result<(Allocation, Allocation), HandedBack<ServiceError>> {
        let checked = self.own(&reserved).and_then(|()| self.owned(assigned));
        match checked {
            Ok(assigned) => Ok((reserved, assigned)),
            Err(error) => Err(HandedBack {
                error,
                allocation: Some(reserved),
            }),
        }
    }
}

#[cfg(not(streamalloc_loom))]
impl StreamHandle {
    /// [`bind`](Self::bind), awaited.
    pub async fn bind_async(
        &self,
        reserved: Allocation,
        to: &Allocation,
        cursor: u64,
    ) -> Result<(), ServiceError> {
        self.try_bind_async(reserved, to, cursor)
            .await
            .map_err(|failed| failed.error)
    }

    /// [`try_bind`](Self::try_bind), awaited.
    pub async fn try_bind_async(
        &self,
        reserved: Allocation,
        to: &Allocation,
        cursor: u64,
    ) -> Result<(), HandedBack<ServiceError>> {
        match self.lender_of(&reserved) {
            Ok(Some(lender)) => return Box::pin(lender.try_bind_async(reserved, to, cursor)).await,
            Ok(None) => {}
            Err(error) => {
                return Err(HandedBack {
                    error,
                    allocation: Some(reserved),
                });
            }
        }
        let (reserved, to) = self.bind_checked(reserved, to)?;
        let answer = self
            .call_async(|reply| bind_job(self.stream(), reserved, to, cursor, reply))
            .await;
        flatten(answer)
    }
}

/// What a bind's job answers: done, or the reservation and why.
type BindAnswer = Result<(), HandedBack<ServiceError>>;

/// The bind job: on the actor, or refused, it answers with the
/// reservation in hand.
fn bind_job(
    stream: StreamId,
    reserved: Allocation,
    assigned: Allocation,
    cursor: u64,
    reply: Answer<BindAnswer>,
) -> Request {
    Request::Run(Job::new(stream, move |actor| {
        let answer = match actor {
            Ok(actor) => actor
                .memory()
                .try_bind(reserved, &assigned, cursor)
                .map_err(|failed| failed.map(ServiceError::from)),
            Err(error) => Err(HandedBack {
                error,
                allocation: Some(reserved),
            }),
        };
        reply.send(Ok(answer));
    }))
}

/// A bind's answer; a stream gone before it answered (the reservation went
/// with its job) is an error with nothing to hand back.
fn flatten(answer: Result<BindAnswer, ServiceError>) -> BindAnswer {
    answer.unwrap_or_else(|error| {
        Err(HandedBack {
            error,
            allocation: None,
        })
    })
}
