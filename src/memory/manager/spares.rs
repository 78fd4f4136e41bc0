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

    /// Pass the spare handles kept on to the device's other streams
    /// (`DeviceStorage::pass_spares_on`), and keep no more: a stream that
    /// gave back for another's growth, whose maps can use them with no
    /// handle created. Nothing to do unless
    /// [`hold_spares`](Self::hold_spares) came first.
    pub(crate) fn pass_spares_on(&mut self) {
        if self.holding_spares {
            self.storage.pass_spares_on();
        }
        self.release_spares();
    }

    /// Adopt the handles the device's other streams passed on
    /// (`DeviceStorage::take_passed_on`), for the next growth to map;
    /// [`release_spares`](Self::release_spares) lets go of those it did
    /// not.
    pub(crate) fn take_passed_on(&mut self) {
        self.storage.take_passed_on();
        if self.storage.bytes_spare() > 0 {
            self.holding_spares = true;
        }
    }

    /// Bytes of the spare handles kept now (`DeviceStorage::bytes_spare`).
    pub(crate) fn bytes_spare(&self) -> u64 {
        self.storage.bytes_spare()
    }
}

#[cfg(test)]
mod tests {
    use crate::memory::{Cleanup, MemoryConfig, MemoryManager, PageUpdate};
    use crate::storage::{DeviceStorage, VirtualStorage};

    /// Spares kept for a growth that did not come (a request parked for
    /// the others' round, then a cleanup or an idle tick before its
    /// `Retry`) go to the driver with what the cleanup gives back: no
    /// growth follows a cleanup.
    #[test]
    fn a_cleanup_releases_the_spares_kept_for_a_growth() {
        for idle in [false, true] {
            let mut memory = MemoryManager::new(VirtualStorage::new(), MemoryConfig::default());
            let base = memory.reserve(1 << 20, PageUpdate::Allow).unwrap();
            drop(memory.reserve(32 << 20, PageUpdate::Allow).unwrap());
            memory.hold_spares();
            memory.give_back_free();
            memory.flush();
            assert!(memory.bytes_spare() >= 16 << 20, "idle {idle}: spares kept");
            if idle {
                memory.cleanup_idle();
            } else {
                memory.cleanup(Cleanup::Explicit);
            }
            memory.flush();
            assert_eq!(memory.bytes_spare(), 0, "idle {idle}");
            let held = memory.storage().bytes_allocated();
            assert!(
                held <= 2 << 20,
                "idle {idle}: only the live granule held, not {held}"
            );
            drop(base);
        }
    }
}
