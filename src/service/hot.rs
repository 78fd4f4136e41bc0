//! Hot sizes: a few reserved allocations kept on each client handle, so
//! that a reserve of a size the client asked for recently is served on its
//! own thread, with no round trip and no lock.
//!
//! The long form: `docs/modules.md`, "`src/service/hot.rs`".

use crate::memory::{Allocation, AllocationCell};
use crate::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use crate::sync::{Arc, Mutex};

/// Allocations a handle keeps at most.
#[cfg(not(streamalloc_loom))]
pub(crate) const HOT_SLOTS: usize = 64;
/// Under loom, few enough slots for the model to explore every
/// interleaving of a take and a take-back (each slot is two atomics).
#[cfg(streamalloc_loom)]
pub(crate) const HOT_SLOTS: usize = 3;
/// Allocations reserved beside the one asked for on a miss of a recent
/// size (as many as the free slots and the share allow): of the reserves
/// of one size, at most one in this many plus one goes to the actor.
pub(crate) const HOT_REFILL: usize = 31;
/// The caches of a stream's handles hold at most one byte in this many of
/// the stream's reserved bytes together (0.4 %: issue 18 allows 0.5 % on
/// a peak), each an equal part.
pub(crate) const HOT_SHARE: u64 = 256;
/// A hit that leaves this few entries of its size asks for more ahead
/// (without waiting): the actor then has the reserves of the other sizes
/// in between to answer before the last is taken. At zero, the refill
/// came too late: the next reserve of the size missed every time.
pub(crate) const AHEAD_WHEN_LEFT: usize = 4;
/// Sizes a handle remembers having missed.
#[cfg(not(streamalloc_loom))]
pub(crate) const RECENT: usize = 8;
#[cfg(streamalloc_loom)]
pub(crate) const RECENT: usize = 2;

/// One cached allocation, or none.
#[derive(Debug)]
struct Slot {
    /// The size of what it held last (a hint for the search only).
    size: AtomicU64,
    /// The allocation as a raw pointer ([`Allocation::into_raw`]), or null.
    cell: AtomicPtr<AllocationCell>,
}

impl Slot {
    /// Whether it holds an entry of `size` bytes, by its hint (loads only).
    fn holds(&self, size: u64) -> bool {
        self.size.load(Ordering::Relaxed) == size && !self.cell.load(Ordering::Relaxed).is_null()
    }
}

/// How many of `slots` hold an entry of `size` bytes, by their hints.
fn holding(slots: &[Slot], size: u64) -> usize {
    slots.iter().filter(|slot| slot.holds(size)).count()
}

/// The hot allocations of one handle clone.
#[derive(Debug)]
pub(crate) struct HotCache {
    /// Its identity in the stream's registry.
    pub(crate) id: u64,
    slots: [Slot; HOT_SLOTS],
    /// Sizes missed lately, most recent at `next - 1` (0: none).
    recent: [AtomicU64; RECENT],
    next: AtomicU64,
    /// Reserves served from the cache.
    pub(crate) hits: AtomicU64,
    /// Reserves of a cachable kind that went to the actor.
    pub(crate) misses: AtomicU64,
    /// It has refilled once: it counts among the caches sharing the
    /// stream's part (handles that never repeat a size take none).
    active: AtomicBool,
    /// A refill ahead is on its way to the actor (at most one at a time).
    ahead: AtomicBool,
    /// Its handle has ended: a refill ahead that comes later puts nothing
    /// in it (and does not count it among the caches sharing the part).
    closed: AtomicBool,
}

