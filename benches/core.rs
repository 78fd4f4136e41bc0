//! Core cost of the single-threaded manager: reserve + release with a given
//! number of live allocations (small sizes, `VirtualStorage`), to show the
//! cost stays flat from 1K to 1M live; and the ring workloads of DESIGN.md
//! (fixed 4 KiB, fixed 1 MiB, mixed 256 B..16 MiB with 64 live); a
//! fragmented live set of 1K to 30K small tensors, replaced at random; and
//! relocation's bytes moved per second on host memory beside a plain
//! `memcpy` of the same bytes.
//!
//! Every sequence comes from one seed, so runs compare like with like.
//! `cargo bench --bench core`

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use streamalloc::memory::{Allocation, MemoryConfig, MemoryManager, PageUpdate, RelocationReason};
use streamalloc::storage::{HostStorage, VirtualStorage};

#[path = "support/sizes.rs"]
mod sizes;
use sizes::Sizes;

fn manager() -> MemoryManager<VirtualStorage> {
    MemoryManager::new(VirtualStorage::new(), MemoryConfig::default())
}

fn live_set_scaling(c: &mut Criterion) {
    let mut group = c.benchmark_group("live_set_scaling");
    group.throughput(Throughput::Elements(1));
    for live in [1_000usize, 10_000, 100_000, 1_000_000] {
        let mut memory = manager();
        let mut sizes = Sizes(0x5eed);
        let held: Vec<_> = (0..live)
            .map(|_| memory.reserve(sizes.small(), PageUpdate::Allow).unwrap())
            .collect();
        group.bench_with_input(BenchmarkId::from_parameter(live), &live, |b, _| {
            b.iter(|| {
                let a = memory
                    .reserve(black_box(sizes.small()), PageUpdate::Allow)
                    .unwrap();
                drop(black_box(a));
            })
        });
        drop(held);
    }
    group.finish();
}

/// Log-uniform between 256 B and 256 KiB: a layer's small tensors.
fn tensor(sizes: &mut Sizes) -> u64 {
    let exp = 8 + sizes.next() % 10;
    (1 << exp) + sizes.next() % (1 << exp)
}

/// Reserve + release where the live set is fragmented: each step replaces
/// a random one of `live` allocations of 256 B .. 256 KiB, so most
/// reservations miss the room held and plan a compaction before growing
/// (the planners' cost with the pool's size: `git show d502a2e:docs/performance.md`,
/// "Planning cost").
fn fragmented_live_set(c: &mut Criterion) {
    let mut group = c.benchmark_group("fragmented_live_set");
    group.throughput(Throughput::Elements(1));
    for live in [1_000usize, 10_000, 30_000] {
        let mut memory = manager();
        let mut sizes = Sizes(0x5eed);
        let mut held: Vec<_> = (0..live)
            .map(|_| {
                memory
                    .reserve(tensor(&mut sizes), PageUpdate::Allow)
                    .unwrap()
            })
            .collect();
        let mut replace = |memory: &mut MemoryManager<VirtualStorage>, sizes: &mut Sizes| {
            let at = (sizes.next() % live as u64) as usize;
            held[at] = memory
                .reserve(black_box(tensor(sizes)), PageUpdate::Allow)
                .unwrap();
        };
        // Fragmented before it is measured: what the first samples see is
        // what the last do.
        for _ in 0..20_000 {
            replace(&mut memory, &mut sizes);
        }
        group.bench_with_input(BenchmarkId::from_parameter(live), &live, |b, _| {
            b.iter(|| replace(&mut memory, &mut sizes))
        });
    }
    group.finish();
}

fn ring(c: &mut Criterion) {
    let mut group = c.benchmark_group("ring_of_64");
    group.throughput(Throughput::Elements(1));
    type Workload = (&'static str, fn(&mut Sizes) -> u64);
    let workloads: [Workload; 3] = [
        ("fixed_4k", |_| 4096),
        ("fixed_1m", |_| 1 << 20),
        ("mixed_256b_16m", Sizes::mixed),
    ];
    for (name, size) in workloads {
        let mut memory = manager();
        let mut sizes = Sizes(0x5eed);
        let mut ring: Vec<_> = (0..64)
            .map(|_| memory.reserve(size(&mut sizes), PageUpdate::Allow).unwrap())
            .collect();
        let mut at = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                ring[at] = memory.reserve(size(&mut sizes), PageUpdate::Allow).unwrap();
                at = (at + 1) % ring.len();
            })
        });
    }
    group.finish();
}

/// A host-memory manager whose arena pages are half empty: 128 written
/// allocations of 256 KiB, every other one freed. Compaction then moves
/// about half of what is left.
fn fragmented_host() -> (MemoryManager<HostStorage>, Vec<Allocation>) {
    let mut memory = MemoryManager::new(HostStorage::new(), MemoryConfig::default());
    let all: Vec<_> = (0..128u8)
        .map(|i| {
            let a = memory.reserve(256 << 10, PageUpdate::Allow).unwrap();
            memory.write(&a, 0, &vec![i; 256 << 10]).unwrap();
            a
        })
        .collect();
    let kept = all.into_iter().step_by(2).collect();
    memory.process_releases();
    (memory, kept)
}

fn relocation(c: &mut Criterion) {
    let mut group = c.benchmark_group("relocation");
    group.sample_size(10);
    // What one compaction of the layout moves.
    let (mut probe, _kept) = fragmented_host();
    let moved = probe
        .relocate(RelocationReason::Compaction)
        .unwrap()
        .bytes_moved;
    assert!(moved > 0, "the layout gives compaction work");
    group.throughput(Throughput::Bytes(moved));
    group.bench_function("compaction_host", |b| {
        b.iter_batched(
            fragmented_host,
            |(mut memory, kept)| {
                let report = memory.relocate(RelocationReason::Compaction).unwrap();
                assert_eq!(report.bytes_moved, moved);
                (memory, kept)
            },
            criterion::BatchSize::PerIteration,
        )
    });
    let source = vec![7u8; moved as usize];
    let mut target = vec![0u8; moved as usize];
    group.bench_function("memcpy", |b| {
        b.iter(|| target.copy_from_slice(black_box(&source)))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(std::time::Duration::from_millis(500)).measurement_time(std::time::Duration::from_secs(2));
    targets = live_set_scaling, fragmented_live_set, ring, relocation
}
criterion_main!(benches);
