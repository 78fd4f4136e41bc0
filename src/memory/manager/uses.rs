//! Allocations other streams use (PyTorch's `record_stream`): once the
//! last handle of one goes, its memory waits, in place and unmovable, for
//! the work those streams had queued by then, before a reservation may
//! take it or a cleanup give it back. The wait is a fence the storage
//! records on the user streams (`storage/uses.rs`): asked at each
//! reservation the room held cannot serve and at each cleanup point,
//! waited for only by explicit cleanup,
//! the last try before running out of memory and the end of the stream.
//!
//! `docs/memory.md`, "Memory other streams use".

use super::MemoryManager;
use crate::memory::error::MemoryError;
use crate::memory::handle::Allocation;
use crate::memory::slot::{SlotKey, Users};
use crate::storage::{DeviceStorage, UseFence, UserStream};
use crate::sync::atomic::Ordering;

/// The most streams one allocation records as users: past it a caller
/// is told (a bounded list per allocation, whatever a caller sends).
pub const MAX_USER_STREAMS: usize = 64;

impl<S: DeviceStorage> MemoryManager<S> {
    /// Record that `user`, a stream of the device other than this
    /// manager's, uses `allocation`'s bytes from now on (PyTorch's
    /// `record_stream`). The allocation stays where it is from now on
    /// (relocation passes it by), and once its last handle goes its
    /// memory is neither reused nor given back until the work `user` had
    /// queued by then is done. The manager's own stream needs no record
    /// (its work runs in order); recording a stream twice changes nothing.
    ///
    /// # Errors
    /// The handle's errors (uninitialized, foreign, stale), and
    /// [`MemoryError::TooManyUsers`] past [`MAX_USER_STREAMS`] streams.
    pub fn record_use(
        &mut self,
        allocation: &Allocation,
        user: UserStream,
    ) -> Result<(), MemoryError> {
        self.process_releases();
        let own = self.storage.stream_name();
        let live = self.live_mut(allocation)?;
        if own == Some(user) {
            return Ok(());
        }
        let users = live.users.get_or_insert_with(Box::default);
        if users.streams.contains(&user) {
            return Ok(());
        }
        if users.streams.len() >= MAX_USER_STREAMS {
            return Err(MemoryError::TooManyUsers {
                id: allocation.id().expect("located above"),
                max: MAX_USER_STREAMS,
            });
        }
        users.streams.push(user);
        if users.streams.len() == 1 {
            let size = live.size;
            self.bytes_used_by_others = self.bytes_used_by_others.saturating_add(size);
        }
        Ok(())
    }

    /// Hand `allocation` to the clients of another stream of the device,
    /// whose manager is `borrower` and whose device stream is `user`: the
    /// allocation is recorded as used by `user` ([`record_use`](Self::record_use):
    /// it stays in place, and once released waits for `user`'s work), and
    /// its handles tell the borrower's that it is theirs to use.
    ///
    /// # Errors
    /// [`record_use`](Self::record_use)'s.
    pub fn lend_to(
        &mut self,
        allocation: &Allocation,
        user: UserStream,
        borrower: u64,
    ) -> Result<(), MemoryError> {
        self.record_use(allocation, user)?;
        allocation.cell.lent_to.store(borrower, Ordering::Release);
        Ok(())
    }

    /// Allocations whose last handle went and that wait for other
    /// streams' work.
    pub fn awaiting_users(&self) -> usize {
        self.awaiting_users.len()
    }

    /// The last handle of the allocation `key` names went (no pin holds
    /// it): if other streams use it, record the fence on their work and
    /// keep it; `true` when kept (the caller frees nothing).
    pub(super) fn hold_for_users(&mut self, key: SlotKey) -> bool {
        let Some(users) = (self.slots.get_mut(key.slot())).and_then(|live| live.users.as_mut())
        else {
            return false;
        };
        if users.released {
            return true;
        }
        users.released = true;
        self.fence_of(key);
        self.awaiting_users.push(key);
        true
    }

    /// Free what waited for other streams and need not any more: each
    /// fence asked, none waited for. What each cleanup point runs, and a
    /// reservation the room held cannot serve
    /// ([`poll_users_freed`](Self::poll_users_freed)); nothing to do on
    /// the common path: none waits.
    #[inline]
    pub(crate) fn poll_users(&mut self) {
        if !self.awaiting_users.is_empty() {
            self.settle_users(false);
        }
    }

    /// [`poll_users`](Self::poll_users), and whether it freed anything.
    pub(crate) fn poll_users_freed(&mut self) -> bool {
        !self.awaiting_users.is_empty() && self.settle_users(false)
    }

    /// Wait for every allocation released while other streams used it,
    /// and free it; `true` when any was freed (a cleanup then gives its
    /// memory back).
    pub(crate) fn wait_users(&mut self) -> bool {
        self.settle_users(true)
    }

