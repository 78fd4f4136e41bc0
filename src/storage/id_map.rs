//! The storages' maps from page id to page: ids are a counter, so the
//! default SipHash (built to resist keys an attacker picks) only costs
//! time here; a multiplicative hash spreads consecutive ids over the
//! table's buckets (its top bits, which the table's probes read, differ
//! from one id to the next).

use super::StorageId;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by [`StorageId`].
pub(crate) type IdMap<V> = HashMap<StorageId, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of one `u64` (what `StorageId` hashes as).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not reached for `StorageId` (it writes one u64); any other key
        // still hashes, byte by byte.
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0 ^ value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_ids_land_in_different_top_bits() {
        let top = |id: u64| {
            let mut hasher = IdHasher::default();
            std::hash::Hash::hash(&StorageId(id), &mut hasher);
            hasher.finish() >> 57
        };
        let distinct: std::collections::BTreeSet<u64> = (1..=64).map(top).collect();
        assert!(distinct.len() > 32, "{distinct:?}");
    }

    #[test]
    fn a_map_finds_what_it_holds() {
        let mut map: IdMap<u64> = IdMap::default();
        for id in 0..10_000 {
            map.insert(StorageId(id), id * 3);
        }
        assert!((0..10_000).all(|id| map.get(&StorageId(id)) == Some(&(id * 3))));
        assert_eq!(map.get(&StorageId(10_000)), None);
    }
}
