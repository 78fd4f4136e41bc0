//! What every policy of a stream's actor works on: the stream's manager,
//! the state it publishes to handles, and what the device's streams share.
//! The steps that need nothing more live here; running short
//! (`short.rs`) keeps state of its own.

use crate::memory::{MemoryError, MemoryManager, RelocationNeed, RelocationReason};
use crate::service::device::DeviceShared;
use crate::service::error::ServiceError;
use crate::service::events::SupervisorEvent;
use crate::service::message::Pending;
use crate::service::shared::{StreamShared, bump};
use crate::storage::{DeviceStorage, DriverPath, HandleCut, StorageError};
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use std::time::Duration;

/// Whether the device refused memory (what running short is about).
pub(super) fn is_out_of_memory(err: &MemoryError) -> bool {
    matches!(err, MemoryError::Storage(StorageError::OutOfMemory { .. }))
}

/// A stream's pools and the shared state its policies read and publish.
pub(crate) struct Stream {
    /// The pools.
    pub(super) memory: MemoryManager<Box<dyn DeviceStorage>>,
    /// What handles and the supervisor read.
    pub(super) shared: Arc<StreamShared>,
    /// What the device's streams share (budget, registry, coordinator).
    pub(super) device: Arc<DeviceShared>,
    /// How its storage cuts physical handles now (`fit_handle_cut`).
    pub(super) handle_cut: HandleCut,
}

impl Stream {
    /// The service's clock now.
    pub(super) fn now(&self) -> Duration {
        self.device.clock.now()
    }

    /// Publish what handles and the other streams' decisions read without
    /// a round trip: the pages held (bytes in use are counted as they
    /// change, `memory/live.rs`). The actor is the only writer: plain
    /// stores, and none when nothing changed.
    pub(super) fn publish(&mut self) {
        let in_reclaim = self.memory.bytes_in_reclaim();
        if in_reclaim != self.shared.bytes_in_reclaim.load(Ordering::Relaxed) {
            self.shared
                .bytes_in_reclaim
                .store(in_reclaim, Ordering::Relaxed);
        }
        let reserved = self.held();
        // Its own last store: what it published is what the counter holds.
        let published = self.shared.bytes_reserved.load(Ordering::Relaxed);
        if reserved == published {
            return;
        }
        if reserved > published {
            // It grew: the next growth maps with the share that fits.
            self.fit_handle_cut();
        }
        self.shared
            .bytes_reserved
            .store(reserved, Ordering::Release);
        if reserved > self.shared.peak_bytes_reserved.load(Ordering::Relaxed) {
            self.shared
                .peak_bytes_reserved
                .store(reserved, Ordering::Relaxed);
        }
    }

    /// Cut the storage's later physical handles as fits the device now.
    /// Alone, a share of what each range holds
    /// (`ServiceConfig::handle_share`, or the storage's default). While
    /// other streams share the device, the share the service was told for
    /// such streams (`ServiceConfig::shared_handle_share`, or the same),
    /// and on a device without a budget, of the most each range ever
    /// held: memory comes and goes between the streams there,
    /// and a cut that followed it would cut the pieces of a later growth
    /// to other lengths than the handles given back and handed over,
    /// which then could not be mapped there (`docs/memory.md`, "Physical
    /// handles"). Under a budget the cut follows what a range holds: a
    /// handle cut at the peak's share keeps more of its free granules
    /// from the grants of the others (a held-out serving trace needed a
    /// budget 1.0 % larger to fit). Asked after a growth (it takes the
    /// registry's lock), so it holds from the next.
    fn fit_handle_cut(&mut self) {
        let cut = self.device.handle_cut(self.alone());
        if cut != self.handle_cut {
            self.memory.storage().set_handle_cut(cut);
            self.handle_cut = cut;
        }
    }

    /// Run `f` with the storage counting the driver's operations for
    /// `path` (`storage::DriverPaths`), then switch back: what the actor
    /// does for a settle, a round, a trim past the headroom... is priced
    /// apart in the reports.
    pub(super) fn on_driver_path<R>(
        &mut self,
        path: DriverPath,
        f: impl FnOnce(&mut Self) -> R,
    ) -> R {
        let was = self.memory.storage().set_driver_path(path);
        let result = f(self);
        self.memory.storage().set_driver_path(was);
        result
    }

    /// Whether no other stream shares the device: then what this one gives
    /// back at the headroom could serve nobody, and a trim before a
    /// growth would only unmap what the growth maps again (the device's
    /// budget, when short, still gets it back: `short.rs`). Asked only
    /// where a trim is due (it takes the registry's lock).
    pub(super) fn alone(&self) -> bool {
        !self.device.has_others(self.shared.stream)
    }

    /// Bytes the stream holds from the device: its pools' pages, and the
    /// granules they gave back that the rest of their physical handle
    /// keeps (`storage/granules/`): what it could give back, and what
    /// settling must bring down.
    pub(super) fn held(&self) -> u64 {
        (self.memory.bytes_reserved()).saturating_add(self.memory.bytes_stranded())
    }

    /// Take back every allocation the stream's clients keep in their hot
    /// caches (`hot.rs`): swapped out of their slots without their threads,
    /// dropped here, processed as releases at once.
    pub(super) fn take_back_hot(&mut self) {
        let taken = self.shared.hot.take_back();
        if taken > 0 {
            bump(&self.shared.hot_taken_back, taken);
            self.memory.process_releases();
        }
    }

    /// No request for a whole tick: run the cleanup a reservation would,
    /// with the clock moved past every pool's period (an idle stream gives
    /// back what sits unused), and empty outdated pages; and give the
    /// driver what earlier give-backs left behind fences that passed.
    pub(super) fn idle_tick(&mut self) {
        self.take_back_hot();
        self.memory.free_used_by_others();
        self.memory.cleanup_idle();
        if self.memory.relocation_need() != RelocationNeed::None
            && let Ok(report) = self.memory.relocate(RelocationReason::Compaction)
        {
            bump(&self.shared.relocated, report.moved);
        }
        self.memory.flush();
        bump(&self.shared.idle_cleanups, 1);
        self.publish();
    }

    /// Answer `pending` with an `OutOfMemory` breakdown of the device.
    pub(super) fn fail(&mut self, pending: Pending) {
        let requested = pending.requested();
        let stream = self.shared.stream;
        self.publish();
        self.device
            .tell(SupervisorEvent::OutOfMemory { stream, requested });
        let needed = self
            .memory
            .new_page_size(requested, crate::memory::AllocationMode::Auto)
            .ok();
        let report = self.device.out_of_memory(stream, requested, needed);
        pending.answer(Err(ServiceError::OutOfMemory(Box::new(report))));
    }

    /// Give back what this stream did not need lately: every empty page,
    /// then, if it still holds more than `keep`, a compaction that also
    /// moves sparse pages into smaller ones.
    pub(super) fn settle(&mut self, keep: u64) {
        self.take_back_hot();
        self.memory.free_used_by_others();
        // Spares kept for a parked request's growth go now: what a settle
        // gives back goes to the driver.
        self.memory.release_spares();
        self.memory.give_back_free();
        if self.held() > keep
            && let Ok(report) = (self.memory).relocate(RelocationReason::Settle)
        {
            crate::service::shared::bump(&self.shared.relocated, report.moved);
        }
        self.memory.flush();
        crate::service::shared::bump(&self.shared.settles, 1);
    }
}
