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
    /// of one stream. A stream's own window doubles, up to `backoff`
    /// times, each time a settle of it proves early, and halves back each
    /// time one holds (see `SettleWatch`).
    pub window: Duration,
    /// How many times a stream's window may double: a settle whose
    /// give-back the stream takes back (it holds more than half of what it
    /// gave back again) within two of its windows was early, and the
    /// stream's window doubles; one that holds that long halves it back
    /// towards `window`. 3: at most 8 s from the 1 s default. 0: every
    /// stream settles on `window`.
    pub backoff: u32,
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
            backoff: 3,
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

    /// The longest a stream's window gets: `window` doubled `backoff`
    /// times.
    pub fn longest_window(&self) -> Duration {
        let times = 1u32.checked_shl(self.backoff).unwrap_or(u32::MAX);
        self.window.saturating_mul(times)
    }
}

/// A tell to settle: the stream's settle count then (the settle is done
/// once it moves on), and what the stream held.
#[derive(Debug, Clone, Copy)]
struct Told {
    settles: u64,
    held: u64,
}

/// A settle done: when, and what the stream held before and after it.
#[derive(Debug, Clone, Copy)]
struct GaveBack {
    at: Duration,
    before: u64,
    after: u64,
}

/// What the coordinator remembers of one stream for settling.
#[derive(Debug, Default)]
pub(crate) struct SettleWatch {
    /// `(when, bytes in use)` samples within the window, oldest first.
    samples: VecDeque<(Duration, u64)>,
    /// When the stream was first watched or last told to settle.
    since: Option<Duration>,
    /// The stream's last tell to settle, until a sample shows that settle
    /// done. (A settle still not done a window later is told again: the
    /// window, not this, spaces the tells.)
    told: Option<Told>,
    /// What the stream still held after a settle that could not bring it
    /// within what it may keep (its pages' rounding, pinned allocations):
    /// it is not told again until it holds more than that, so a steady
    /// load whose pages cannot shrink is not relocated every window.
    could_not_go_below: Option<u64>,
    /// The last settle that gave something back, until it is judged: the
    /// stream takes it back within two of its windows (early: the window
    /// doubles) or does not (the window halves).
    judging: Option<GaveBack>,
    /// The stream's own window, where it is not the policy's.
    window: Option<Duration>,
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
        if let Some(told) = self.told
            && stats.settles != told.settles
        {
            self.told = None;
            self.could_not_go_below = Some(stats.bytes_reserved);
            self.judging = (stats.bytes_reserved < told.held).then_some(GaveBack {
                at: now,
                before: told.held,
                after: stats.bytes_reserved,
            });
        }
        self.judge(settle, stats.bytes_reserved, now);
        let window = self.window(settle);
        self.samples.push_back((now, stats.bytes_in_use));
        while self
            .samples
            .front()
            .is_some_and(|(at, _)| now.saturating_sub(*at) > window)
        {
            self.samples.pop_front();
        }
        let since = *self.since.get_or_insert(now);
        if now.saturating_sub(since) < window {
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
            self.told = Some(Told {
                settles: stats.settles,
                held: stats.bytes_reserved,
            });
            (stats.bytes_reserved, keep)
        })
    }

    /// This stream's settle window now: the policy's, or longer while its
    /// settles have proved early.
    pub(crate) fn window(&self, settle: &Settle) -> Duration {
        self.window.unwrap_or(settle.window)
    }

    /// Judge the last settle by what the stream holds `now`: taken back
    /// (more than half of what it gave back held again) within two
    /// windows, it was early and the window doubles, up to the policy's
    /// longest; not taken back by then, the window halves, down to the
    /// policy's. A load that dips for a little longer than a window and
    /// comes back (a training run's shorter batches) would otherwise give
    /// its memory back and map it again at every dip.
    fn judge(&mut self, settle: &Settle, held: u64, now: Duration) {
        let Some(gave) = self.judging else {
            return;
        };
        let window = self.window(settle);
        let half_given = gave.before.saturating_sub(gave.after) / 2;
        let taken_back = held > gave.after.saturating_add(half_given);
        let longer = if taken_back {
            window.saturating_mul(2).min(settle.longest_window())
        } else if now.saturating_sub(gave.at) > window.saturating_mul(2) {
            window.checked_div(2).unwrap_or_default().max(settle.window)
        } else {
            return;
        };
        self.window = (longer != settle.window).then_some(longer);
        self.judging = None;
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

    #[test]
    fn a_window_doubles_while_settles_are_taken_back_and_halves_once_one_holds() {
        let settle = Settle::default();
        let second = Duration::from_secs(1);
        let mut watch = SettleWatch::default();
        let gave = |at| {
            Some(GaveBack {
                at,
                before: 100 * MIB,
                after: 40 * MIB,
            })
        };
        // Taken back (more than half of the 60 MiB given back): doubled,
        // three times at most.
        for expected in [2, 4, 8, 8] {
            watch.judging = gave(Duration::ZERO);
            watch.judge(&settle, 71 * MIB, second);
            assert_eq!(watch.window(&settle), expected * second);
        }
        // Less than half of it again, and not two windows yet: not judged.
        watch.judging = gave(Duration::ZERO);
        watch.judge(&settle, 70 * MIB, 16 * second);
        assert_eq!(watch.window(&settle), 8 * second);
        assert!(watch.judging.is_some());
        // Two windows on, it held: halved, down to the policy's.
        for expected in [4, 2, 1, 1] {
            watch.judging = gave(Duration::ZERO);
            watch.judge(&settle, 70 * MIB, 17 * second);
            assert_eq!(watch.window(&settle), expected * second);
        }
        // Without backoff the window never moves.
        let fixed = Settle {
            backoff: 0,
            ..settle
        };
        watch.judging = gave(Duration::ZERO);
        watch.judge(&fixed, 100 * MIB, second);
        assert_eq!(watch.window(&fixed), second);
        assert_eq!(fixed.longest_window(), second);
        assert_eq!(settle.longest_window(), 8 * second);
    }
}
