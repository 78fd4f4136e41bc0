//! The service's costs, each beside its floor in the same run:
//! - the reserve round trip (client → actor → client) beside the floor: a
//!   bare crossbeam request/reply ping-pong with the same shape (a bounded
//!   reply channel kept across requests, a sender cloned into each) and
//!   crossbeam's own blocking receive on both sides (its short backoff,
//!   then a park);
//! - a reserve of a size asked for again and again (the handle's hot
//!   cache) beside our manager behind a mutex;
//! - client-side release (dropping the last handle);
//! - `reserve_many` per item (batches of 16);
//! - lock-free resolve (pin through the published address), owned and
//!   borrowed from the handle.
//!
//! Criterion reports means; the percentiles (median, p99) of the round trip
//! and the ping-pong are printed by `round_trip_percentiles`.
//! `cargo bench --bench service`

use criterion::{Criterion, criterion_group, criterion_main};
use crossbeam_channel::{Receiver, Sender, bounded};
use std::hint::black_box;
use std::time::{Duration, Instant};
use streamalloc::memory::{MemoryConfig, MemoryManager, PageUpdate, StreamId};
use streamalloc::service::{Calls, ServiceConfig, StreamHandle, Supervisor};
use streamalloc::storage::VirtualStorage;

type Ping = (u64, Sender<u64>);

/// The floor's receive: crossbeam's blocking one.
fn receive<T>(rx: &Receiver<T>) -> Option<T> {
    rx.recv().ok()
}

/// A server thread that answers each ping with its value plus one.
fn ping_server() -> (Sender<Ping>, std::thread::JoinHandle<()>) {
    let (tx, rx) = bounded::<Ping>(1024);
    let server = std::thread::spawn(move || {
        while let Some((value, reply)) = receive(&rx) {
            let _ = reply.send(value + 1);
        }
    });
    (tx, server)
}

/// A client's end: one reply channel, kept.
struct Pinger {
    server: Sender<Ping>,
    reply: (Sender<u64>, Receiver<u64>),
}

impl Pinger {
    fn new(server: &Sender<Ping>) -> Self {
        Self {
            server: server.clone(),
            reply: bounded(1),
        }
    }

    fn ping(&self, value: u64) -> u64 {
        self.server.send((value, self.reply.0.clone())).unwrap();
        receive(&self.reply.1).unwrap()
    }
}

/// A stream with hot caches; `in_place`: its clients serve their own
/// requests while the actor is free (the default), else every request is
/// a round trip to the actor's thread.
fn device_serving(in_place: bool) -> (Supervisor, StreamHandle) {
    let device = Supervisor::virtual_device(ServiceConfig {
        idle_tick: None,
        calls: Calls {
            hot_cache: true,
            serve_in_place: in_place,
            ..Calls::default()
        },
        ..ServiceConfig::default()
    });
    let stream = device.stream(StreamId(0)).unwrap();
    (device, stream)
}

fn round_trip(c: &mut Criterion) {
    let mut group = c.benchmark_group("round_trip");
    let (server, thread) = ping_server();
    let pinger = Pinger::new(&server);
    group.bench_function("crossbeam_ping_pong", |b| {
        b.iter(|| black_box(pinger.ping(black_box(1))))
    });
    drop(pinger);
    // `reserve_with` asks the actor every time (no hot cache): a round trip
    // to its thread, or served in place.
    for (name, in_place) in [
        ("reserve_and_release", false),
        ("reserve_and_release_in_place", true),
    ] {
        let (_device, stream) = device_serving(in_place);
        group.bench_function(name, |b| {
            b.iter(|| {
                drop(black_box(
                    stream
                        .reserve_with(black_box(4096), PageUpdate::Allow)
                        .unwrap(),
                ))
            })
        });
    }
    // The same sizes again and again, as a decode step asks: served from
    // the handle's hot cache but one in every refill, beside the bare
    // manager behind a mutex. The stream holds 16 GiB (a model's weights),
    // so its clients' caches have room.
    let (_device, stream) = device_serving(true);
    let _weights = stream.reserve_many(&[1 << 30; 16]).unwrap();
    group.bench_function("hot_reserve_and_release", |b| {
        b.iter(|| drop(black_box(stream.reserve(black_box(4096)).unwrap())))
    });
    let manager = parking_lot::Mutex::new(MemoryManager::new(
        VirtualStorage::new(),
        MemoryConfig::default(),
    ));
    group.bench_function("manager_mutex_reserve_and_release", |b| {
        b.iter(|| {
            drop(black_box(
                manager
                    .lock()
                    .reserve(black_box(4096), PageUpdate::Allow)
                    .unwrap(),
            ))
        })
    });
    let stats = stream.stats();
    println!(
        "hot cache: {} hits, {} misses ({:.1} % without a round trip)",
        stats.hot_hits,
        stats.hot_misses,
        100.0 * stats.hot_hits as f64 / (stats.hot_hits + stats.hot_misses).max(1) as f64
    );
    group.finish();
    drop(server);
    thread.join().unwrap();
}

