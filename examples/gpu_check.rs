//! The GPU check's measurements, as a table (`scripts/gpu-check.sh` runs it):
//! - pool reserve + release vs raw `cuMemAlloc` + `cuMemFree`, ns per op;
//! - relocation copy throughput vs a plain device-to-device copy, GB/s;
//! - the ring of 64 live allocations (4 KiB .. 8 MiB) in batches of 50
//!   reservations, each batch behind a copy of 2 ms or more queued on the
//!   stream: how many batches waited for it (issue 43 asks none).
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
    raw.deallocate(a.id);
    raw.deallocate(b.id);
    raw.flush();

    ring_behind_a_long_copy()?;
    Ok(())
}

/// The ring, each batch of 50 reservations behind a long copy on the
/// manager's own stream: a batch after which the event recorded behind the
/// copy has passed waited for the stream (the batch's host time is far
/// below the copy's).
#[cfg(feature = "cuda")]
fn ring_behind_a_long_copy() -> Result<(), Box<dyn std::error::Error>> {
    use std::collections::VecDeque;
    use std::time::Instant;
    use streamalloc::memory::{MemoryConfig, MemoryManager, PageUpdate};
    use streamalloc::storage::{CudaStorage, DeviceStorage};

    const LIVE: usize = 64;
    const BATCH: usize = 50;
    const BATCHES: usize = 40;
    let mut memory = MemoryManager::new(CudaStorage::new(0)?, MemoryConfig::default());
    let bytes = 1u64 << 30;
    let from = memory.storage().allocate(bytes)?;
    let to = memory.storage().allocate(bytes)?;
    // How many copies of a GiB make 2 ms on this device.
    memory.storage().copy(&from, &to)?;
    memory.storage().synchronize()?;
    let start = Instant::now();
    memory.storage().copy(&from, &to)?;
    memory.storage().synchronize()?;
    let one = start.elapsed().as_secs_f64();
    let copies = (0.002 / one).ceil().max(1.0) as usize;

    // Sizes 4 KiB .. 8 MiB, log-uniform, from a fixed seed.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut size = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        4096u64 << ((seed >> 33) % 12)
    };
    let mut ring = VecDeque::with_capacity(LIVE);
    for _ in 0..LIVE {
        ring.push_back(memory.reserve(size(), PageUpdate::Allow)?);
    }
    let (mut waited, mut host) = (0, 0.0);
    for _ in 0..BATCHES {
        for _ in 0..copies {
            memory.storage().copy(&from, &to)?;
        }
        let behind = memory.storage().stream().record_event(None)?;
        let start = Instant::now();
        for _ in 0..BATCH {
            ring.pop_front();
            ring.push_back(memory.reserve(size(), PageUpdate::Allow)?);
        }
        host += start.elapsed().as_secs_f64();
        if behind.is_complete() {
            waited += 1;
        }
        memory.storage().synchronize()?;
    }
    println!(
        "| ring batches of {BATCH} behind a {:.1} ms copy that waited for it | {waited} of {BATCHES} | | {:.1} us a reservation |",
        one * copies as f64 * 1e3,
        host / (BATCHES * BATCH) as f64 * 1e6
    );
    drop(ring);
    memory.storage().deallocate(from.id);
    memory.storage().deallocate(to.id);
    memory.storage().flush();
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("skipped: built without the `cuda` feature");
}
