//! What moving an allocation needs, lent by the manager to the pool that
//! moves it as one value: the slot table (to find an allocation and claim
//! it), the storage (to copy or slide its bytes) and the reservation serial
//! (when its old place was let go).
//!
//! The long form: `docs/modules.md`, "`src/memory/pool/mover.rs`".

use super::page::{Backing, Placement};
use crate::memory::error::MemoryError;
use crate::memory::handle::AllocationCell;
use crate::memory::slot::SlotTable;
use crate::storage::{DeviceStorage, StorageError, StorageHandle};
use crate::sync::Arc;

/// The manager's state a pool borrows to move allocations.
pub(crate) struct Mover<'a> {
    /// Every live allocation of the stream.
    pub(crate) slots: &'a mut SlotTable,
    /// Where the pages come from.
    pub(crate) storage: &'a mut dyn DeviceStorage,
    /// Reservations so far (the clock of deallocation periods).
    pub(crate) serial: u64,
    /// A settle moves allocations that pin free granules in the handles
    /// they share, where that pays (`pool/expandable/rehome.rs`): set at
    /// the service's settle.
    pub(crate) rehome: bool,
}

/// The pages of a pool that moves allocations between them.
pub(crate) trait Pages {
    /// The page's backing, `None` while it has none (lazy).
    fn page_backing(&self, page: u32) -> Option<Backing>;

    /// Give a lazily carved page its backing.
    fn materialize(
        &mut self,
        storage: &mut dyn DeviceStorage,
        page: u32,
    ) -> Result<StorageHandle, StorageError>;

    /// Give an allocation's bytes back to the pool.
    fn free(&mut self, placement: Placement, size: u64, aligned: u64, serial: u64);
}

/// A move's claim on one allocation ([`Mover::claim`]): while it lives no
/// client can pin the allocation; as it drops, the move ends, and a client
/// that pins after reads the new place (publish it first).
pub(crate) struct Claim(Arc<AllocationCell>);

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.pins.end_move();
    }
}

/// An allocation as a move finds it: its size and where it lies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Moving {
    /// Bytes asked for.
    pub(crate) size: u64,
    /// Bytes taken (aligned).
    pub(crate) aligned: u64,
    /// Where it lies now.
    pub(crate) from: Placement,
}