/// Median and p99 of `samples`; the rest of the tail is printed.
fn percentiles(what: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize];
    println!(
        "  {what:<20} p90 {:?}  p95 {:?}  p99.9 {:?}",
        at(0.9),
        at(0.95),
        at(0.999)
    );
    (at(0.5), at(0.99))
}

/// Median and p99 of 200K round trips of each, interleaved in rounds so
/// both see the same machine state.
fn round_trip_percentiles(_c: &mut Criterion) {
    let (server, thread) = ping_server();
    let pinger = Pinger::new(&server);
    let (_device, stream) = device_serving(false);
    let rounds = 4;
    let per_round = 50_000;
    let (mut pings, mut reserves) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for _ in 0..per_round {
            let start = Instant::now();
            black_box(pinger.ping(1));
            pings.push(start.elapsed());
        }
        for _ in 0..per_round {
            let start = Instant::now();
            let a = stream.reserve_with(4096, PageUpdate::Allow).unwrap();
            reserves.push(start.elapsed());
            drop(a);
        }
    }
    let (ping_median, ping_p99) = percentiles("crossbeam ping-pong", pings);
    let (reserve_median, reserve_p99) = percentiles("reserve round trip", reserves);
    println!(
        "round trip percentiles over {} each:\n  crossbeam ping-pong  median {:?}  p99 {:?}\n  reserve round trip   median {:?}  p99 {:?}\n  ratio                median {:.2}  p99 {:.2}",
        rounds * per_round,
        ping_median,
        ping_p99,
        reserve_median,
        reserve_p99,
        reserve_median.as_secs_f64() / ping_median.as_secs_f64(),
        reserve_p99.as_secs_f64() / ping_p99.as_secs_f64(),
    );
    drop(pinger);
    drop(server);
    thread.join().unwrap();
}

fn client_side(c: &mut Criterion) {
    let mut group = c.benchmark_group("client_side");
    let (_device, stream) = device_serving(true);
    group.bench_function("release_drop", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(4096);
                let batch = stream.reserve_many(&vec![256; n as usize]).unwrap();
                let start = Instant::now();
                for allocation in batch {
                    drop(black_box(allocation));
                }
                total += start.elapsed();
                left -= n;
            }
            total
        })
    });
    group.bench_function("reserve_many_16_per_item", |b| {
        b.iter_custom(|iters| {
            let sizes = [4096u64; 16];
            let batches = iters.div_ceil(16);
            let start = Instant::now();
            for _ in 0..batches {
                drop(black_box(stream.reserve_many(&sizes).unwrap()));
            }
            // `batches * 16` items took this long; scale to `iters` items.
            start
                .elapsed()
                .mul_f64(iters as f64 / (batches * 16) as f64)
        })
    });
    let held = stream.reserve(4096).unwrap();
    group.bench_function("resolve_lock_free", |b| {
        b.iter(|| drop(black_box(stream.try_resolve(&held).unwrap().unwrap())))
    });
    group.bench_function("resolve_lock_free_borrowed", |b| {
        b.iter(|| drop(black_box(stream.try_resolve_ref(&held).unwrap().unwrap())))
    });
    group.finish();
}

/// One decode step's sizes, asked for again every step (KV blocks,
/// activations, logits).
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
/// Allocations each client keeps live (two steps' worth).
const DECODE_LIVE: usize = 16;

