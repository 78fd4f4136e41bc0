//! Sums that cannot overflow. `Iterator::sum` panics on overflow in a
//! debug build, and a sum of caller-given sizes must never take a stream
//! down; `clippy.toml` disallows it where callers' numbers flow.

/// `saturating_sum`: the total of byte counts, `u64::MAX` at most.
pub(crate) trait SaturatingSum {
    /// The sum, saturating at `u64::MAX`.
    fn saturating_sum(self) -> u64;
}

impl<I: Iterator<Item = u64>> SaturatingSum for I {
    fn saturating_sum(self) -> u64 {
        self.fold(0, u64::saturating_add)
    }
}
