//! Live bytes counted where they change, so a thread other than the owner
//! reads them exact.
//!
//! The long form: `docs/modules.md`, "`src/memory/live.rs`".

use crate::sync::Arc;
use crate::sync::atomic::{AtomicU64, Ordering};

/// The bytes a whole device's clients hold, and the most at once.
#[derive(Debug, Default)]
pub(crate) struct LiveBytes {
    bytes: AtomicU64,
    peak: AtomicU64,
}

impl LiveBytes {
    /// Nothing live yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Bytes live now.
    pub(crate) fn get(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    /// The most bytes live at once.
    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(Ordering::Acquire)
    }

    fn add(&self, bytes: u64) {
        let now = self
            .bytes
            .fetch_add(bytes, Ordering::AcqRel)
            .saturating_add(bytes);
        // A load first: the peak moves rarely, and a failed max is a write.
        if now > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(now, Ordering::AcqRel);
        }
    }

    fn sub(&self, bytes: u64) {
        // Never below zero: every byte taken off was added first (by the
        // owner, before the handle existed), and comes off once (`metered`
        // is swapped out).
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// A value on a cache line of its own (128 bytes: adjacent-line
/// prefetching pairs 64-byte lines), so a counter one thread writes does
/// not move to another core each time a neighbour another thread writes
/// does.
#[derive(Debug, Default)]
#[repr(align(128))]
struct OwnLine<T>(T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// One stream's count, and the device's it adds to.
#[derive(Debug)]
pub(crate) struct LiveMeter {
    /// Bytes the owner ever handed out (written by the owner alone: its
    /// line stays in the owner's cache until a decision reads it).
    handed_out: OwnLine<AtomicU64>,
    /// Bytes whose bindings ever ended (by any thread; in practice the
    /// stream's clients).
    released: OwnLine<AtomicU64>,
    /// Bytes handed out from clients' hot caches (by the clients' threads,
    /// so added with a read-modify-write, on a line of its own).
    from_cache: OwnLine<AtomicU64>,
    /// Releases queued that are not a binding's end: the last unpin of an
    /// allocation whose handles had gone (its bytes counted as released at
    /// the drop, its room comes back only now), a page guard's drop.
    late: AtomicU64,
    /// The device's count.
    device: Arc<LiveBytes>,
}

impl LiveMeter {
    /// A stream's meter adding to `device`.
    pub(crate) fn new(device: Arc<LiveBytes>) -> Self {
        Self {
            handed_out: OwnLine(AtomicU64::new(0)),
            released: OwnLine(AtomicU64::new(0)),
            from_cache: OwnLine(AtomicU64::new(0)),
            late: AtomicU64::new(0),
            device,
        }
    }

    /// Bytes this stream's clients hold now.
    pub(crate) fn live(&self) -> u64 {
        // Released first: a byte released was handed out before, so the
        // later read of what was handed out covers it (never below zero).
        let released = self.released.load(Ordering::Acquire);
        self.handed_out
            .load(Ordering::Acquire)
            .saturating_add(self.from_cache.load(Ordering::Acquire))
            .saturating_sub(released)
    }

    /// Bytes this stream's clients ever released (it only grows).
    pub(crate) fn released(&self) -> u64 {
        self.released.load(Ordering::Acquire)
    }

    /// Changes whenever clients give anything back: bytes released, or a
    /// late release queued (only grows).
    pub(crate) fn returns(&self) -> u64 {
        self.released()
            .wrapping_add(self.late.load(Ordering::Acquire))
    }

    /// A release that is not a binding's end was queued.
    pub(crate) fn returned_late(&self) {
        self.late.fetch_add(1, Ordering::AcqRel);
    }

    /// The owner handed out `bytes`.
    pub(crate) fn handed_out(&self, bytes: u64) {
        let now = self
            .handed_out
            .load(Ordering::Relaxed)
            .saturating_add(bytes);
        self.handed_out.store(now, Ordering::Release);
        self.device.add(bytes);
    }

    /// A client handed out `bytes` its hot cache held (any thread).
    pub(crate) fn handed_out_from_cache(&self, bytes: u64) {
        self.from_cache.fetch_add(bytes, Ordering::AcqRel);
        self.device.add(bytes);
    }

    /// A binding of `bytes` ended.
    pub(crate) fn ended(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.released.fetch_add(bytes, Ordering::AcqRel);
        self.device.sub(bytes);
    }
}

#[cfg(all(test, not(streamalloc_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_stream_and_its_device_count_what_is_held() {
        let device = Arc::new(LiveBytes::new());
        let a = LiveMeter::new(device.clone());
        let b = LiveMeter::new(device.clone());
        a.handed_out(100);
        b.handed_out(50);
        a.ended(40);
        assert_eq!((a.live(), b.live(), device.get()), (60, 50, 110));
        assert_eq!(device.peak(), 150);
        assert_eq!(a.released(), 40);
    }
}
