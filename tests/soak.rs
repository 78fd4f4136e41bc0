//! A soak: client threads on several streams with random sizes, writes and
//! read-backs, cleanups, compactions, running short under a budget, and a
//! stream removed and created again under the same id. At the end: zero
//! leaked bytes, zero corrupted reads.
//!
//! Short by default; `STREAMALLOC_SOAK_SECS=600 cargo test --release --test
//! soak -- --nocapture` runs ten minutes and prints the counts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use streamalloc::memory::{Cleanup, StreamId};
use streamalloc::service::{ServiceConfig, ServiceError, Supervisor};

mod common;
use common::MIB;

#[test]
fn soak() {
    let seconds: f64 = std::env::var("STREAMALLOC_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let device = Arc::new(Supervisor::host(ServiceConfig {
        budget: Some(96 * MIB),
        idle_tick: Some(Duration::from_millis(20)),
        compaction_threshold: Some(1.5),
        supervise_tick: Duration::from_millis(10),
        ..ServiceConfig::default()
    }));
    let ops = Arc::new(AtomicU64::new(0));
    let reads = Arc::new(AtomicU64::new(0));
    let short = Arc::new(AtomicU64::new(0));
    let stopped = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let clients: Vec<_> = (0..4u64)
        .map(|client| {
            let (device, ops, reads, short, stopped, done) = (
                device.clone(),
                ops.clone(),
                reads.clone(),
                short.clone(),
                stopped.clone(),
                done.clone(),
            );
            std::thread::spawn(move || {
                let mut seed = 0x9e37_79b9_7f4a_7c15 ^ client;
                let mut next = move || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed
                };
                let mut live = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    let stream_id = StreamId((client % 3) as u32);
                    let stream = match device.stream(stream_id) {
                        Ok(stream) => stream,
                        Err(ServiceError::SupervisorStopped) => return,
                        Err(err) => panic!("{err}"),
                    };
                    for _ in 0..200 {
                        let roll = next() % 100;
                        let result = if roll < 45 {
                            let size = 1 + next() % [4096, 200_000, 3 * MIB][(next() % 3) as usize];
                            stream.reserve(size).and_then(|a| {
                                let mark = (next() % 255) as u8 + 1;
                                stream.write(&a, size - 1, &[mark])?;
                                live.push((a, size, mark));
                                Ok(())
                            })
                        } else if roll < 80 && !live.is_empty() {
                            let (a, size, mark) = live.swap_remove((next() as usize) % live.len());
                            stream.read(&a, size - 1, 1).map(|byte| {
                                assert_eq!(byte[0], mark, "corrupted read");
                                reads.fetch_add(1, Ordering::Relaxed);
                            })
                        } else if roll < 85 {
                            stream.compact().map(drop)
                        } else if roll < 88 {
                            stream.cleanup(Cleanup::Explicit)
                        } else if roll < 90 && !live.is_empty() {
                            let (a, size, mark) = &live[(next() as usize) % live.len()];
                            stream.resolve(a).map(|pinned| {
                                // SAFETY: host memory, pinned for the read.
                                let last = unsafe { *((pinned.addr() + size - 1) as *const u8) };
                                assert_eq!(last, *mark, "corrupted resolve");
                            })
                        } else {
                            Ok(())
                        };
                        ops.fetch_add(1, Ordering::Relaxed);
                        match result {
                            Ok(()) => {}
                            Err(ServiceError::OutOfMemory(_)) => {
                                short.fetch_add(1, Ordering::Relaxed);
                                live.clear();
                            }
                            Err(
                                ServiceError::StreamStopped(_) | ServiceError::WrongStream { .. },
                            ) => {
                                // The stream was removed under us: its allocations are gone.
                                stopped.fetch_add(1, Ordering::Relaxed);
                                live.clear();
                                break;
                            }
                            Err(err) => panic!("unexpected {err}"),
                        }
                    }
                }
            })
        })
        .collect();
    let mut recreated = 0;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        // Remove a stream under load; clients bring it back.
        if device.remove_stream(StreamId(recreated % 3)).is_ok() {
            recreated += 1;
        }
    }
    done.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().unwrap();
    }
    let budget = device.budget().unwrap().clone();
    for report in device.shutdown() {
        assert_eq!(report.unwrap().bytes_left, 0, "a stream leaked pages");
    }
    assert_eq!(budget.granted(), 0, "bytes leaked from the budget");
    assert!(budget.peak() <= budget.limit());
    eprintln!(
        "soak {seconds} s: {} operations, {} verified reads, {} out-of-memory answers, {} streams removed and recreated ({} client restarts), 0 leaked bytes, 0 corrupted reads",
        ops.load(Ordering::Relaxed),
        reads.load(Ordering::Relaxed),
        short.load(Ordering::Relaxed),
        recreated,
        stopped.load(Ordering::Relaxed),
    );
}
