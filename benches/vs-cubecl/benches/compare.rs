//! streamalloc's `MemoryManager` beside CubeCL's `MemoryManagement`
//! (cubecl-server 0.11.3, on its `BytesStorage`, driven as CubeCL's server
//! drives it: relocate when `relocation_need()` says so, then
//! `reserve(size, PageUpdate::Allow)`) and a bare `offset-allocator` as the
//! floor. Every contender gets the same sequence from the same seed: a ring
//! of 64 live allocations, each step replacing the oldest.
//!
//! Clients sharing a device (`mixed_clients`, `decode_clients`): 1, 2, 4
//! and 8 threads, CubeCL and our manager each behind a mutex, our actors
//! (one stream, or one per client; plain, batched by 16, and for the decode
//! step with hot caches). `BUSY=1` keeps a spinning thread on one core for
//! the whole run.
//!
//! `cd benches/vs-cubecl && cargo bench`

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use cubecl_server::memory_management::relocation::CopyQueue;
use cubecl_server::memory_management::relocation::HostCopies;
use cubecl_server::memory_management::{ErrorGraph, PageUpdate as CubeUpdate};
use cubecl_server::storage::{BytesStorage, ComputeStorage};
use std::hint::black_box;
use std::sync::Arc;
use streamalloc::memory::{DeviceProperties, MemoryConfig, MemoryManager, PageUpdate};
use streamalloc::storage::{HostStorage, VirtualStorage};
use streamalloc_vs_cubecl::{CountedCopies, CountingStorage, cubecl};

const MIB: u64 = 1 << 20;
const RING: usize = 64;

#[path = "../../support/sizes.rs"]
mod sizes;
use sizes::Sizes;

fn sequence(workload: &str, len: usize) -> Vec<u64> {
    let mut sizes = Sizes(0x5eed);
    (0..len)
        .map(|_| match workload {
            "fixed_4k" => 4096,
            "fixed_1m" => MIB,
            _ => sizes.mixed(),
        })
        .collect()
}

fn ours<S: streamalloc::storage::DeviceStorage>(storage: S) -> MemoryManager<S> {
    MemoryManager::new(
        storage,
        MemoryConfig {
            device: DeviceProperties::new(128 * MIB, 32),
            ..MemoryConfig::default()
        },
    )
}

fn ring(c: &mut Criterion) {
    ring_on(
        c,
        "ring_of_64_counting",
        VirtualStorage::new,
        CountingStorage::default,
        || CountedCopies,
    );
    ring_on(
        c,
        "ring_of_64_host_bytes",
        HostStorage::new,
        BytesStorage::default,
        || HostCopies,
    );
}

fn ring_on<S, C, Q>(
    c: &mut Criterion,
    name: &str,
    our_storage: impl Fn() -> S,
    their_storage: impl Fn() -> C,
    copier: impl Fn() -> Q,
) where
    S: streamalloc::storage::DeviceStorage,
    C: ComputeStorage,
    Q: CopyQueue<C>,
{
    let mut group = c.benchmark_group(name);
    for workload in ["fixed_4k", "fixed_1m", "mixed_256b_16m"] {
        let sizes = sequence(workload, 1 << 16);
        let mask = sizes.len() - 1;

        let mut memory = ours(our_storage());
        let mut live: Vec<_> = sizes[..RING]
            .iter()
            .map(|&s| memory.reserve(s, PageUpdate::Allow).unwrap())
            .collect();
        let mut step = 0usize;
        group.bench_function(BenchmarkId::new("streamalloc", workload), |b| {
            b.iter(|| {
                step += 1;
                live[step % RING] = memory
                    .reserve(black_box(sizes[step & mask]), PageUpdate::Allow)
                    .unwrap();
            })
        });
        drop(live);

        let mut memory = cubecl(their_storage());
        let mut failures = ErrorGraph::default();
        let mut copies = copier();
        let mut live: Vec<_> = sizes[..RING]
            .iter()
            .map(|&s| memory.reserve(s, CubeUpdate::Allow, &mut failures).unwrap())
            .collect();
        let mut step = 0usize;
        group.bench_function(BenchmarkId::new("cubecl", workload), |b| {
            b.iter(|| {
                step += 1;
                if let Some(reason) = memory.relocation_need().reason(|| memory.bytes_allocated()) {
                    memory.relocate(&mut copies, reason, &mut failures);
                }
                live[step % RING] = memory
                    .reserve(
                        black_box(sizes[step & mask]),
                        CubeUpdate::Allow,
                        &mut failures,
                    )
                    .unwrap();
            })
        });
        drop(live);

        let mut floor = offset_allocator::Allocator::<u32>::new(1 << 31);
        let mut live: Vec<_> = sizes[..RING]
            .iter()
            .map(|&s| floor.allocate(s as u32).unwrap())
            .collect();
        let mut step = 0usize;
        group.bench_function(BenchmarkId::new("offset_allocator", workload), |b| {
            b.iter(|| {
                step += 1;
                let slot = step % RING;
                floor.free(live[slot]);
                live[slot] = floor
                    .allocate(black_box(sizes[step & mask]) as u32)
                    .unwrap();
            })
        });
    }
    group.finish();
}

