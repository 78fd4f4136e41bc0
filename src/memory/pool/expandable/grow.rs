//! A growth, from its first step to its last: when no mapped free block
//! holds a reservation, the pool tries what costs no new memory before it
//! maps any.
//!
//! The long form: `docs/modules.md`, "`src/memory/pool/expandable/grow.rs`".

use super::ExpandablePool;
use super::compact::Evacuate;
use crate::memory::policy::PageUpdate;
use crate::memory::pool::mover::Mover;
use crate::memory::pool::page::{Placement, Wanted};
use crate::storage::{DeviceStorage, DriverPath, StorageError};

impl ExpandablePool {
    /// Serve `aligned` bytes for `slot` that the mapped room did not hold:
    /// moving allocations only where `update` allows, mapping last.
    pub(in crate::memory::pool) fn grow(
        &mut self,
        mover: &mut Mover<'_>,
        wanted: Wanted,
        update: PageUpdate,
    ) -> Result<Placement, StorageError> {
        // What the growth unmaps it may map again elsewhere: the storage
        // keeps those handles as spares until the growth ends, and moves
        // them where it maps (`DeviceStorage::hold_spares`). The growth
        // ends any hold its owner set too (a stream's trim on its way
        // here, `service/actor/reserve.rs`): what that trim kept went to
        // this growth's maps, and the rest goes now, before anything is
        // answered.
        mover.storage.hold_spares(true);
        let grown = self.grow_holding_spares(mover, wanted, update);
        mover.storage.hold_spares(false);
        mover.storage.release_spares();
        grown
    }

    fn grow_holding_spares(
        &mut self,
        mover: &mut Mover<'_>,
        wanted: Wanted,
        update: PageUpdate,
    ) -> Result<Placement, StorageError> {
        // What the growth gives back first is a trim, and what it moves
        // to spare a growth a compaction (`DriverPaths`): only the maps of
        // new memory are the growth's own.
        let growth = mover.storage.set_driver_path(DriverPath::Trim);
        self.unmap_before_growth(mover.storage, wanted.aligned);
        let room = (update == PageUpdate::Allow).then(|| {
            mover.storage.set_driver_path(DriverPath::Compaction);
            self.make_room(mover, wanted)
        });
        mover.storage.set_driver_path(growth);
        match room.flatten() {
            Some(placement) => Ok(placement),
            None => self.reserve_new_page(mover.storage, wanted),
        }
    }

    /// Room for `aligned` bytes by moving allocations, in the order that
    /// costs least memory first; `None` when no step paid.
    fn make_room(&mut self, mover: &mut Mover<'_>, wanted: Wanted) -> Option<Placement> {
        self.evacuate_before_growth(mover, Evacuate::PastHighWater, wanted)
            .or_else(|| self.compact_before_growth(mover, wanted))
            .or_else(|| self.slide_before_growth(mover, wanted))
            .or_else(|| self.evacuate_before_growth(mover, Evacuate::MostlyFree, wanted))
    }

    /// Before the pool maps more for `aligned` bytes, unmap as many free
    /// granules as it is about to map.
    fn unmap_before_growth(&mut self, storage: &mut dyn DeviceStorage, aligned: u64) {
        let level = self
            .mapped()
            .max(self.kept_mapped())
            .saturating_sub(self.new_page_size(aligned));
        self.unmap_past(storage, level);
    }

    /// Unmap free granules, the longest idle first, until the pool maps no
    /// more than `bytes` (or none is left), and flush what went.
    pub(super) fn unmap_past(&mut self, storage: &mut dyn DeviceStorage, bytes: u64) {
        let surplus = self.mapped().saturating_sub(bytes);
        if surplus > 0 && self.unmap_longest_idle(storage, surplus) {
            storage.flush();
        }
    }

    /// After a reservation that may change pages: give back what the pool
    /// holds free past its slack, and flush what went. After, so that the
    /// room a release just left serves the reservation first.
    #[inline]
    pub(crate) fn trim_after_reserve(&mut self, storage: &mut dyn DeviceStorage) {
        if self.trim(storage) {
            storage.flush();
        }
    }
}