    /// Free the awaiting allocations whose fences passed (`wait`: after
    /// waiting for each); whether any was freed.
    ///
    /// They wait in the order they were released, which is the order
    /// their fences were recorded, and a stream's work completes in order:
    /// once one fence on some streams has not passed, no later fence on
    /// the same streams has either, so it is not asked (as PyTorch stops
    /// at the first event of a stream not yet done). Same frees, one query
    /// a poll for each set of streams still behind instead of one for
    /// every allocation waiting on it.
    fn settle_users(&mut self, wait: bool) -> bool {
        if self.awaiting_users.is_empty() {
            return false;
        }
        let mut freed = false;
        // The sets of streams a fence not passed was found on this poll.
        let mut behind: Vec<Vec<UserStream>> = Vec::new();
        for key in std::mem::take(&mut self.awaiting_users) {
            // Whether its fence was recorded at its release, in order with
            // the ones after it (one the storage could not record then is
            // recorded now, later than they were, and says nothing of them).
            let (held_back, in_order) = self.users_of(key).map_or((false, false), |users| {
                let streams = &users.streams;
                (behind.iter().any(|b| b == streams), users.fence.is_some())
            });
            if held_back {
                self.awaiting_users.push(key);
                continue;
            }
            let done = match self.fence_of(key) {
                // Freed since (the stream's end): nothing waits any more.
                None => continue,
                Some(fence) => {
                    let done = self.users_done(fence, wait);
                    if !done
                        && in_order
                        && let Some(users) = self.users_of(key)
                    {
                        behind.push(users.streams.clone());
                    }
                    done
                }
            };
            if done {
                self.forget_users(key);
                self.free_slot(key, None);
                freed = true;
            } else {
                self.awaiting_users.push(key);
            }
        }
        freed
    }

    /// Free what was released while other streams used it, where their
    /// work is done: with any waiting, a flush, which asks their fences
    /// before and after the storage's work so far is sealed
    /// ([`flush`](Self::flush)); nothing otherwise. The paths that give
    /// memory back (a settle, an idle tick, a round) run it first, so that
    /// what they give back includes it: run only at the flush they end
    /// with, it freed the memory after they had given back, and a stream
    /// that lent to others held it past the load's fall
    /// (`docs/service.md`, "Serving another stream").
    pub fn free_used_by_others(&mut self) {
        self.process_releases();
        if !self.awaiting_users.is_empty() {
            self.flush();
        }
    }

    /// Allocations lent to another stream's clients
    /// ([`lend_to`](Self::lend_to)) that they still hold: the end of
    /// the stream waits a while for them, as for pins. A scan of the
    /// slots where any use is recorded (none: nothing to scan), for the
    /// end of a stream, not for a hot path.
    pub fn lent_out(&self) -> usize {
        if self.bytes_used_by_others == 0 {
            return 0;
        }
        (self.slots.iter())
            .filter(|(_, live)| {
                live.cell.lent_to.load(Ordering::Relaxed) != 0
                    && live.users.as_ref().is_some_and(|users| !users.released)
            })
            .count()
    }

    /// Bytes of the live allocations other streams use
    /// ([`record_use`](Self::record_use)), released or not: what they
    /// hold in place.
    pub fn bytes_used_by_others(&self) -> u64 {
        self.bytes_used_by_others
    }

    /// The allocation `key` names has no users any more.
    fn forget_users(&mut self, key: SlotKey) {
        if let Some(live) = self.slots.get_mut(key.slot())
            && live.users.take().is_some()
        {
            self.bytes_used_by_others = self.bytes_used_by_others.saturating_sub(live.size);
        }
    }

    /// Who uses the allocation `key` names (`None`: stale, or nobody).
    fn users_of(&self, key: SlotKey) -> Option<&Users> {
        self.slots.locate(key)?.users.as_deref()
    }

    /// The fence on the users of the allocation `key` names, recorded now
    /// if it was not yet (`None` inside: the storage could not record it,
    /// tried again at the next poll while the memory waits; `None`: the
    /// key is stale).
    fn fence_of(&mut self, key: SlotKey) -> Option<Option<UseFence>> {
        self.slots.locate(key)?;
        let users: &mut Users = self.slots.get_mut(key.slot())?.users.as_mut()?;
        if users.fence.is_none() {
            users.fence = self.storage.fence_uses(&users.streams).ok();
        }
        Some(users.fence)
    }

    /// Whether the work behind `fence` is done (`wait`: waited for first);
    /// a fence never recorded is done only when waited for, and only by
    /// the end of the stream, which frees everything anyway.
    fn users_done(&mut self, fence: Option<UseFence>, wait: bool) -> bool {
        match fence {
            Some(fence) if wait => {
                self.storage.wait_uses(fence);
                true
            }
            Some(fence) => self.storage.uses_done(fence),
            None => false,
        }
    }

    /// The end of the stream: wait for the users of every allocation
    /// other streams use, released or not (their handles go stale with
    /// the stream, and their memory goes back).
    pub(super) fn wait_every_user(&mut self) {
        let used: Vec<SlotKey> = (self.slots.iter())
            .filter(|(_, live)| live.users.is_some())
            .map(|(slot, _)| self.slots.key(slot))
            .collect();
        for key in used {
            if let Some(Some(fence)) = self.fence_of(key) {
                self.storage.wait_uses(fence);
            }
            self.forget_users(key);
        }
        self.awaiting_users.clear();
    }
}
