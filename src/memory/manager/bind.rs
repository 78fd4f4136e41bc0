//! Binding: handing a reserved allocation to a handle made before it (the
//! seed's `bind`), so every clone of the reserved handle goes stale and the
//! bound one names the bytes.

use super::MemoryManager;
use crate::memory::error::{HandedBack, MemoryError};
use crate::memory::handle::Allocation;
use crate::storage::DeviceStorage;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;

impl<S: DeviceStorage> MemoryManager<S> {
    /// Hand the allocation `reserved` names to the unbound handle `assigned`,
    /// with `cursor`. Every clone of `reserved` is stale afterwards. On
    /// failure `reserved` is dropped (freed if it was the last handle);
    /// [`try_bind`](Self::try_bind) hands it back instead.
    ///
    /// # Errors
    /// As [`try_bind`](Self::try_bind).
    pub fn bind(
        &mut self,
        reserved: Allocation,
        assigned: &Allocation,
        cursor: u64,
    ) -> Result<(), MemoryError> {
        self.try_bind(reserved, assigned, cursor)
            .map_err(|failed| failed.error)
    }

    /// [`bind`](Self::bind), handing `reserved` back untouched when it
    /// fails.
    ///
    /// # Errors
    /// `reserved`'s lookup errors; [`MemoryError::Foreign`] or
    /// [`MemoryError::AlreadyBound`] for an `assigned` that cannot take it.
    pub fn try_bind(
        &mut self,
        reserved: Allocation,
        assigned: &Allocation,
        cursor: u64,
    ) -> Result<(), HandedBack<MemoryError>> {
        let refuse = |error, allocation| {
            Err(HandedBack {
                error,
                allocation: Some(allocation),
            })
        };
        let slot = match self.live(&reserved) {
            Ok((slot, _)) => slot,
            Err(error) => return refuse(error, reserved),
        };
        if let Some(id) = assigned.id() {
            let error = if assigned.cell.owner == self.owner {
                MemoryError::AlreadyBound(id)
            } else {
                MemoryError::Foreign(id)
            };
            return refuse(error, reserved);
        }
        if assigned.cell.owner != self.owner {
            let error = MemoryError::Foreign(reserved.id().expect("bound"));
            return refuse(error, reserved);
        }
        let from = reserved.id().expect("bound");
        let to = self.slots.renew(slot);
        let live = self.slots.get_mut(slot).expect("checked");
        live.cursor = cursor;
        let addr = live.cell.addr.swap(0, Ordering::AcqRel);
        // The bytes stay counted, now by the handle that holds them.
        let metered = live.cell.metered.swap(0, Ordering::AcqRel);
        assigned.cell.metered.store(metered, Ordering::Release);
        assigned.cell.len.store(live.size, Ordering::Release);
        assigned.cell.addr.store(addr, Ordering::Release);
        // Lent, it stays lent to the same clients (`lend_to`).
        let lent_to = live.cell.lent_to.load(Ordering::Acquire);
        assigned.cell.lent_to.store(lent_to, Ordering::Release);
        live.rebind(Arc::clone(&assigned.cell));
        assigned.cell.set_key(to);
        let to = self.id_of(to);
        if let Some(observer) = self.observer.as_mut() {
            observer.rebound(from, to);
        }
        Ok(())
    }
}
