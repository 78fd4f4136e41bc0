//! What a stream actor does with the coordinator's control traffic
//! (`Control`, on an unbounded channel that never blocks the sender):
//! give back for another stream's recovery round, retry what is parked
//! when its own round ends, settle, compact.

use super::StreamActor;
use super::stream::Stream;
use crate::memory::{RelocationNeed, RelocationReason};
use crate::service::device::Notice;
use crate::service::protocol::Control;
use crate::service::shared::bump;

impl StreamActor {
    /// Serve what the coordinator sent.
    pub(crate) fn handle_control(&mut self, control: Control) {
        let stream = &mut self.stream;
        match control {
            Control::GiveBack { episode, short } => stream.give_back(episode, short),
            Control::Retry => self.short.round_over(stream),
            Control::Settle { keep } => stream.settle(keep),
            Control::Idle => stream.idle_tick(),
            // The coordinator reads the stream's totals; where the pools
            // keep their peak's room mapped, they decide (that room is no
            // fragmentation, and a compaction would give it back).
            Control::Compact
                if !stream.memory.keeps_peak_mapped()
                    || stream.memory.relocation_need() != RelocationNeed::None =>
            {
                if let Ok(report) = stream.memory.relocate(RelocationReason::Compaction) {
                    bump(&stream.shared.relocated, report.moved);
                }
            }
            Control::Compact => {}
        }
        stream.publish();
    }
}

impl Stream {
    /// Another stream's recovery round (`episode`) asks: give back every
    /// cached page and compact, then tell the coordinator how much went.
    /// For a stream `short` of memory, what went back is waited for (its
    /// last try); past the headroom, it goes in stream order.
    fn give_back(&mut self, episode: u64, short: bool) {
        self.take_back_hot();
        let before = self.memory.bytes_allocated();
        self.memory.give_back_free();
        if let Ok(report) = self.memory.relocate(RelocationReason::Short) {
            bump(&self.shared.relocated, report.moved);
        }
        if short {
            self.memory.drain();
        } else {
            self.memory.flush();
        }
        let freed = before.saturating_sub(self.memory.bytes_allocated());
        self.publish();
        self.shared.gave_back_all();
        self.device.notify(Notice::GaveBack {
            stream: self.shared.stream,
            episode,
            freed,
        });
    }
}
