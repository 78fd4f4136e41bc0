//! Settling: when the load falls, a stream gives back what it no longer
//! needs, without an explicit cleanup.
//!
//! The long form: `docs/modules.md`, "`src/service/settle.rs`".

use super::shared::StreamShared;
use crate::memory::ADAPTIVE_MIN_PAGE_SIZE;
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
    /// Memory comes back in pieces this large (a device's mapping granule,
    /// the smallest page): a stream may always keep what it needed rounded
    /// up to whole granules, since no compaction gets below that. A fixed
    /// allowance in bytes instead (what this was) let a stream of 45 MiB
    /// keep 4 % and 2 MiB more: 1.05-1.09 after its load fell.
    pub granule: u64,
}

impl Default for Settle {
    fn default() -> Self {
        Self {
            ratio: 1.04,
            window: Duration::from_secs(1),
            granule: ADAPTIVE_MIN_PAGE_SIZE,
        }
    }
}

impl Settle {
    /// The most a stream that needed `needed` bytes within the window may
    /// hold: `ratio` times that, or that in whole granules if more.
    pub fn keep(&self, needed: u64) -> u64 {
        let granule = self.granule.max(1);
        let whole = needed.div_ceil(granule).saturating_mul(granule);
        ((needed as f64 * self.ratio) as u64).max(whole)
    }
}

/// What the coordinator remembers of one stream for settling.
#[derive(Debug, Default)]
pub(crate) struct SettleWatch {
    /// `(when, bytes in use)` samples within the window, oldest first.
    samples: VecDeque<(Duration, u64)>,
    /// When the stream was first watched or last told to settle.
    since: Option<Duration>,
    /// The stream's settle count when it was last told to settle, until a
    /// sample shows that settle done. (A settle still not done a window
    /// later is told again: the window, not this, spaces the tells.)
    told_at: Option<u64>,
    /// What the stream still held after a settle that could not bring it
    /// within what it may keep (its pages' rounding, pinned allocations):
    /// it is not told again until it holds more than that, so a steady
    /// load whose pages cannot shrink is not relocated every window.
    could_not_go_below: Option<u64>,
}

impl SettleWatch {
    /// Record what `stream` publishes now; if it is due to settle, the
    /// bytes it holds and the bytes it should keep.
    pub(crate) fn observe(
        &mut self,
        settle: &Settle,
        stream: &StreamShared,
        now: Duration,
    ) -> Option<(u64, u64)> {
        let stats = stream.stats();
        // Done (or the stream was replaced and counts afresh): what it
        // holds now is what that settle could get it down to.
        if self.told_at.is_some_and(|settles| stats.settles != settles) {
            self.told_at = None;
            self.could_not_go_below = Some(stats.bytes_reserved);
        }
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
        if stats.bytes_reserved <= keep {
            self.could_not_go_below = None;
            return None;
        }
        let futile = self
            .could_not_go_below
            .is_some_and(|floor| stats.bytes_reserved <= floor);
        (!futile).then(|| {
            self.since = Some(now);
            self.told_at = Some(stats.settles);
            (stats.bytes_reserved, keep)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_stream_keeps_its_ratio_or_its_need_in_whole_granules() {
        let settle = Settle::default();
        // 45 MiB needed: 4 % is more than rounding up (46.8 against 46), and
        // a stream holding 48 MiB settles (the old allowance kept 48.8).
        assert_eq!(settle.keep(45 * MIB), (45.0 * MIB as f64 * 1.04) as u64);
        assert!(settle.keep(45 * MIB) < 48 * MIB);
        // 4.4 MiB needs three granules whatever the ratio says.
        assert_eq!(settle.keep(44 * MIB / 10), 6 * MIB);
        // Nothing needed: nothing kept.
        assert_eq!(settle.keep(0), 0);
        assert_eq!(settle.keep(u64::MAX), u64::MAX);
        let exact = Settle {
            granule: 0,
            ..settle
        };
        assert_eq!(exact.keep(MIB), (MIB as f64 * 1.04) as u64);
    }
}
