//! The clock every time-driven policy reads.
//!
//! The long form: `docs/modules.md`, "`src/clock.rs`".

use crate::sync::unmodelled::{Arc, AtomicU64, Ordering};
use std::fmt;
use std::time::{Duration, Instant};

/// Where time comes from. `now` is the time since the clock began; it never
/// goes back.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Time since the clock began.
    fn now(&self) -> Duration;

    /// The manual clock, if this is one: time then passes only when its
    /// owner moves it, and nothing wakes on its own to run the timers.
    fn as_manual(&self) -> Option<&ManualClock> {
        None
    }
}

/// A clock as the service holds it (shared by the supervisor, its
/// coordinator and every stream).
pub type SharedClock = Arc<dyn Clock>;

/// The wall clock (monotonic: [`Instant`]).
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    start: Instant,
}

impl WallClock {
    /// A wall clock starting now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    /// The same, shared.
    pub fn shared() -> SharedClock {
        Arc::new(Self::new())
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for WallClock {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }
}

/// A clock that moves only when told ([`advance`](Self::advance),
/// [`advance_to`](Self::advance_to)): a replay's trace time, a test's
/// steps. With one in the service, run its timers with
/// [`Supervisor::tick`](crate::service::Supervisor::tick).
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
}

impl ManualClock {
    /// A manual clock at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same, shared (keep a clone of the `Arc` to move it).
    pub fn shared() -> Arc<ManualClock> {
        Arc::new(Self::new())
    }

    /// Move the clock forward by `by` (saturating at about 584 years).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                Some(now.saturating_add(by))
            });
    }

    /// Move the clock to `to`; a time before now leaves it where it is (a
    /// clock never goes back).
    pub fn advance_to(&self, to: Duration) {
        let to = u64::try_from(to.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_max(to, Ordering::AcqRel);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Acquire))
    }

    fn as_manual(&self) -> Option<&ManualClock> {
        Some(self)
    }
}

/// `wait` after `now`; a wait too long to name (a caller's `Duration::MAX`)
/// is a century, which no caller outlives.
pub(crate) fn deadline(now: Duration, wait: Duration) -> Duration {
    now.checked_add(wait)
        .unwrap_or_else(|| now.saturating_add(Duration::from_secs(100 * 365 * 24 * 3600)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_forward_and_only_when_told() {
        let clock = ManualClock::new();
        assert_eq!(clock.now(), Duration::ZERO);
        clock.advance(Duration::from_millis(5));
        clock.advance_to(Duration::from_millis(3));
        assert_eq!(clock.now(), Duration::from_millis(5));
        clock.advance_to(Duration::from_secs(2));
        assert_eq!(clock.now(), Duration::from_secs(2));
        clock.advance(Duration::MAX);
        assert_eq!(clock.now(), Duration::from_nanos(u64::MAX));
        assert!(clock.as_manual().is_some());
    }

    #[test]
    fn the_wall_clock_is_not_manual() {
        assert!(WallClock::new().as_manual().is_none());
    }

    #[test]
    fn a_deadline_past_the_clock_is_a_century() {
        let far = deadline(Duration::from_secs(1), Duration::MAX);
        assert!(far > Duration::from_secs(100 * 365 * 24 * 3600));
    }
}
