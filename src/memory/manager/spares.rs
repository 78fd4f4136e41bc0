//! Spare physical handles, for an owner that gives memory back on its way
//! to a growth (a stream's trim at its headroom): what the cleanups give
//! back in between stays as spares for the growth's maps to move
//! (`DeviceStorage::hold_spares`; `docs/memory.md`, "Spare handles").

use super::MemoryManager;
use crate::storage::DeviceStorage;

impl<S: DeviceStorage> MemoryManager<S> {
    /// Keep what the next cleanups give back as spare physical handles
    /// for a growth to move, until [`release_spares`](Self::release_spares)
    /// (`DeviceStorage::hold_spares`): a stream that trims on its way to a
    /// growth.
    pub(crate) fn hold_spares(&mut self) {
        self.holding_spares = true;
        self.storage.hold_spares(true);
    }

    /// Keep no more spares, and release those kept. Nothing to do unless
    /// [`hold_spares`](Self::hold_spares) came first (the storage keeps
    /// spares only while held, and a growth releases its own): the
    /// service asks this of every request it answers.
    pub(crate) fn release_spares(&mut self) {
        if !std::mem::take(&mut self.holding_spares) {
            debug_assert_eq!(self.storage.bytes_spare(), 0, "spares kept unheld");
            return;
        }
        self.storage.hold_spares(false);
        self.storage.release_spares();
    }

    /// Bytes of the spare handles kept now (`DeviceStorage::bytes_spare`).
    pub(crate) fn bytes_spare(&self) -> u64 {
        self.storage.bytes_spare()
    }
}