/// One decode step's sizes, asked for again every step (KV blocks,
/// activations, logits), as in `benches/service.rs`.
const DECODE_STEP: [u64; 8] = [
    4096,
    64 << 10,
    256 << 10,
    1 << 20,
    64 << 10,
    4096,
    2 << 20,
    256 << 10,
];

/// `threads` clients, each keeping a ring of 64 allocations of `workload`'s
/// sizes (mixed 256 B .. 16 MiB, or a decode step's eight again and again)
/// and doing `per_thread` replacements; returns the wall time of the
/// slowest.
fn clients<H: Send + 'static>(
    workload: &'static str,
    threads: usize,
    per_thread: u64,
    make: impl Fn() -> Box<dyn FnMut(u64) -> Vec<H> + Send>,
) -> std::time::Duration {
    let barrier = Arc::new(std::sync::Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let mut reserve = make();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let sizes = match workload {
                    "decode" => DECODE_STEP.to_vec(),
                    _ => sequence(workload, 1 << 12),
                };
                let mut ring: Vec<Option<H>> = (0..RING).map(|_| None).collect();
                barrier.wait();
                let mut step = if workload == "decode" { 0 } else { t * 977 };
                let mut done = 0;
                while done < per_thread {
                    let size = sizes[step % sizes.len()];
                    for handle in reserve(size) {
                        ring[step % RING] = Some(handle);
                        step += 1;
                        done += 1;
                    }
                }
            })
        })
        .collect();
    barrier.wait();
    let start = std::time::Instant::now();
    for handle in handles {
        handle.join().unwrap();
    }
    start.elapsed()
}

/// With `BUSY=1`, a thread spins on one core for the whole run (a loaded
/// server's other work), as in `benches/service.rs`.
fn busy_core() {
    if std::env::var("BUSY").is_ok_and(|busy| busy == "1") {
        std::thread::spawn(|| {
            loop {
                std::hint::spin_loop();
            }
        });
    }
}

fn threads(c: &mut Criterion) {
    busy_core();
    for (workload, group_name) in [
        ("mixed_256b_16m", "mixed_clients"),
        ("decode", "decode_clients"),
    ] {
        clients_group(c, workload, group_name);
    }
}

/// One group: every contender at 1, 2, 4 and 8 client threads.
fn clients_group(c: &mut Criterion, workload: &'static str, group_name: &str) {
    use parking_lot::Mutex;
    use streamalloc::service::{Calls, ServiceConfig, Supervisor};
    let mut group = c.benchmark_group(group_name);
    group.sample_size(10);
    for threads in [1usize, 2, 4, 8] {
        let cube = Arc::new(Mutex::new(cubecl(CountingStorage::default())));
        group.bench_function(BenchmarkId::new("cubecl_mutex", threads), |b| {
            b.iter_custom(|iters| {
                let per = iters.div_ceil(threads as u64);
                let elapsed = clients(workload, threads, per, || {
                    let cube = cube.clone();
                    Box::new(move |size| {
                        let mut memory = cube.lock();
                        let mut failures = ErrorGraph::default();
                        if let Some(reason) =
                            memory.relocation_need().reason(|| memory.bytes_allocated())
                        {
                            memory.relocate(&mut CountedCopies, reason, &mut failures);
                        }
                        vec![
                            memory
                                .reserve(size, CubeUpdate::Allow, &mut failures)
                                .unwrap(),
                        ]
                    })
                });
                elapsed.mul_f64(iters as f64 / (per * threads as u64) as f64)
            })
        });
        let mine = Arc::new(Mutex::new(ours(VirtualStorage::new())));
        group.bench_function(BenchmarkId::new("streamalloc_mutex", threads), |b| {
            b.iter_custom(|iters| {
                let per = iters.div_ceil(threads as u64);
                let elapsed = clients(workload, threads, per, || {
                    let mine = mine.clone();
                    Box::new(move |size| {
                        vec![mine.lock().reserve(size, PageUpdate::Allow).unwrap()]
                    })
                });
                elapsed.mul_f64(iters as f64 / (per * threads as u64) as f64)
            })
        });
        let device_with = |serve_in_place| {
            Arc::new(Supervisor::virtual_device(ServiceConfig {
                idle_tick: None,
                memory: MemoryConfig {
                    device: DeviceProperties::new(128 * MIB, 32),
                    ..MemoryConfig::default()
                },
                calls: Calls {
                    serve_in_place,
                    spin: std::env::var("SPIN")
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(2000),
                    ..Calls::default()
                },
                ..ServiceConfig::default()
            }))
        };
        let (in_place, through_thread) = (device_with(true), device_with(false));
        // Every client on stream 0, or each on its own stream (one actor
        // each); the default (serving in place while the actor is free), and
        // every request a round trip to the actor's thread.
        for (own_streams, batch, device) in [
            (false, 1usize, &in_place),
            (false, 1, &through_thread),
            (false, 16, &in_place),
            (true, 1, &in_place),
            (true, 1, &through_thread),
            (true, 16, &in_place),
        ] {
            let round_trip = Arc::ptr_eq(device, &through_thread);
            let name = match (own_streams, batch, round_trip) {
                (false, 1, false) => "streamalloc_actor",
                (false, 1, true) => "streamalloc_actor_round_trip",
                (false, _, _) => "streamalloc_actor_batch16",
                (true, 1, false) => "streamalloc_actors",
                (true, 1, true) => "streamalloc_actors_round_trip",
                (true, _, _) => "streamalloc_actors_batch16",
            };
            let next_stream = std::sync::atomic::AtomicU32::new(0);
            group.bench_function(BenchmarkId::new(name, threads), |b| {
                b.iter_custom(|iters| {
                    let per = iters.div_ceil(threads as u64);
                    let elapsed = clients(workload, threads, per, || {
                        let stream = client_stream(device, own_streams, &next_stream, threads);
                        let mut pending = Vec::new();
                        Box::new(move |size| {
                            if batch == 1 {
                                return vec![stream.reserve(size).unwrap()];
                            }
                            pending.push(size);
                            if pending.len() < batch {
                                return Vec::new();
                            }
                            stream.reserve_many(&std::mem::take(&mut pending)).unwrap()
                        })
                    });
                    elapsed.mul_f64(iters as f64 / (per * threads as u64) as f64)
                })
            });
        }
        if workload == "decode" {
            hot_contenders(&mut group, threads);
        }
    }
    group.finish();
}

