//! The slot table: where each live allocation is recorded. A handle names
//! its allocation by `(slot, generation)`; a slot's generation moves on
//! each time it is freed or rebound, so a stale handle finds a different
//! generation and is refused, never shown another allocation's bytes
//! (sharded-slab's scheme). Freed slots are reused, newest first.
//!
//! The table also answers the questions every path that frees or moves
//! bytes must ask: is this allocation pinned ([`Live::is_pinned`]), and
//! may it move ([`Live::stays_put`])?

use super::SlotKey;
use crate::memory::handle::AllocationCell;
use crate::memory::pool::Placement;
use crate::memory::taint::TaintRanges;
use crate::sync::Arc;

/// A live allocation as its slot records it.
#[derive(Debug)]
pub(crate) struct Live {
    /// Index of its pool.
    pub(crate) pool: u8,
    /// Where the pool put it.
    pub(crate) placement: Placement,
    /// Bytes asked for.
    pub(crate) size: u64,
    /// Bytes taken (aligned).
    pub(crate) aligned: u64,
    /// The cursor `bind` recorded.
    pub(crate) cursor: u64,
    /// The cell its handles share (kept so relocation can publish moves).
    pub(crate) cell: Arc<AllocationCell>,
    /// Byte ranges that point at a failure.
    pub(crate) taint: TaintRanges,
    /// Cells this allocation was bound away from (`bind`) while pinned
    /// through them: those pins keep the bytes in place too. Usually empty.
    pub(crate) retired: Vec<Arc<AllocationCell>>,
    /// Other streams that use it (`record_use`). Usually `None`.
    pub(crate) users: Option<Box<super::Users>>,
}

impl Live {
    /// Whether a pin holds the allocation in place: one taken through its
    /// cell, or through a cell it was bound away from. The one "is it
    /// pinned" test (the `MOVING` bit is not a pin).
    #[inline]
    pub(crate) fn is_pinned(&self) -> bool {
        is_pinned(&self.cell) || self.pinned_through_retired()
    }

    /// Whether its bytes must stay where they are: a pin holds them, or
    /// other streams use them and may not see them move
    /// ([`users_hold_in_place`](Self::users_hold_in_place)). What every
    /// path that moves bytes asks.
    pub(crate) fn stays_put(&self) -> bool {
        self.is_pinned() || self.users_hold_in_place()
    }

    /// Whether other streams' work uses it where it is: it was released
    /// and waits for their work (it is going: a move gains nothing), or it
    /// was not lent (`record_use` of an allocation the owner's clients
    /// hold: code such as PyTorch's keeps its raw address). A loan its
    /// borrower holds may move: the move is ordered after the borrower's
    /// work and the borrower's after the move (`Mover::claim`,
    /// `Mover::publish`), and the borrower's clients reach it through its
    /// cell, whose address a move publishes.
    pub(crate) fn users_hold_in_place(&self) -> bool {
        self.users.as_ref().is_some_and(|users| {
            users.released
                || self
                    .cell
                    .lent_to
                    .load(crate::sync::atomic::Ordering::Relaxed)
                    == 0
        })
    }

    /// Whether only pins through retired cells hold it (the last of those
    /// pins to drop queues no release that names this allocation).
    pub(crate) fn pinned_only_through_retired(&self) -> bool {
        !is_pinned(&self.cell) && self.pinned_through_retired()
    }

    /// Whether a pin through a cell it was bound away from holds it.
    #[inline]
    pub(crate) fn pinned_through_retired(&self) -> bool {
        self.retired.iter().any(|cell| is_pinned(cell))
    }

    /// Hand the allocation to `cell` (a `bind`): pins through the old cell
    /// still hold the bytes, so it is kept where every pinned test looks (no
    /// new pin can take hold of it: its published address is gone).
    pub(crate) fn rebind(&mut self, cell: Arc<AllocationCell>) {
        let old = std::mem::replace(&mut self.cell, cell);
        self.retired.retain(|cell| is_pinned(cell));
        if is_pinned(&old) {
            self.retired.push(old);
        }
    }
}

/// Whether a pin is held through `cell`.
#[inline]
pub(crate) fn is_pinned(cell: &AllocationCell) -> bool {
    cell.pins.is_pinned()
}

/// One entry of the slot table.
#[derive(Debug)]
struct Slot {
    /// Moves on each time the slot is freed or rebound (never 0).
    generation: u32,
    /// The allocation, while live.
    live: Option<Live>,
}