impl Mover<'_> {
    /// Whether the allocation in a slot may move now: not pinned, not even
    /// through a cell it was bound away from, and not used by other
    /// streams (`Live::stays_put` asks all three).
    pub(crate) fn movable(&self) -> impl Fn(u32) -> bool + '_ {
        |slot| self.slots.get(slot).is_some_and(|live| !live.stays_put())
    }

    /// Claim the allocation of `slot` for a move; `None` when a client
    /// holds a pin on it or other streams use it where it is. The claim
    /// ends when the [`Claim`] drops. A loan its borrower holds is claimed
    /// with the storage's stream ordered after the borrower's work so far
    /// (`DeviceStorage::order_after`): the move's copy cannot overtake
    /// what the borrower queued on the old bytes.
    pub(crate) fn claim(&mut self, slot: u32) -> Option<Claim> {
        let live = self
            .slots
            .get(slot)
            .expect("a carved block has a live slot");
        // A pin through a cell it was bound away from holds it too (no
        // client can pin those afresh: their address is unpublished).
        // Other streams' work may read it where it is (`record_use`).
        if live.pinned_through_retired() || live.users_hold_in_place() {
            return None;
        }
        let cell = live.cell.clone();
        // `then`, not `then_some`: a claim made for a refused move would end
        // a move it never began as it drops.
        let claim = cell.pins.claim_move().then(|| Claim(cell))?;
        if let Some(users) = live.users.as_ref()
            && self.storage.order_after(&users.streams).is_err()
        {
            // Not ordered: it stays (the claim ends as it drops).
            return None;
        }
        Some(claim)
    }

    /// Run `moving` with the allocation of `slot` claimed for a move;
    /// `None`, without running it, when a client holds a pin on it.
    pub(crate) fn while_claimed<T>(
        &mut self,
        slot: u32,
        moving: impl FnOnce(&mut Self) -> T,
    ) -> Option<T> {
        let claim = self.claim(slot)?;
        let moved = moving(self);
        drop(claim);
        Some(moved)
    }

    /// Run `moving` on the allocation of `slot` while it is claimed;
    /// `Ok(None)`, without running it, when a client holds a pin on it.
    pub(crate) fn move_claimed(
        &mut self,
        slot: u32,
        moving: impl FnOnce(&mut Self, Moving) -> Result<Option<u64>, MemoryError>,
    ) -> Result<Option<u64>, MemoryError> {
        let live = self
            .slots
            .get(slot)
            .expect("a carved block has a live slot");
        let found = Moving {
            size: live.size,
            aligned: live.aligned,
            from: live.placement,
        };
        self.while_claimed(slot, |mover| moving(mover, found))
            .unwrap_or(Ok(None))
    }

    /// Move the claimed allocation of `slot` to `to`, carved for it in
    /// `pool`: copy its bytes, give the old place back, publish the new
    /// one. A failed copy gives `to` back and leaves it where it was.
    pub(crate) fn carry(
        &mut self,
        pool: &mut impl Pages,
        slot: u32,
        moving: Moving,
        to: Placement,
    ) -> Result<Option<u64>, MemoryError> {
        let Moving {
            size,
            aligned,
            from,
        } = moving;
        if let Err(err) = self.copy(pool, from, to, size) {
            pool.free(to, size, aligned, self.serial);
            return Err(err);
        }
        pool.free(from, size, aligned, self.serial);
        self.publish(pool, slot, to);
        Ok(Some(size))
    }

    /// Copy `size` bytes from one placement to another; a source page never
    /// backed (lazy) holds nothing to copy.
    fn copy(
        &mut self,
        pool: &mut impl Pages,
        from: Placement,
        to: Placement,
        size: u64,
    ) -> Result<(), MemoryError> {
        let Some(source) = pool.page_backing(from.page()) else {
            return Ok(());
        };
        let target = match pool.page_backing(to.page()) {
            Some(target) => target.handle,
            None => pool.materialize(self.storage, to.page())?,
        };
        let range = |page: StorageHandle, at: Placement| StorageHandle {
            id: page.id,
            offset: page.offset + at.offset,
            size,
        };
        self.storage
            .copy(&range(source.handle, from), &range(target, to))?;
        Ok(())
    }

    /// Record that the allocation of `slot` now lies at `to`, and publish
    /// its address. Called before a move's claim is dropped.
    pub(crate) fn publish(&mut self, pool: &impl Pages, slot: u32, to: Placement) {
        let addr = pool
            .page_backing(to.page())
            .map_or(0, |backing| backing.base + to.offset);
        let live = self.slots.get_mut(slot).expect("live");
        live.placement = to;
        live.cell
            .addr
            .store(addr, crate::sync::atomic::Ordering::SeqCst);
        // A loan: the borrower's work from now on waits for the move.
        if let Some(users) = live.users.as_ref() {
            for &user in &users.streams {
                if self.storage.order_for(user).is_err() {
                    // The driver could not queue the wait: the host waits
                    // for the move instead (a failing driver's path only).
                    self.storage.drain();
                }
            }
        }
    }
}

/// [`Pages`] for a pool of `pages`, each with its `storage` (an optional
/// [`Backing`]) and `size`, freeing with the pool's own `free`.
macro_rules! pages_of_page_pool {
    ($pool:ty) => {
        impl Pages for $pool {
            fn page_backing(&self, page: u32) -> Option<Backing> {
                self.pages[page as usize].storage
            }

            fn materialize(
                &mut self,
                storage: &mut dyn DeviceStorage,
                page: u32,
            ) -> Result<StorageHandle, StorageError> {
                let page = &mut self.pages[page as usize];
                Backing::get_or_allocate(&mut page.storage, storage, page.size)
            }

            fn free(&mut self, placement: Placement, size: u64, aligned: u64, serial: u64) {
                Self::free(self, placement, size, aligned, serial);
            }
        }
    };
}
pub(crate) use pages_of_page_pool;
