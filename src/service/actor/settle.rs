//! Settling on the actor: told by the coordinator that it holds more than
//! it needed lately (`service/settle.rs`), a stream gives the excess back.

use super::stream::Stream;
use crate::memory::{Cleanup, RelocationReason};

impl Stream {
    /// Give back what this stream did not need lately: every empty page,
    /// then, if it still holds more than `keep`, a compaction that also
    /// moves sparse pages into smaller ones.
    pub(super) fn settle(&mut self, keep: u64) {
        self.take_back_hot();
        self.memory.cleanup(Cleanup::Explicit);
        if self.memory.bytes_reserved() > keep
            && let Ok(report) = self.memory.relocate(RelocationReason::Settle)
        {
            crate::service::shared::bump(&self.shared.relocated, report.moved);
        }
        self.memory.flush();
        crate::service::shared::bump(&self.shared.settles, 1);
    }
}
