//! The GPU check's measurements, as a table (`scripts/gpu-check.sh` runs it):
//! - pool reserve + release vs raw `cuMemAlloc` + `cuMemFree`, ns per op;
//! - relocation copy throughput vs a plain device-to-device copy, GB/s.
//!
//! Needs `--features cuda`; says so and exits where no device exists.

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use std::time::Instant;
    use streamalloc::memory::{MemoryConfig, MemoryManager, PageUpdate};
    use streamalloc::storage::{CudaStorage, DeviceStorage};

    let mut raw = match CudaStorage::new(0) {
        Ok(storage) => storage,
        Err(err) => {
            println!("skipped: no CUDA device ({err})");
            return Ok(());
        }
    };
    let (_, total) = raw.device_memory()?;
    println!("device 0: {:.1} GiB", total as f64 / (1u64 << 30) as f64);
    println!("| measure | streamalloc | raw driver | ratio |");
    println!("| --- | --- | --- | --- |");

    for size in [4096u64, 1 << 20, 16 << 20] {
        let ops = 2000;
        let start = Instant::now();
        for _ in 0..ops {
            let page = raw.allocate(size)?;
            raw.deallocate(page.id);
            raw.flush();
        }
        let raw_ns = start.elapsed().as_nanos() as f64 / ops as f64;

        let mut memory = MemoryManager::new(CudaStorage::new(0)?, MemoryConfig::default());
        let ops = 200_000;
        let start = Instant::now();
        for _ in 0..ops {
            drop(memory.reserve(size, PageUpdate::Allow)?);
        }
        let ours_ns = start.elapsed().as_nanos() as f64 / ops as f64;
        println!(
            "| reserve+release {} KiB (ns/op) | {ours_ns:.0} | {raw_ns:.0} | {:.4} |",
            size / 1024,
            ours_ns / raw_ns
        );
    }

    // Relocation: many 1 MiB allocations over 2 MiB pages, three in four
    // freed, then a compaction; against one plain dtod copy of the same bytes.
    let mut memory = MemoryManager::new(CudaStorage::new(0)?, MemoryConfig::default());
    let all: Vec<_> = (0..2048u64)
        .map(|i| {
            memory
                .reserve(700 * 1024, PageUpdate::Allow)
                .map(|a| (a, i))
        })
        .collect::<Result<_, _>>()?;
    let kept: Vec<_> = all.into_iter().filter(|(_, i)| i % 3 == 0).collect();
    memory.process_releases();
    memory.storage().synchronize()?;
    let start = Instant::now();
    let report = memory.compact()?;
    memory.storage().synchronize()?;
    let seconds = start.elapsed().as_secs_f64();
    let ours = report.bytes_moved as f64 / seconds / 1e9;

    let bytes = report.bytes_moved.max(1 << 20);
    let a = raw.allocate(bytes)?;
    let b = raw.allocate(bytes)?;
    raw.copy(&a, &b)?;
    raw.synchronize()?;
    let start = Instant::now();
    let rounds = 10;
    for _ in 0..rounds {
        raw.copy(&a, &b)?;
    }
    raw.synchronize()?;
    let plain = (bytes * rounds) as f64 / start.elapsed().as_secs_f64() / 1e9;
    println!(
        "| relocation copy (GB/s; {} allocations, {} MiB) | {ours:.1} | {plain:.1} | {:.3} |",
        report.moved,
        report.bytes_moved >> 20,
        ours / plain
    );
    drop(kept);
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("skipped: built without the `cuda` feature");
}