/// The slots, and which are free.
#[derive(Debug, Default)]
pub(crate) struct SlotTable {
    /// By index.
    slots: Vec<Slot>,
    /// Free slot indices, newest last.
    free: Vec<u32>,
}

impl SlotTable {
    /// A slot for a new allocation (give it back with [`unclaim`] if the
    /// reservation fails before [`fill`]).
    ///
    /// [`unclaim`]: Self::unclaim
    /// [`fill`]: Self::fill
    pub(crate) fn claim(&mut self) -> u32 {
        self.free.pop().unwrap_or_else(|| {
            self.slots.push(Slot {
                generation: 1,
                live: None,
            });
            (self.slots.len() - 1) as u32
        })
    }

    /// A claimed slot that was not filled after all.
    pub(crate) fn unclaim(&mut self, slot: u32) {
        self.free.push(slot);
    }

    /// The key a handle of `slot`'s allocation carries now.
    pub(crate) fn key(&self, slot: u32) -> SlotKey {
        SlotKey::new(slot, self.slots[slot as usize].generation)
    }

    /// Record `live` in the claimed `slot`.
    ///
    /// Inlined, as [`free`](Self::free) is: a `Live` passed or returned
    /// through a call is copied through the stack field by field and read
    /// back whole, and those stalls were a fifth of a reservation and its
    /// release (`serving-s1`, manager alone: 4.75 -> 3.46 ms a replay).
    #[inline]
    pub(crate) fn fill(&mut self, slot: u32, live: Live) {
        self.slots[slot as usize].live = Some(live);
    }

    /// The live allocation in `slot`, whatever its generation.
    pub(crate) fn get(&self, slot: u32) -> Option<&Live> {
        self.slots.get(slot as usize)?.live.as_ref()
    }

    /// [`get`](Self::get), mutably.
    pub(crate) fn get_mut(&mut self, slot: u32) -> Option<&mut Live> {
        self.slots.get_mut(slot as usize)?.live.as_mut()
    }

    /// The live allocation `key` names, if the key is current.
    pub(crate) fn locate(&self, key: SlotKey) -> Option<&Live> {
        let (slot, generation) = (key.slot(), key.generation());
        let entry = self.slots.get(slot as usize)?;
        (entry.generation == generation).then_some(())?;
        entry.live.as_ref()
    }

    /// Free `slot`: its allocation comes out and every handle of it is
    /// stale from now on.
    #[inline]
    pub(crate) fn free(&mut self, slot: u32) -> Option<Live> {
        let entry = self.slots.get_mut(slot as usize)?;
        let live = entry.live.take()?;
        entry.generation = next_generation(entry.generation);
        self.free.push(slot);
        Some(live)
    }

    /// Move `slot`'s generation on (a rebind: the old handles are stale)
    /// and return the new key.
    pub(crate) fn renew(&mut self, slot: u32) -> SlotKey {
        let entry = &mut self.slots[slot as usize];
        entry.generation = next_generation(entry.generation);
        SlotKey::new(slot, entry.generation)
    }

    /// Every live allocation, with its slot.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Live)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| slot.live.as_ref().map(|live| (index as u32, live)))
    }

    /// Live allocations that are pinned now.
    pub(crate) fn pinned_count(&self) -> usize {
        self.iter().filter(|(_, live)| live.is_pinned()).count()
    }

    /// Every cell through which a pin holds a live allocation now.
    pub(crate) fn pinned_cells(&self) -> Vec<Arc<AllocationCell>> {
        self.iter()
            .flat_map(|(_, live)| std::iter::once(&live.cell).chain(&live.retired))
            .filter(|cell| is_pinned(cell))
            .cloned()
            .collect()
    }

    /// Free every slot whose allocation `keep` does not keep, handing each
    /// allocation that comes out to `freed`.
    pub(crate) fn free_all_but(
        &mut self,
        keep: impl Fn(&Live) -> bool,
        mut freed: impl FnMut(Live),
    ) {
        for index in 0..self.slots.len() as u32 {
            if self.get(index).is_some_and(|live| !keep(live))
                && let Some(live) = self.free(index)
            {
                freed(live);
            }
        }
    }
}

/// The generation after `generation`, skipping 0 (the unbound marker).
fn next_generation(generation: u32) -> u32 {
    match generation.wrapping_add(1) {
        0 => 1,
        next => next,
    }
}
