//! The hasher of the library's maps keyed by pointers: a multiply and a
//! rotation. The standard SipHash resists keys an attacker picks, at a
//! cost every malloc and every free paid; these keys come from PyTorch.
//! Pointers are aligned, so the low bits of a product are zeros: the
//! rotation brings its mixed high bits down to where the table picks a
//! bucket.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by pointers.
pub(crate) type PtrMap<K, V> = HashMap<K, V, BuildHasherDefault<PtrHasher>>;

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PtrHasher(u64);

/// A key's bits spread by a multiply (Fibonacci hashing): its high bits
/// depend on every bit of the key.
pub(crate) fn spread(key: u64) -> u64 {
    key.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        spread(self.0).rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = self.0.rotate_left(5) ^ value;
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_pointers_spread_over_the_low_bits() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<PtrHasher>::default();
        let low: std::collections::BTreeSet<u64> = (0..256u64)
            .map(|i| build.hash_one(0x7f00_0000_0000usize + (i as usize) * 4096) & 0xff)
            .collect();
        assert!(low.len() > 128, "{} buckets of 256", low.len());
    }
}