/// `threads` clients, each making `per_thread` reserves of the decode
/// step's sizes in turn, dropping the oldest of its last 16; the wall time
/// of the slowest.
fn decode_clients<H: Send + 'static>(
    threads: usize,
    per_thread: u64,
    make: impl Fn() -> Box<dyn FnMut(u64) -> H + Send>,
) -> Duration {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let mut reserve = make();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut live: Vec<Option<H>> = (0..DECODE_LIVE).map(|_| None).collect();
                barrier.wait();
                for step in 0..per_thread as usize {
                    live[step % DECODE_LIVE] = None;
                    live[step % DECODE_LIVE] = Some(reserve(DECODE_STEP[step % DECODE_STEP.len()]));
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for worker in workers {
        worker.join().unwrap();
    }
    start.elapsed()
}

/// With `BUSY=1`, a thread spins on one core for the whole run (a loaded
/// server's other work).
fn busy_core() {
    if std::env::var("BUSY").is_ok_and(|busy| busy == "1") {
        std::thread::spawn(|| {
            loop {
                std::hint::spin_loop();
            }
        });
    }
}

fn decode(c: &mut Criterion) {
    busy_core();
    let mut group = c.benchmark_group("decode_clients");
    group.sample_size(10);
    for threads in [1usize, 2, 4, 8] {
        let (device, stream) = device_serving(true);
        // A model's weights: the stream is large, so its clients' hot
        // caches have room (1/256 of it).
        let _weights = stream.reserve_many(&[1 << 30; 16]).unwrap();
        // From the hot cache, or served in place every time.
        for (name, hot) in [("actor_hot", true), ("actor_in_place", false)] {
            group.bench_function(criterion::BenchmarkId::new(name, threads), |b| {
                b.iter_custom(|iters| {
                    let per = iters.div_ceil(threads as u64);
                    let elapsed = decode_clients(threads, per, || {
                        let client = stream.clone();
                        Box::new(move |size| {
                            if hot {
                                client.reserve(size).unwrap()
                            } else {
                                client.reserve_with(size, PageUpdate::Allow).unwrap()
                            }
                        })
                    });
                    elapsed.mul_f64(iters as f64 / (per * threads as u64) as f64)
                })
            });
        }
        let stats = stream.stats();
        println!(
            "  {threads} threads: hot cache {} hits, {} misses ({:.1} % without a round trip), {} taken back; reserved {} MiB, peak {} MiB",
            stats.hot_hits,
            stats.hot_misses,
            100.0 * stats.hot_hits as f64 / (stats.hot_hits + stats.hot_misses).max(1) as f64,
            stats.hot_taken_back,
            stats.bytes_reserved >> 20,
            stats.peak_bytes_reserved >> 20
        );
        drop(device);
        let manager = std::sync::Arc::new(parking_lot::Mutex::new(MemoryManager::new(
            VirtualStorage::new(),
            MemoryConfig::default(),
        )));
        group.bench_function(criterion::BenchmarkId::new("manager_mutex", threads), |b| {
            b.iter_custom(|iters| {
                let per = iters.div_ceil(threads as u64);
                let elapsed = decode_clients(threads, per, || {
                    let manager = manager.clone();
                    Box::new(move |size| manager.lock().reserve(size, PageUpdate::Allow).unwrap())
                });
                elapsed.mul_f64(iters as f64 / (per * threads as u64) as f64)
            })
        });
    }
    group.finish();
}

/// Two streams whose loads peak in turn, on a device past its headroom
/// each time: one reserves 32 MiB and drops it, then the other. Each
/// turn's room is at the other stream: a round hands its physical handles
/// over (virtual storage: the driver is free here, so this is the
/// service's own time), or, lending, the other serves it from its room
/// (the lender's turn and the asker's, taken on the reserving thread).
fn peaks_in_turn(c: &mut Criterion) {
    let mut group = c.benchmark_group("peaks_in_turn");
    for (name, lend) in [("rounds", false), ("lending", true)] {
        let device = Supervisor::virtual_device(ServiceConfig {
            idle_tick: None,
            settle: None,
            lend_across_streams: lend,
            ..ServiceConfig::default()
        });
        let (a, b) = (
            device.stream(StreamId(0)).unwrap(),
            device.stream(StreamId(1)).unwrap(),
        );
        drop(a.reserve(32 << 20).unwrap());
        group.bench_function(name, |bench| {
            bench.iter(|| {
                drop(black_box(b.reserve(32 << 20).unwrap()));
                drop(black_box(a.reserve(32 << 20).unwrap()));
            })
        });
        let driver = |s: &StreamHandle| s.report().unwrap().driver;
        let (da, db) = (driver(&a), driver(&b));
        println!(
            "peaks_in_turn/{name}: lent {} + {}, handles adopted {}, stream orders {}",
            a.stats().lent,
            b.stats().lent,
            da.handles_adopted + db.handles_adopted,
            da.stream_orders + db.stream_orders,
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = round_trip, round_trip_percentiles, client_side, decode, peaks_in_turn
}
criterion_main!(benches);
