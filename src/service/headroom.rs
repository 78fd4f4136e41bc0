//! Headroom: how far the device's reserved bytes may run ahead of its live
//! bytes before a growing stream first gets the others to give back.
//!
//! The long form: `docs/modules.md`, "`src/service/headroom.rs`".

use crate::memory::{ADAPTIVE_MIN_PAGE_SIZE, MemoryConfig, PoolKind};

/// How far reserved bytes may run ahead of live bytes (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Headroom {
    /// Reserved may pass live by this fraction of live (0.01: 1 %).
    pub fraction: f64,
    /// ... or by this many bytes, whichever is more: below a few pages,
    /// trimming costs more than it wins back.
    pub slack: u64,
}

impl Default for Headroom {
    /// 1 %, for the default memory: expandable arenas that keep the room
    /// their peak needed (`MemoryConfig::keep_peak_mapped`), which another
    /// stream's growth wins back once the device passes its peak live by
    /// this much. See [`for_memory`](Self::for_memory) for other layouts.
    fn default() -> Self {
        Self {
            fraction: 0.01,
            slack: 2 * ADAPTIVE_MIN_PAGE_SIZE,
        }
    }
}

impl Headroom {
    /// 4 %, for streams whose pools cache whole pages (the `Adaptive` and
    /// `ExclusivePages` layouts) or trim their arenas after every
    /// reservation (`keep_peak_mapped` off): rounds sooner than that cost
    /// those layouts more memory than they win (`docs/performance.md`,
    /// "What each decision costs").
    pub fn for_pages() -> Self {
        Self {
            fraction: 0.04,
            ..Self::default()
        }
    }

    /// The headroom that suits streams whose pools are `memory`'s.
    pub fn for_memory(memory: &MemoryConfig) -> Self {
        let arenas = memory
            .pools
            .pools(&memory.device)
            .iter()
            .any(|pool| matches!(pool.kind, PoolKind::Expandable { .. }));
        if memory.keep_peak_mapped && arenas {
            Self::default()
        } else {
            Self::for_pages()
        }
    }

    /// The excess a stream with `live` bytes in use may keep while the
    /// device is past its headroom: its fraction, and at least one minimum
    /// adaptive page.
    pub fn share(&self, live: u64) -> u64 {
        self.fraction_of(live).max(ADAPTIVE_MIN_PAGE_SIZE)
    }

    /// Whether a device holding `reserved` bytes with `live` in use is
    /// past its headroom.
    pub fn exceeded(&self, reserved: u64, live: u64) -> bool {
        self.excess(reserved, live) > 0
    }

    /// Bytes a device holding `reserved` with `live` in use holds past
    /// its headroom (0 within it).
    pub(crate) fn excess(&self, reserved: u64, live: u64) -> u64 {
        reserved.saturating_sub(live.saturating_add(self.fraction_of(live).max(self.slack)))
    }

    fn fraction_of(&self, live: u64) -> u64 {
        (live as f64 * self.fraction) as u64
    }
}

/// A stream growing past the headroom asks the others for a round only if
/// they hold at least this much unused.
pub(crate) const MIN_ROUND_GAIN: u64 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    // Where `exceeded` draws the line: `tests/headroom.rs`.
    #[test]
    fn a_streams_share_is_its_fraction_and_at_least_a_page() {
        let headroom = Headroom {
            fraction: 0.05,
            slack: 8 * MIB,
        };
        assert_eq!(headroom.share(1000 * MIB), 50 * MIB);
        assert_eq!(headroom.share(0), ADAPTIVE_MIN_PAGE_SIZE);
    }

    #[test]
    fn extremes_do_not_overflow() {
        let headroom = Headroom::default();
        assert!(!headroom.exceeded(u64::MAX, u64::MAX));
        assert!(headroom.exceeded(u64::MAX, 0));
    }
}
