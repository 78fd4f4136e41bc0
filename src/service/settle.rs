//! Settling: when the load falls, a stream gives back what it no longer
//! needs, without an explicit cleanup.
//!
//! Pages a stream cached at its busiest stay cached after the load falls;
//! periodic cleanup returns only pages that are wholly empty, and only as
//! reservations drive each pool's clock. So the coordinator watches every
//! stream's bytes in use over a sliding window: a stream that holds more
//! than `ratio` times the most it had in use within the last `window` (plus
//! `slack`) is told to settle: return every empty page, then compact what
//! is left and move sparse pages into smaller ones
//! (`RelocationReason::Settle`). A stream under steady load keeps its cache (it used it within
//! the window); one whose load fell gives the excess back within about a
//! window. At most one settle per stream per window.

use super::actor::StreamActor;
use super::handle::StreamHandle;
use crate::memory::ADAPTIVE_MIN_PAGE_SIZE;
use crate::memory::{Cleanup, RelocationReason};
use std::collections::VecDeque;
use std::time::Duration;

/// When a stream holds more than it needed lately, it gives the excess back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settle {
    /// A stream may hold this many times the most it had in use within the
    /// window (1.04: 4 % above; an arena compacts to within a granule, so
    /// more would only keep free granules mapped).
    pub ratio: f64,
    /// How far back "lately" looks; also the least time between two settles
    /// of one stream.
    pub window: Duration,
    /// Excess below this many bytes is left alone (a page's worth: less
    /// is not worth a compaction).
    pub slack: u64,
}

impl Default for Settle {
    fn default() -> Self {
        Self {
            ratio: 1.04,
            window: Duration::from_secs(1),
            slack: ADAPTIVE_MIN_PAGE_SIZE,
        }
    }
}

impl Settle {
    /// The most a stream that needed `needed` bytes within the window may
    /// hold.
    pub fn keep(&self, needed: u64) -> u64 {
        ((needed as f64 * self.ratio) as u64).saturating_add(self.slack)
    }
}

/// What the coordinator remembers of one stream for settling.
#[derive(Debug, Default)]
pub(crate) struct SettleWatch {
    /// `(when, bytes in use)` samples within the window, oldest first.
    samples: VecDeque<(Duration, u64)>,
    /// When the stream was first watched or last told to settle.
    since: Option<Duration>,
}

impl SettleWatch {
    /// Record what `stream` publishes now; if it is due to settle, the
    /// bytes it holds and the bytes it should keep.
    pub(crate) fn observe(
        &mut self,
        settle: &Settle,
        stream: &StreamHandle,
        now: Duration,
    ) -> Option<(u64, u64)> {
        let stats = stream.stats();
        self.samples.push_back((now, stats.bytes_in_use));
        while self
            .samples
            .front()
            .is_some_and(|(at, _)| now.saturating_sub(*at) > settle.window)
        {
            self.samples.pop_front();
        }
        let since = *self.since.get_or_insert(now);
        if now.saturating_sub(since) < settle.window {
            return None;
        }
        let needed = self.samples.iter().map(|(_, bytes)| *bytes).max()?;
        let keep = settle.keep(needed);
        (stats.bytes_reserved > keep).then(|| {
            self.since = Some(now);
            (stats.bytes_reserved, keep)
        })
    }
}

/// The actor's side of the policy.
impl StreamActor {
    /// Give back what this stream did not need lately: every empty page,
    /// then, if it still holds more than `keep`, a compaction that also
    /// moves sparse pages into smaller ones.
    pub(crate) fn settle(&mut self, keep: u64) {
        self.take_back_hot();
        self.memory.cleanup(Cleanup::Explicit);
        if self.memory.bytes_reserved() > keep
            && let Ok(report) = self.memory.relocate(RelocationReason::Settle)
        {
            super::shared::bump(&self.shared.relocated, report.moved);
        }
        self.memory.flush();
        super::shared::bump(&self.shared.settles, 1);
    }
}
