//! The manager alone on the mixed ring (`benches/core.rs`'s
//! `ring_of_64/mixed_256b_16m`: 64 allocations live, each step replacing
//! the oldest with one of 256 B .. 16 MiB), driven a fixed number of steps
//! from one seed, so that a profiler or an instruction counter sees the
//! same work on every run:
//!
//! ```text
//! cargo build --release --example mixed_ring
//! valgrind --tool=cachegrind --cache-sim=no ./target/release/examples/mixed_ring 200000
//! ```
//!
//! Prints the time per reservation (noisy on a shared machine: compare
//! instruction counts), the bytes reserved at the end, the peak reserved
//! against the peak in use, what compaction before growth moved, and what
//! was mapped and unmapped (a GPU's driver does that a granule at a time,
//! at a cost this host replay does not show).

use std::time::Instant;
use streamalloc::memory::{DeviceProperties, MemoryConfig, MemoryManager, PageUpdate};
use streamalloc::storage::VirtualStorage;

#[path = "../benches/support/sizes.rs"]
mod sizes;
use sizes::Sizes;

const MIB: u64 = 1 << 20;

/// Allocations live at once.
const RING: usize = 64;

fn main() {
    let steps: usize = match std::env::args().nth(1) {
        Some(arg) => match arg.parse() {
            Ok(steps) => steps,
            Err(_) => {
                eprintln!("usage: mixed_ring [STEPS]");
                std::process::exit(2);
            }
        },
        None => 1_000_000,
    };
    let mut sizes = Sizes(0x5eed);
    let sizes: Vec<u64> = (0..4096).map(|_| sizes.mixed()).collect();
    let mut memory = MemoryManager::new(
        VirtualStorage::new(),
        MemoryConfig {
            device: DeviceProperties::new(128 * MIB, 32),
            ..MemoryConfig::default()
        },
    );
    let mut ring: Vec<Option<_>> = (0..RING).map(|_| None).collect();
    let mut reserved_total = 0u64;
    let started = Instant::now();
    for step in 0..steps {
        let size = sizes[step % sizes.len()];
        reserved_total += size;
        match memory.reserve(size, PageUpdate::Allow) {
            Ok(allocation) => ring[step % RING] = Some(allocation),
            Err(err) => {
                eprintln!("step {step}: {err}");
                std::process::exit(1);
            }
        }
    }
    let elapsed = started.elapsed();
    let (moved, bytes_moved) = memory.moved_before_growth();
    let report = memory.memory_report();
    let churn = memory.storage().map_churn();
    let per_byte = |bytes: u64| bytes as f64 / reserved_total.max(1) as f64;
    println!(
        "{:.0} ns a reservation, {} MiB reserved at the end, peak reserved / peak in use {:.3}; moved before growth: {moved} allocations, {:.2} bytes per byte reserved; mapped {:.2} and unmapped {:.2} bytes per byte reserved",
        elapsed.as_nanos() as f64 / steps.max(1) as f64,
        memory.bytes_reserved() / MIB,
        report.peak_bytes_reserved as f64 / report.peak_bytes_in_use.max(1) as f64,
        per_byte(bytes_moved),
        per_byte(churn.mapped),
        per_byte(churn.unmapped),
    );
}
