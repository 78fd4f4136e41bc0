//! The C interface over host memory, as PyTorch calls it: many threads at
//! once, every bad call mixed in, statistics that add up, a trace that
//! replays. (One process, one library: this binary holds one test, so
//! the trace it dumps holds its calls alone.)

use std::ffi::{CString, c_void};
use streamalloc_torch::{
    streamalloc_dump_trace, streamalloc_empty_cache, streamalloc_free, streamalloc_malloc,
    streamalloc_record_stream, streamalloc_set_memory_fraction, streamalloc_set_recording,
};

mod common;
use common::{device, stats, stream};

#[test]
fn eight_threads_of_calls_with_every_bad_call_mixed_in_leave_nothing_behind() {
    const THREADS: usize = 8;
    const CALLS: usize = 100_000;
    const DEVICE: i32 = 0;
    streamalloc_set_recording(1);
    let threads: Vec<_> = (0..THREADS)
        .map(|thread| {
            std::thread::spawn(move || {
                let mut state = (thread as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut next = move || {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state
                };
                let mut held: Vec<(*mut c_void, usize, usize)> = Vec::new();
                let mut freed: Vec<(*mut c_void, usize)> = Vec::new();
                let mut bad = 0u64;
                for call in 0..CALLS {
                    let s = thread % 3;
                    match next() % 20 {
                        // Allocations of 1 B to 4 MiB; 0 is an ordinary call.
                        0..=8 => {
                            let size = match next() % 8 {
                                0 => 0,
                                1..=5 => (next() % 65_536) as usize + 1,
                                _ => (next() % (4 << 20)) as usize + 1,
                            };
                            let ptr = streamalloc_malloc(size, DEVICE, stream(s));
                            if size == 0 {
                                assert!(ptr.is_null(), "a size of 0 gets null");
                            } else {
                                assert!(!ptr.is_null(), "{size} bytes refused");
                                held.push((ptr, size, s));
                            }
                        }
                        9..=16 if !held.is_empty() => {
                            let at = (next() as usize) % held.len();
                            let (ptr, size, s) = held.swap_remove(at);
                            streamalloc_free(ptr, size, DEVICE, stream(s));
                            freed.push((ptr, size));
                        }
                        // The bad calls.
                        17 => {
                            bad += 1;
                            match call % 8 {
                                // A pointer never handed out.
                                0 => streamalloc_free(
                                    0xdead_0000 as *mut c_void,
                                    8,
                                    DEVICE,
                                    stream(s),
                                ),
                                // A double free.
                                1 => {
                                    if let Some(&(ptr, size)) = freed.last() {
                                        if !held.iter().any(|h| h.0 == ptr) {
                                            streamalloc_free(ptr, size, DEVICE, stream(s));
                                        }
                                    }
                                }
                                // Devices that are not.
                                2 => assert!(streamalloc_malloc(64, -1, stream(s)).is_null()),
                                3 => assert!(streamalloc_malloc(64, 1_000, stream(s)).is_null()),
                                // Past any device.
                                4 => assert!(
                                    streamalloc_malloc(1 << 60, DEVICE, stream(s)).is_null()
                                ),
                                // record_stream of a stranger.
                                5 => {
                                    streamalloc_record_stream(0xbeef_0000 as *mut c_void, stream(s))
                                }
                                // A fraction after the device's first use.
                                6 => streamalloc_set_memory_fraction(0.5, DEVICE),
                                // A fraction that is not one.
                                _ => streamalloc_set_memory_fraction(f64::NAN, 7),
                            }
                        }
                        18 if !held.is_empty() => {
                            let &(ptr, _, s) = &held[(next() as usize) % held.len()];
                            streamalloc_record_stream(ptr, stream((s + 1) % 3));
                        }
                        _ => {
                            if call % 5_000 == 0 {
                                streamalloc_empty_cache();
                            }
                        }
                    }
                }
                for (ptr, size, s) in held {
                    streamalloc_free(ptr, size, DEVICE, stream(s));
                }
                bad
            })
        })
        .collect();
    let bad: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(bad > THREADS as u64 * CALLS as u64 / 40);
    streamalloc_empty_cache();
    let all = stats();
    let dev = device(&all, i64::from(DEVICE));
    assert_eq!(dev["live_allocations"], 0, "{dev}");
    assert_eq!(dev["bytes_in_use"], 0, "{dev}");
    assert_eq!(all["live_bytes"], 0, "{all}");
    assert_eq!(all["allocations"], all["frees"], "{all}");
    let refusals = &all["refusals"];
    for kind in [
        "unknown_free",
        "bad_device",
        "out_of_memory",
        "unknown_record_stream",
        "bad_fraction",
    ] {
        assert!(refusals[kind].as_u64().unwrap() > 0, "{kind}: {refusals}");
    }
    assert_eq!(refusals["panic"], 0);
    // The driver's calls, by the path that asked, add up to them all; the
    // empty cache's give-back is the cleanup's.
    let by_path = dev["driver_by_path"].as_object().unwrap();
    let ops: streamalloc::storage::DriverOps =
        serde_json::from_value(dev["driver"].clone()).unwrap();
    let calls: u64 = by_path.values().map(|p| p["calls"].as_u64().unwrap()).sum();
    assert_eq!(calls, ops.calls(), "{by_path:?}");
    // And so do the granules they mapped (none here: host memory comes
    // in pages).
    let mapped: u64 = (by_path.values())
        .map(|p| p["granules_mapped"].as_u64().unwrap())
        .sum();
    assert_eq!(mapped, ops.granule_maps(), "{by_path:?}");
    assert!(
        by_path.contains_key("growth") && by_path.contains_key("cleanup"),
        "{by_path:?}"
    );
    // The dumped trace replays to the same peak live bytes.
    let path = std::env::temp_dir().join(format!("streamalloc-torch-{}.jsonl", std::process::id()));
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    let written = unsafe { streamalloc_dump_trace(c_path.as_ptr()) };
    assert_eq!(written as u64, all["allocations"].as_u64().unwrap() * 2);
    let events = streamalloc::trace::read_trace(&path, None).unwrap();
    let supervisor =
        streamalloc::service::Supervisor::virtual_device(streamalloc::service::ServiceConfig {
            clock: streamalloc::clock::ManualClock::shared(),
            ..streamalloc::service::ServiceConfig::default()
        });
    let report =
        streamalloc::replay::replay(&events, &supervisor, None, usize::MAX, |_| {}).unwrap();
    assert_eq!(
        report.peak_live_bytes,
        all["peak_live_bytes"].as_u64().unwrap()
    );
    assert_eq!(report.failures, 0);
    supervisor.shutdown();
    let _ = std::fs::remove_file(&path);
}