impl HotCache {
    pub(crate) fn new() -> Self {
        Self {
            id: crate::sync::unique_id(),
            slots: std::array::from_fn(|_| Slot {
                size: AtomicU64::new(0),
                cell: AtomicPtr::new(std::ptr::null_mut()),
            }),
            recent: std::array::from_fn(|_| AtomicU64::new(0)),
            next: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            active: AtomicBool::new(false),
            ahead: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// Whether its handle has ended.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// How many entries of `size` bytes it holds (by the hints: loads
    /// only).
    pub(crate) fn held(&self, size: u64) -> usize {
        holding(&self.slots, size)
    }

    /// The sizes missed lately of which this cache holds
    /// [`AHEAD_WHEN_LEFT`] entries or fewer, `size` among them: what a
    /// refill ahead serves (looked up when the actor gets to it).
    pub(crate) fn running_low(&self, size: u64) -> smallvec::SmallVec<[u64; RECENT]> {
        let mut low = smallvec::SmallVec::new();
        low.push(size);
        for recent in &self.recent {
            let recent = recent.load(Ordering::Relaxed);
            if recent != 0 && !low.contains(&recent) && self.held(recent) <= AHEAD_WHEN_LEFT {
                low.push(recent);
            }
        }
        low
    }

    /// Claim the one refill ahead this cache may have out; `false` when
    /// one is out already.
    pub(crate) fn claim_ahead(&self) -> bool {
        !self.ahead.swap(true, Ordering::AcqRel)
    }

    /// Whether a refill ahead is out (a miss then asks for no spares of
    /// its own: the two together could pass the cache's part).
    pub(crate) fn ahead_out(&self) -> bool {
        self.ahead.load(Ordering::Acquire)
    }

    /// The refill ahead was served, refused or dropped.
    pub(crate) fn ahead_done(&self) {
        self.ahead.store(false, Ordering::Release);
    }

    /// A cached allocation of exactly `size` bytes, taken, and how many of
    /// the size are left (by the hints, counted in the same pass: a hit
    /// that leaves few asks for more ahead).
    pub(crate) fn take(&self, size: u64) -> Option<(Allocation, usize)> {
        let mut rest = self.slots.iter();
        while let Some(slot) = rest.next() {
            // Loads first: a swap is a read-modify-write, and most slots
            // hold another size or nothing.
            if !slot.holds(size) {
                continue;
            }
            // Acquire: the entry's cell as whoever put it there left it.
            let raw = slot.cell.swap(std::ptr::null_mut(), Ordering::AcqRel);
            if raw.is_null() {
                continue;
            }
            // SAFETY: a non-null slot holds a pointer `into_raw` made, and
            // the swap made this thread its only taker.
            let allocation = unsafe { Allocation::from_raw(raw) };
            if allocation.size() == size {
                self.hits.fetch_add(1, Ordering::Relaxed);
                allocation.hand_out_from_cache();
                return Some((allocation, holding(rest.as_slice(), size)));
            }
            // Another thread of this clone refilled the slot with another
            // size between the hint and the swap: keep it for later.
            if let Some(other) = self.offer(allocation) {
                drop(other);
            }
        }
        None
    }

    /// Keep `allocation` in an empty slot; it comes back when none is.
    pub(crate) fn offer(&self, allocation: Allocation) -> Option<Allocation> {
        let size = allocation.size();
        let raw = allocation.into_raw();
        for slot in &self.slots {
            if !slot.cell.load(Ordering::Relaxed).is_null() {
                continue;
            }
            slot.size.store(size, Ordering::Relaxed);
            // Release: a taker sees the allocation as it is now.
            if slot
                .cell
                .compare_exchange(
                    std::ptr::null_mut(),
                    raw,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return None;
            }
        }
        // SAFETY: `raw` was made just above and stored nowhere.
        Some(unsafe { Allocation::from_raw(raw) })
    }

    /// Take every entry out (the actor's take-back, or the handle's end):
    /// how many there were. Dropped, they go back like any release.
    pub(crate) fn take_all(&self) -> u64 {
        let mut taken: u64 = 0;
        for slot in &self.slots {
            // A load first: taking back runs before every growth, and most
            // slots are empty.
            if slot.cell.load(Ordering::Relaxed).is_null() {
                continue;
            }
            let raw = slot.cell.swap(std::ptr::null_mut(), Ordering::AcqRel);
            if !raw.is_null() {
                // SAFETY: as in `take`: this swap made us its only taker.
                drop(unsafe { Allocation::from_raw(raw) });
                taken = taken.saturating_add(1);
            }
        }
        taken
    }

    /// Bytes held now (by the size hints: exact unless a take races).
    pub(crate) fn bytes(&self) -> u64 {
        self.slots
            .iter()
            .filter(|slot| !slot.cell.load(Ordering::Relaxed).is_null())
            .map(|slot| slot.size.load(Ordering::Relaxed))
            .fold(0, u64::saturating_add)
    }

    /// Note a miss of `size`; whether it was missed lately already (worth
    /// refilling).
    pub(crate) fn missed(&self, size: u64) -> bool {
        self.misses.fetch_add(1, Ordering::Relaxed);
        if self
            .recent
            .iter()
            .any(|recent| recent.load(Ordering::Relaxed) == size)
        {
            return true;
        }
        let at = self.next.fetch_add(1, Ordering::Relaxed) as usize % RECENT;
        self.recent[at].store(size, Ordering::Relaxed);
        false
    }

    /// How many more of `size` bytes to reserve on a miss, when the stream
    /// holds `reserved` bytes and has `caches` caches: up to
    /// [`HOT_REFILL`], within this cache's part of the share.
    pub(crate) fn refill(&self, size: u64, reserved: u64, caches: u64) -> usize {
        let part = (reserved / HOT_SHARE).checked_div(caches).unwrap_or(0);
        let room = part.saturating_sub(self.bytes());
        let fits = room.checked_div(size).unwrap_or(0);
        let free = self
            .slots
            .iter()
            .filter(|slot| slot.cell.load(Ordering::Relaxed).is_null())
            .count();
        // Each size missed lately gets its part of the slots, so one size
        // refilled first does not leave the others none.
        let sizes = self
            .recent
            .iter()
            .filter(|recent| recent.load(Ordering::Relaxed) != 0)
            .count()
            .max(1);
        usize::try_from(fits)
            .unwrap_or(usize::MAX)
            .min(HOT_REFILL)
            .min(free)
            .min(HOT_SLOTS.checked_div(sizes).unwrap_or(0))
    }
}

impl Drop for HotCache {
    fn drop(&mut self) {
        self.take_all();
    }
}

/// Every cache of one stream's handles: what the actor takes back from.
#[derive(Debug, Default)]
pub(crate) struct HotCaches {
    caches: Mutex<Vec<Arc<HotCache>>>,
    /// How many have refilled (read without the lock by a refill).
    active: AtomicU64,
    /// Hits and misses of caches whose handles are gone.
    gone: Mutex<(u64, u64)>,
}

impl HotCaches {
    /// A new handle's cache, listed.
    pub(crate) fn open(&self) -> Arc<HotCache> {
        let cache = Arc::new(HotCache::new());
        self.caches.lock().push(cache.clone());
        cache
    }

    /// A handle's end: its cache unlisted and emptied.
    pub(crate) fn close(&self, cache: &Arc<HotCache>) {
        cache.closed.store(true, Ordering::Release);
        self.caches.lock().retain(|listed| listed.id != cache.id);
        if cache.active.load(Ordering::Acquire) {
            self.active.fetch_sub(1, Ordering::AcqRel);
        }
        cache.take_all();
        let mut gone = self.gone.lock();
        gone.0 = gone.0.saturating_add(cache.hits.load(Ordering::Relaxed));
        gone.1 = gone.1.saturating_add(cache.misses.load(Ordering::Relaxed));
    }

    /// `cache` is about to refill: how many caches share the stream's part
    /// now, it among them.
    pub(crate) fn refilling(&self, cache: &HotCache) -> u64 {
        if !cache.active.swap(true, Ordering::AcqRel) {
            self.active.fetch_add(1, Ordering::AcqRel);
        }
        self.active.load(Ordering::Acquire)
    }

    /// Take every cache's entries back: how many.
    pub(crate) fn take_back(&self) -> u64 {
        self.caches
            .lock()
            .iter()
            .map(|cache| cache.take_all())
            .fold(0, u64::saturating_add)
    }

    /// Hits and misses of every cache, past and present.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let (mut hits, mut misses) = *self.gone.lock();
        for cache in self.caches.lock().iter() {
            hits = hits.saturating_add(cache.hits.load(Ordering::Relaxed));
            misses = misses.saturating_add(cache.misses.load(Ordering::Relaxed));
        }
        (hits, misses)
    }
}
