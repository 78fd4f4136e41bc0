//! Resolve: an allocation's address under a pin, without a round trip
//! when the allocation publishes one (`docs/service.md`, "Resolve").

use super::super::error::ServiceError;
use super::super::message::ActorTurn;
use super::StreamHandle;
use crate::memory::{Allocation, AllocationCell, Pinned, PinnedRef};
use crate::storage::Resource;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;

/// Where a just-pinned allocation's bytes are, as its cell publishes them;
/// address 0 when the actor must be asked. Under the pin no move can start,
/// and a move that ended before the pin published its new address first
/// (the handshake of `docs/service.md`, "Resolve").
fn published(cell: &AllocationCell) -> Resource {
    let addr = cell.addr.load(Ordering::SeqCst);
    let len = if addr == 0 {
        0
    } else {
        cell.len.load(Ordering::Acquire)
    };
    Resource { addr, len }
}

/// The actor's half of `resolve`: pin under its exclusive access.
pub(super) fn pin_on_actor(
    allocation: Allocation,
) -> impl FnOnce(&mut dyn ActorTurn) -> Result<Pinned, ServiceError> + Send + 'static {
    move |actor: &mut dyn ActorTurn| Ok(actor.memory().pin(&allocation)?)
}

impl StreamHandle {
    /// lives. Without a round trip when the allocation's address is
    /// published and no move is under way; otherwise the actor answers.
    pub fn resolve(&self, allocation: &Allocation) -> Result<Pinned, ServiceError> {
        match self.try_resolve(allocation)? {
            Some(pinned) => Ok(pinned),
            // On the stream that lent it, if another did.
            None => {
                let lender = self.lender_of(allocation)?;
                let on = lender.as_ref().unwrap_or(self);
                on.run(pin_on_actor(allocation.clone()))
            }
        }
    }

    /// The lock-free half of [`resolve`](Self::resolve): `None` when the
    /// actor must be asked.
    pub fn try_resolve(&self, allocation: &Allocation) -> Result<Option<Pinned>, ServiceError> {
        self.may_use(allocation)?;
        let cell = &allocation.cell;
        if !Pinned::try_pin(cell) {
            return Ok(None);
        }
        let resource = published(cell);
        // Dropped unpublished, the pin is released (and a release that every
        // handle's going skipped meanwhile is queued again).
        let pinned = Pinned::new(Arc::clone(cell), resource);
        Ok((resource.addr != 0).then_some(pinned))
    }

    /// [`try_resolve`](Self::try_resolve) with a pin borrowed from
    /// `allocation` (a [`PinnedRef`] cannot outlive it): the cheapest way to
    /// the address, one CAS to pin and one decrement to unpin. `None` when
    /// the actor must be asked ([`resolve`](Self::resolve) then).
    pub fn try_resolve_ref<'a>(
        &self,
        allocation: &'a Allocation,
    ) -> Result<Option<PinnedRef<'a>>, ServiceError> {
        self.may_use(allocation)?;
        let cell = &**allocation.cell;
        if !Pinned::try_pin(cell) {
            return Ok(None);
        }
        let resource = published(cell);
        let pinned = PinnedRef::new(cell, resource);
        Ok((resource.addr != 0).then_some(pinned))
    }
}
