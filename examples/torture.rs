//! A torture run: many client threads on a few streams under a tight budget,
//! mixing every operation with misuse — verified writes and reads, reads
//! through pinned raw pointers while compactions move neighbours, binds of
//! pinned allocations, cancelled futures, sizes that overflow, foreign and
//! stale handles, streams removed under load — then a shutdown with pins
//! still held. It counts operations, verified reads, corrupt reads and
//! leaked bytes, and fails (exit 1) on any corrupt read, leak, panic or
//! budget overshoot.
//!
//! `cargo run --release --example torture -- [SECONDS] [THREADS] [STREAMS]
//! [--hot-cache]` (defaults 60, 12, 4; `--hot-cache` gives every client
//! handle a hot cache, `ServiceConfig::hot_cache`, and half the
//! reservations a few repeated shapes); `docs/reliability.md` has a
//! ten-minute run.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};
use streamalloc::memory::{Allocation, Cleanup, StreamId};
use streamalloc::service::{Calls, ServiceConfig, ServiceError, StreamHandle, Supervisor};

const MIB: u64 = 1 << 20;

#[derive(Default)]
struct Counts {
    ops: AtomicU64,
    verified: AtomicU64,
    pinned_reads: AtomicU64,
    corrupt: AtomicU64,
    out_of_memory: AtomicU64,
    cancelled: AtomicU64,
    misuse: AtomicU64,
    removed: AtomicU64,
    binds: AtomicU64,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A live allocation and the byte every position of it holds.
struct Held {
    allocation: Allocation,
    size: u64,
    mark: u8,
}

fn check(counts: &Counts, stream: &StreamHandle, held: &Held) -> Result<(), ServiceError> {
    let at = [0, held.size / 2, held.size - 1];
    for offset in at {
        let byte = stream.read(&held.allocation, offset, 1)?;
        if byte[0] != held.mark {
            counts.corrupt.fetch_add(1, Ordering::Relaxed);
            eprintln!("corrupt read at {offset} of {} bytes", held.size);
        }
    }
    counts.verified.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Poll a future once and drop it: a caller that gave up.
fn poll_once_then_cancel<F: Future>(future: F) {
    let mut future = pin!(future);
    let mut context = Context::from_waker(Waker::noop());
    let _ = future.as_mut().poll(&mut context);
}

fn client(
    device: Arc<Supervisor>,
    counts: Arc<Counts>,
    done: Arc<AtomicBool>,
    seed: u64,
    streams: u32,
    shapes: bool,
) {
    let mut rng = Rng(seed | 1);
    let mut held: Vec<(StreamId, Held)> = Vec::new();
    let other = Supervisor::virtual_device(ServiceConfig::default());
    let foreign = other.stream(StreamId(0)).unwrap().reserve(64).unwrap();
    while !done.load(Ordering::Relaxed) {
        let id = StreamId(rng.below(u64::from(streams)) as u32);
        let stream = match device.stream(id) {
            Ok(stream) => stream,
            Err(ServiceError::SupervisorStopped) => return,
            Err(err) => panic!("stream {id}: {err}"),
        };
        for _ in 0..100 {
            counts.ops.fetch_add(1, Ordering::Relaxed);
            let roll = rng.below(100);
            let result: Result<(), ServiceError> = (|| {
                match roll {
                    0..=34 => {
                        let scale = [512, 64 * 1024, 2 * MIB][rng.below(3) as usize];
                        let size = if shapes && rng.below(2) == 0 {
                            // A few shapes again and again: what a hot cache
                            // serves.
                            [64, 4096, 48 * 1024][rng.below(3) as usize]
                        } else {
                            1 + rng.below(scale)
                        };
                        let allocation = stream.reserve(size)?;
                        let mark = (rng.below(255) + 1) as u8;
                        stream.write(&allocation, 0, &vec![mark; size as usize])?;
                        held.push((
                            id,
                            Held {
                                allocation,
                                size,
                                mark,
                            },
                        ));
                    }
                    35..=54 if !held.is_empty() => {
                        let (owner, h) = held.swap_remove(rng.below(held.len() as u64) as usize);
                        if owner == id {
                            check(&counts, &stream, &h)?;
                        }
                    }
                    55..=62 if !held.is_empty() => {
                        // Read through a pin while compaction may run.
                        let index = rng.below(held.len() as u64) as usize;
                        let (owner, h) = &held[index];
                        if *owner == id {
                            let pinned = stream.resolve(&h.allocation)?;
                            // SAFETY: host memory, held in place by the pin.
                            let bytes = unsafe {
                                std::slice::from_raw_parts(
                                    pinned.addr() as *const u8,
                                    h.size as usize,
                                )
                            };
                            if bytes.iter().any(|b| *b != h.mark) {
                                counts.corrupt.fetch_add(1, Ordering::Relaxed);
                                eprintln!("corrupt pinned read");
                            }
                            counts.pinned_reads.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    63..=67 => {
                        stream.compact()?;
                    }
                    68..=69 => stream.cleanup(Cleanup::Explicit)?,
                    70..=74 if !held.is_empty() => {
                        // Bind, sometimes while pinned: the pin must hold.
                        let index = rng.below(held.len() as u64) as usize;
                        if held[index].0 == id {
                            let (_, h) = held.swap_remove(index);
                            let pin = (rng.below(2) == 0).then(|| stream.resolve(&h.allocation));
                            let unbound = stream.unbound()?;
                            stream.bind(h.allocation, &unbound, 0)?;
                            counts.binds.fetch_add(1, Ordering::Relaxed);
                            let rebound = Held {
                                allocation: unbound,
                                size: h.size,
                                mark: h.mark,
                            };
                            if let Some(Ok(pin)) = &pin {
                                // SAFETY: host memory, held in place by the pin.
                                let last = unsafe { *((pin.addr() + h.size - 1) as *const u8) };
                                if last != h.mark {
                                    counts.corrupt.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            check(&counts, &stream, &rebound)?;
                            if rng.below(2) == 0 {
                                held.push((id, rebound));
                            }
                        }
                    }
                    75..=79 => {
                        poll_once_then_cancel(stream.reserve_async(1 + rng.below(MIB)));
                        counts.cancelled.fetch_add(1, Ordering::Relaxed);
                    }
                    80..=84 => {
                        // Misuse: each must be a typed error, never a panic.
                        let answers = [
                            stream.reserve_many(&[1, u64::MAX]).err(),
                            stream.reserve(0).err(),
                            stream.read(&foreign, 0, 1).err(),
                            stream.reserve_timeout(u64::MAX, Duration::MAX).err(),
                        ];
                        if answers.iter().any(Option::is_none) {
                            panic!("misuse was accepted: {answers:?}");
                        }
                        counts.misuse.fetch_add(4, Ordering::Relaxed);
                    }
                    85..=89 => {
                        let sizes: Vec<u64> = (0..1 + rng.below(8))
                            .map(|_| 1 + rng.below(256 * 1024))
                            .collect();
                        drop(stream.reserve_many(&sizes)?);
                    }
                    _ => {}
                }
                Ok(())
            })();
            match result {
                Ok(()) => {}
                Err(ServiceError::OutOfMemory(_)) => {
                    counts.out_of_memory.fetch_add(1, Ordering::Relaxed);
                    // Give back some of what this client holds.
                    held.truncate(held.len() / 2);
                }
                Err(
                    ServiceError::StreamStopped(_)
                    | ServiceError::WrongStream { .. }
                    | ServiceError::Memory(_),
                ) => {
                    // The stream was removed under us (its handles are stale).
                    held.retain(|(owner, _)| *owner != id);
                    break;
                }
                Err(err) => panic!("unexpected {err}"),
            }
        }
    }
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let seconds = args.first().copied().unwrap_or(60);
    let threads = args.get(1).copied().unwrap_or(12);
    let streams = args.get(2).copied().unwrap_or(4) as u32;
    let hot_cache = std::env::args().any(|a| a == "--hot-cache");
    let budget = 128 * MIB;
    let device = Arc::new(Supervisor::host(ServiceConfig {
        budget: Some(budget),
        idle_tick: Some(Duration::from_millis(20)),
        compaction_threshold: Some(1.5),
        supervise_tick: Duration::from_millis(10),
        pin_wait: Duration::from_millis(50),
        calls: Calls {
            hot_cache,
            ..Calls::default()
        },
        ..ServiceConfig::default()
    }));
    let counts = Arc::new(Counts::default());
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let clients: Vec<_> = (0..threads)
        .map(|t| {
            let (device, counts, done) = (device.clone(), counts.clone(), done.clone());
            std::thread::spawn(move || {
                client(
                    device,
                    counts,
                    done,
                    0x9e37_79b9_7f4a_7c15 ^ t,
                    streams,
                    hot_cache,
                )
            })
        })
        .collect();
    let mut round = 0;
    while start.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(250));
        round += 1;
        if round % 4 == 0 && device.remove_stream(StreamId(round % streams)).is_ok() {
            counts.removed.fetch_add(1, Ordering::Relaxed);
        }
        assert!(device.budget().unwrap().peak() <= budget, "budget exceeded");
    }
    done.store(true, Ordering::Relaxed);
    let mut panics = 0;
    for client in clients {
        if client.join().is_err() {
            panics += 1;
        }
    }
    // A pin held across shutdown keeps its page until it drops.
    let last = device.stream(StreamId(0)).unwrap();
    let kept = last.reserve(4096).unwrap();
    last.write(&kept, 0, &[0x77; 4096]).unwrap();
    let pin = last.resolve(&kept).unwrap();
    // Hits and misses of the streams registered now (a removed stream's
    // go with it).
    let (hits, misses) = device
        .stats()
        .iter()
        .fold((0, 0), |(hits, misses), stream| {
            (hits + stream.hot_hits, misses + stream.hot_misses)
        });
    let meter = device.budget().unwrap().clone();
    let reports = device.shutdown();
    // SAFETY: the pin keeps the page past shutdown.
    let intact = unsafe { std::slice::from_raw_parts(pin.addr() as *const u8, 4096) }
        .iter()
        .all(|b| *b == 0x77);
    drop(pin);
    drop(kept);
    let leaked = meter.held();
    let failed_streams = reports.iter().filter(|r| r.is_err()).count();
    let c = &counts;
    println!(
        "torture: {seconds} s, {threads} threads, {streams} streams, budget {} MiB: {} operations, {} verified reads, {} reads through pins, {} binds, {} cancelled futures, {} misuse calls refused, {} out-of-memory answers, {} streams removed; {} corrupt reads, {} leaked bytes, {} panics, budget peak {} of {} bytes, pinned page intact past shutdown: {intact}{}",
        budget / MIB,
        c.ops.load(Ordering::Relaxed),
        c.verified.load(Ordering::Relaxed),
        c.pinned_reads.load(Ordering::Relaxed),
        c.binds.load(Ordering::Relaxed),
        c.cancelled.load(Ordering::Relaxed),
        c.misuse.load(Ordering::Relaxed),
        c.out_of_memory.load(Ordering::Relaxed),
        c.removed.load(Ordering::Relaxed),
        c.corrupt.load(Ordering::Relaxed),
        leaked,
        panics,
        meter.peak(),
        budget,
        if hot_cache {
            format!("; hot caches of the streams left: {hits} hits, {misses} misses")
        } else {
            String::new()
        },
    );
    let corrupt = c.corrupt.load(Ordering::Relaxed);
    if corrupt > 0
        || leaked > 0
        || panics > 0
        || failed_streams > 0
        || !intact
        || meter.peak() > budget
    {
        std::process::exit(1);
    }
}
