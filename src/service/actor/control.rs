//! What a stream actor does with the coordinator's control traffic
//! (`Control`, on an unbounded channel that never blocks the sender):
//! give back for another stream's recovery round, retry what is parked
//! when its own round ends, settle, compact.

use super::StreamActor;
use crate::memory::{Cleanup, RelocationReason};
use crate::service::device::Notice;
use crate::service::protocol::Control;

impl StreamActor {
    /// Serve what the coordinator sent.
    pub(crate) fn handle_control(&mut self, control: Control) {
        match control {
            Control::GiveBack { episode } => {
                self.take_back_hot();
                let before = self.memory.bytes_allocated();
                self.memory.cleanup(Cleanup::Explicit);
                if let Ok(report) = self.memory.relocate(RelocationReason::Short) {
                    crate::service::shared::bump(&self.shared.relocated, report.moved);
                }
                self.memory.flush();
                let freed = before.saturating_sub(self.memory.bytes_allocated());
                self.publish();
                self.shared.gave_back_all();
                self.device.notify(Notice::GaveBack {
                    stream: self.shared.stream,
                    episode,
                    freed,
                });
            }
            Control::Retry => {
                self.short_pending = false;
                self.retry_parked(true);
            }
            Control::Settle { keep } => self.settle(keep),
            Control::Idle => self.idle_tick(),
            Control::Compact => {
                if let Ok(report) = self.memory.relocate(RelocationReason::Compaction) {
                    crate::service::shared::bump(&self.shared.relocated, report.moved);
                }
            }
        }
        self.publish();
    }
}
