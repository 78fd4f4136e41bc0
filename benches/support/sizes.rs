//! The seeded size sequence every bench and probe draws from, so that
//! `benches/core.rs`, `benches/vs-cubecl` and `examples/mixed_ring.rs` run
//! the same workloads. Included by path (`#[path = ...] mod sizes;`); each
//! includer uses only some of it.
#![allow(dead_code)]

/// xorshift64*: a fixed, fast sequence of sizes.
pub struct Sizes(pub u64);

impl Sizes {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Between 64 B and 4 KiB, uniform.
    pub fn small(&mut self) -> u64 {
        64 + self.next() % 4032
    }

    /// Log-uniform between 256 B and 16 MiB.
    pub fn mixed(&mut self) -> u64 {
        let exp = 8 + self.next() % 16;
        (1 << exp) + self.next() % (1 << exp)
    }
}
