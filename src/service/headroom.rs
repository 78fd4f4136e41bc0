//! Headroom: how far the device's reserved bytes may run ahead of its live
//! bytes before a growing stream first gets the others to give back.
//!
//! Each stream caches the pages it emptied, so on a device of several
//! streams the pages held drift towards the sum of every stream's own high
//! water mark, while the device never has that much live at once. Reserved
//! bytes only grow when a stream takes a new page, so that is where the
//! policy acts: when the device already holds more than `fraction` (or
//! `slack` bytes, whichever is more) above what is live, a stream that would
//! grow first tries the room it holds, then trims its own pages, then asks
//! the other streams to give back (the running-short protocol, see
//! `short.rs`), and only then takes the page. Growth is never refused: the
//! headroom is a target, a budget is the limit. Streams past their share of
//! the excess also trim themselves after each request (`trim_to_headroom`).

use super::actor::StreamActor;
use super::short::{Pending, PendingState};
use crate::memory::{ADAPTIVE_MIN_PAGE_SIZE, AllocationMode, Cleanup, RelocationReason};

/// How far reserved bytes may run ahead of live bytes (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Headroom {
    /// Reserved may pass live by this fraction of live (0.04: 4 %).
    pub fraction: f64,
    /// ... or by this many bytes, whichever is more: below a few pages,
    /// trimming costs more than it wins back.
    pub slack: u64,
}

impl Default for Headroom {
    fn default() -> Self {
        Self {
            fraction: 0.04,
            slack: 2 * ADAPTIVE_MIN_PAGE_SIZE,
        }
    }
}

impl Headroom {
    /// The excess a stream with `live` bytes in use may keep while the
    /// device is past its headroom: its fraction, and at least one minimum
    /// adaptive page.
    pub fn share(&self, live: u64) -> u64 {
        self.fraction_of(live).max(ADAPTIVE_MIN_PAGE_SIZE)
    }

    /// Whether a device holding `reserved` bytes with `live` in use is
    /// past its headroom.
    pub fn exceeded(&self, reserved: u64, live: u64) -> bool {
        reserved > live.saturating_add(self.fraction_of(live).max(self.slack))
    }

    fn fraction_of(&self, live: u64) -> u64 {
        (live as f64 * self.fraction) as u64
    }
}

/// A stream growing past the headroom asks the others for a round only if
/// they hold at least this much (and the request) unused.
const MIN_ROUND_GAIN: u64 = 1 << 20;

/// The actor's side of the policy: serving within the headroom, and
/// keeping itself trim while the device is past it.
impl StreamActor {
    /// The device holds more than its headroom above what is live: serve
    /// from the room this stream holds if it can, else trim this stream's
    /// pages, else ask the others to give back before growing (see
    /// `headroom.rs`).
    pub(crate) fn serve_within_headroom(&mut self, mut pending: Pending) {
        for trimmed in [false, true] {
            if trimmed {
                self.memory.cleanup(Cleanup::Explicit);
                let _ = self.memory.relocate(RelocationReason::Short);
                self.memory.flush();
                self.publish();
            }
            match self.try_reserve_held(&pending) {
                Ok(Some(batch)) => return self.answer_served(pending, batch, false),
                Ok(None) => {}
                Err(err) => return pending.answer(Err(err.into())),
            }
        }
        if self.short_pending {
            // A round for this stream is under way: its `Retry` serves this.
            pending.state = PendingState::ParkedForHeadroom { since: self.now() };
            return self.parked.push_back(pending);
        }
        // A round is worth its wake-ups only if the others hold at least
        // this request's worth of room they do not use.
        let requested = pending.requested();
        if self.device.has_coordinator()
            && self.over_headroom(&pending)
            && self.device.others_excess(self.shared.stream) >= requested.max(MIN_ROUND_GAIN)
        {
            pending.state = PendingState::ParkedForHeadroom { since: self.now() };
            self.parked.push_back(pending);
            return self.ask_now(requested, true);
        }
        pending.state = self.growth_state(&pending);
        self.serve_growing(pending);
    }

    /// How a request that grows the device is served: in pages just large
    /// enough while the device is past its headroom.
    pub(crate) fn growth_state(&self, pending: &Pending) -> PendingState {
        if self.over_headroom(pending) {
            PendingState::ServingTight
        } else {
            PendingState::Serving
        }
    }

    /// Whether growing for `pending` would carry the device past its
    /// headroom (counting a new page for each size, the most it could take).
    pub(crate) fn over_headroom(&self, pending: &Pending) -> bool {
        self.over_headroom_for(&pending.sizes, pending.mode)
    }

    /// [`over_headroom`](Self::over_headroom) for reserving `sizes` in
    /// `mode`.
    pub(crate) fn over_headroom_for(&self, sizes: &[u64], mode: AllocationMode) -> bool {
        if self.device.headroom.is_none() {
            return false;
        }
        let requested = super::short::requested(sizes);
        let pages = |exact: bool| {
            sizes
                .iter()
                .map(|&size| {
                    let page = if exact {
                        self.memory.new_page_size(size, mode)
                    } else {
                        self.memory.new_page_size_at_most(size, mode)
                    };
                    page.unwrap_or(size)
                })
                .fold(0u64, u64::saturating_add)
        };
        // The test only turns true as the pages grow: within the headroom
        // with the most they could take, it is within; past it with none,
        // past. Only between does the exact page count matter (it searches
        // an expandable pool's voids).
        if !self.device.over_headroom(requested, pages(false)) {
            return false;
        }
        if self.device.over_headroom(requested, 0) {
            return true;
        }
        self.device.over_headroom(requested, pages(true))
    }

    /// The device holds more than its headroom above what is live, and this
    /// stream holds more than its share of that excess: give back its empty
    /// pages now. The cheap half of the headroom policy (no round, no
    /// wake-up): streams that keep serving keep themselves trim, and a
    /// growing stream asks the others only for what is left.
    pub(crate) fn trim_to_headroom(&mut self) {
        let Some(headroom) = self.device.headroom else {
            return;
        };
        // The stream's own pools, against what its clients hold now.
        let in_use = self.shared.bytes_in_use();
        let excess = self.memory.bytes_reserved().saturating_sub(in_use);
        if excess < headroom.share(in_use) || !self.device.over_headroom(0, 0) {
            return;
        }
        self.take_back_hot();
        self.memory.cleanup(crate::memory::Cleanup::Explicit);
        self.memory.flush();
        self.publish();
    }
}

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