/// The stream of the next client: stream 0 for every client, or (with
/// `own_streams`) the next of `threads` streams in turn.
fn client_stream(
    device: &streamalloc::service::Supervisor,
    own_streams: bool,
    next: &std::sync::atomic::AtomicU32,
    threads: usize,
) -> streamalloc::service::StreamHandle {
    let id = if own_streams {
        next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % threads as u32
    } else {
        0
    };
    device.stream(streamalloc::memory::StreamId(id)).unwrap()
}

/// The decode step through hot caches (`ServiceConfig::hot_cache`): every
/// client on one stream, or each on its own. Each stream holds 8 GiB first
/// (a model's weights), so its clients' caches have room (they hold at
/// most 1/256 of the stream).
fn hot_contenders(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    threads: usize,
) {
    use streamalloc::memory::StreamId;
    use streamalloc::service::{ServiceConfig, Supervisor};
    let device = Arc::new(Supervisor::virtual_device(ServiceConfig {
        idle_tick: None,
        calls: streamalloc::service::Calls {
            hot_cache: true,
            ..Default::default()
        },
        memory: MemoryConfig {
            device: DeviceProperties::new(128 * MIB, 32),
            ..MemoryConfig::default()
        },
        ..ServiceConfig::default()
    }));
    let weights: Vec<_> = (0..threads as u32)
        .map(|id| {
            let stream = device.stream(StreamId(id)).unwrap();
            stream.reserve_many(&[128 * MIB; 64]).unwrap()
        })
        .collect();
    for (name, own_streams) in [
        ("streamalloc_actor_hot", false),
        ("streamalloc_actors_hot", true),
    ] {
        let next_stream = std::sync::atomic::AtomicU32::new(0);
        group.bench_function(BenchmarkId::new(name, threads), |b| {
            b.iter_custom(|iters| {
                let per = iters.div_ceil(threads as u64);
                let elapsed = clients("decode", threads, per, || {
                    let stream = client_stream(&device, own_streams, &next_stream, threads);
                    Box::new(move |size| vec![stream.reserve(size).unwrap()])
                });
                elapsed.mul_f64(iters as f64 / (per * threads as u64) as f64)
            })
        });
    }
    let (hits, misses) = (0..threads as u32).fold((0, 0), |(hits, misses), id| {
        let stats = device.stream(StreamId(id)).unwrap().stats();
        (hits + stats.hot_hits, misses + stats.hot_misses)
    });
    println!(
        "  {threads} threads, hot caches: {hits} hits, {misses} misses ({:.1} % without a round trip)",
        100.0 * hits as f64 / (hits + misses).max(1) as f64
    );
    drop(weights);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = ring, threads
}
criterion_main!(benches);
