//! The pointers a device has handed out, in shards by pointer, each its
//! own lock on its own cache line: threads that allocate and free at once
//! rarely meet on one (one map behind one lock made two threads slower
//! together than one alone).

use crate::ptr_hash::{self, PtrMap};
use parking_lot::Mutex;

const SHARDS: usize = 16;

#[derive(Default)]
#[repr(align(64))]
struct Shard<V>(Mutex<PtrMap<usize, V>>);

/// Values by pointer.
pub(crate) struct LiveMap<V> {
    shards: [Shard<V>; SHARDS],
}

impl<V> Default for LiveMap<V> {
    fn default() -> Self {
        Self {
            shards: std::array::from_fn(|_| Shard(Mutex::new(PtrMap::default()))),
        }
    }
}

impl<V> LiveMap<V> {
    fn shard(&self, ptr: usize) -> &Mutex<PtrMap<usize, V>> {
        // The top bits of the spread pointer (aligned pointers differ
        // there), apart from the bits the shard's table picks buckets by.
        let at = ptr_hash::spread(ptr as u64) >> 60;
        &self.shards[at as usize % SHARDS].0
    }

    pub(crate) fn insert(&self, ptr: usize, value: V) {
        self.shard(ptr).lock().insert(ptr, value);
    }

    pub(crate) fn remove(&self, ptr: usize) -> Option<V> {
        self.shard(ptr).lock().remove(&ptr)
    }

    /// `change` the value of `ptr`, if it is live: what it returns.
    pub(crate) fn with_mut<T>(&self, ptr: usize, change: impl FnOnce(&mut V) -> T) -> Option<T> {
        self.shard(ptr).lock().get_mut(&ptr).map(change)
    }

    /// How many are live.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.0.lock().len())
            .fold(0, usize::saturating_add)
    }

    /// Every value, taken out (each shard's lock held while it empties).
    pub(crate) fn clear(&self) {
        for shard in &self.shards {
            shard.0.lock().clear();
        }
    }
}
