//! The reliability sweep: one regression test for each defect an
//! adversarial pass found (issue 14 of the tracker). Each failed on the code
//! before its fix; the item number is in the test's name.

use std::sync::Arc;
use std::time::Duration;
use streamalloc::memory::{
    DeviceProperties, MemoryConfig, MemoryConfiguration, MemoryError, MemoryManager, PageUpdate,
    StreamId,
};
use streamalloc::service::{ServiceConfig, ServiceError, Supervisor};
use streamalloc::storage::{
    BudgetedStorage, DeviceBudget, DeviceStorage, HostStorage, StorageError, StorageId,
    VirtualStorage,
};
use streamalloc::trace::{TraceAction, TraceEvent, read_torch_snapshot};

mod common;
use common::MIB;

/// A device whose policies never act on their own while a test runs, and
/// whose shutdown waits for pins only briefly.
fn quiet() -> ServiceConfig {
    ServiceConfig {
        pin_wait: Duration::from_millis(20),
        ..common::quiet()
    }
}

/// Item 1: one caller's sizes that overflow when summed are refused for that
/// caller; the stream (and every other client's allocations) live on.
#[test]
fn item01_overflowing_sizes_fail_one_request_not_the_stream() {
    // The default policies: headroom weighs the request's total.
    let device = Supervisor::host(ServiceConfig::default());
    let stream = device.stream(StreamId(0)).unwrap();
    let other = stream.reserve(4096).unwrap();
    stream.write(&other, 0, &[7; 16]).unwrap();
    for sizes in [
        &[1, u64::MAX][..],
        &[u64::MAX, u64::MAX],
        &[u64::MAX / 2 + 1, u64::MAX / 2 + 1],
    ] {
        let err = stream.reserve_many(sizes).unwrap_err();
        assert!(
            matches!(err, ServiceError::Memory(MemoryError::TooLarge { .. })),
            "{sizes:?}: {err}"
        );
    }
    // A wait too long for the clock to name is a long wait, not a panic.
    let waited = stream.reserve_timeout(64, Duration::MAX).unwrap();
    assert_eq!(waited.size(), 64);
    assert_eq!(stream.read(&other, 0, 16).unwrap(), vec![7; 16]);
    assert!(stream.reserve(64).is_ok(), "the stream still serves");
}

/// Item 2: a pin taken before `bind` keeps the bytes where they are after
/// the new handle drops: nothing else is carved over them until it goes.
#[test]
fn item02_a_pin_is_honoured_after_bind() {
    let device = Supervisor::host(quiet());
    let stream = device.stream(StreamId(0)).unwrap();
    let a = stream.reserve(4096).unwrap();
    stream.write(&a, 0, &[0xAB; 4096]).unwrap();
    let pinned = stream.resolve(&a).unwrap();
    let unbound = stream.unbound().unwrap();
    stream.bind(a, &unbound, 0).unwrap();
    drop(unbound);
    let b = stream.reserve(4096).unwrap();
    let b_addr = stream.resolve(&b).unwrap().addr();
    assert_ne!(b_addr, pinned.addr(), "b was carved over pinned bytes");
    stream.write(&b, 0, &[0xCD; 4096]).unwrap();
    // SAFETY: the pin keeps the allocation's host bytes in place.
    let held = unsafe { std::slice::from_raw_parts(pinned.addr() as *const u8, 4096) };
    assert!(held.iter().all(|&byte| byte == 0xAB));
    drop(pinned);
    stream.report().unwrap();
    assert_eq!(stream.stats().bytes_in_use, 4096, "freed once unpinned");
}

/// Item 2, on the manager alone: the same sequence, and relocation leaves a
/// pinned, rebound allocation in place.
#[test]
fn item02_manager_keeps_a_rebound_pinned_allocation() {
    let mut memory = MemoryManager::new(HostStorage::new(), MemoryConfig::default());
    let a = memory.reserve(4096, PageUpdate::Allow).unwrap();
    memory.write(&a, 0, &[0x11; 4096]).unwrap();
    let pinned = memory.pin(&a).unwrap();
    let unbound = memory.unbound();
    memory.bind(a, &unbound, 0).unwrap();
    assert!(
        memory.pinned_count() == 1,
        "the rebound allocation is pinned"
    );
    memory.compact().unwrap();
    drop(unbound);
    let b = memory.reserve(4096, PageUpdate::Allow).unwrap();
    assert_ne!(memory.pin(&b).unwrap().addr(), pinned.addr());
    assert_eq!(memory.bytes_in_use(), 8192, "still held while pinned");
    drop(pinned);
    memory.process_releases();
    assert_eq!(memory.bytes_in_use(), 4096);
}

/// Item 3: `shutdown` racing `stream` and `remove_stream`: once it returns,
/// no stream runs and no reserve succeeds.
#[test]
fn item03_no_stream_survives_a_racing_shutdown() {
    for _ in 0..50 {
        let device = Arc::new(Supervisor::virtual_device(quiet()));
        let barrier = Arc::new(std::sync::Barrier::new(9));
        let racers: Vec<_> = (0..8u32)
            .map(|t| {
                let device = Arc::clone(&device);
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut handles = Vec::new();
                    for i in 0.. {
                        let id = StreamId(t * 4 + i % 4);
                        match device.stream(id) {
                            Ok(handle) => handles.push(handle),
                            Err(_) => break,
                        }
                        if i % 3 == 2 {
                            let _ = device.remove_stream(id);
                        }
                    }
                    handles
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(Duration::from_millis(2));
        device.shutdown();
        let after = device.stats();
        let handles: Vec<_> = racers.into_iter().flat_map(|r| r.join().unwrap()).collect();
        assert!(after.is_empty(), "streams registered after shutdown");
        for handle in handles {
            assert!(
                matches!(handle.reserve(64), Err(ServiceError::StreamStopped(_))),
                "a stream still serves after shutdown returned"
            );
        }
        assert!(matches!(
            device.stream(StreamId(0)),
            Err(ServiceError::SupervisorStopped)
        ));
    }
}

/// Item 4: a pickle nested tens of thousands deep is an error, not an abort.
#[test]
fn item04_deeply_nested_pickle_is_an_error() {
    let mut pickle = vec![0x80, 2];
    pickle.extend(std::iter::repeat_n(b']', 40_000)); // EMPTY_LIST
    pickle.extend(std::iter::repeat_n(b'a', 39_999)); // APPEND
    pickle.push(b'.');
    // A normal thread stack, as the CLI's main thread has.
    let result = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || read_torch_snapshot(&pickle).map(|e| e.len()))
        .unwrap()
        .join()
        .expect("the reader must not overflow its stack");
    assert!(result.is_err(), "not a snapshot: {result:?}");
    // Lists nested through the memo, with a constant stack.
    let mut memo = vec![0x80, 2, b']', b'q', 0];
    for i in 0..20_000u32 {
        memo.extend([
            b'h',
            (i % 250) as u8,
            b']',
            b'q',
            ((i + 1) % 250) as u8,
            b'a',
        ]);
    }
    memo.push(b'.');
    let result = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || read_torch_snapshot(&memo).map(|e| e.len()))
        .unwrap()
        .join()
        .expect("the reader must not overflow its stack");
    assert!(result.is_err());
}

/// Item 5: a trace with more streams than a replay may start is a typed
/// error before any actor starts.
#[test]
fn item05_a_trace_with_too_many_streams_is_refused() {
    let events: Vec<TraceEvent> = (0..20_000u64)
        .map(|stream| TraceEvent::new(stream, stream, TraceAction::Alloc, stream + 1, 256))
        .collect();
    let device = Supervisor::virtual_device(quiet());
    let err = streamalloc::replay::replay(&events, &device, None, 1, |_| {}).unwrap_err();
    assert!(
        matches!(
            err,
            ServiceError::TooManyStreams {
                requested: 20_000,
                ..
            }
        ),
        "{err}"
    );
    assert!(device.stats().is_empty(), "no actor started");
    // And a server asking for stream after stream meets the same limit.
    let limit = quiet().max_streams;
    let device = Supervisor::virtual_device(ServiceConfig {
        max_streams: 4,
        ..quiet()
    });
    for id in 0..4 {
        device.stream(StreamId(id)).unwrap();
    }
    assert!(matches!(
        device.stream(StreamId(4)),
        Err(ServiceError::TooManyStreams { limit: 4, .. })
    ));
    assert!(
        device.stream(StreamId(3)).is_ok(),
        "a known stream still answers"
    );
    assert!(limit >= 64);
}

/// Item 6: a refused allocation never raises the peak; a request of the
/// device's largest page is served, not refused as an invalid size.
#[test]
fn item06_peaks_count_only_what_the_storage_gave() {
    let budget = Arc::new(DeviceBudget::new(u64::MAX));
    let mut storage = BudgetedStorage::new(VirtualStorage::new(), budget.clone());
    assert!(storage.allocate(1 << 50).is_err());
    assert_eq!(budget.peak(), 0, "a refused page raised the peak");
    assert_eq!(budget.granted(), 0);
    storage.allocate(MIB).unwrap();
    assert_eq!(budget.peak(), MIB);

    let config = MemoryConfig {
        device: DeviceProperties::new(1 << 40, 256),
        ..MemoryConfig::default()
    };
    let mut memory = MemoryManager::new(VirtualStorage::new(), config);
    let tib = memory.reserve(1 << 40, PageUpdate::Allow);
    assert!(tib.is_ok(), "{:?}", tib.err().map(|e| e.to_string()));
    assert!(matches!(
        memory.reserve((1 << 40) + 1, PageUpdate::Allow),
        Err(MemoryError::TooLarge { .. })
    ));

    let device = Supervisor::virtual_device(ServiceConfig {
        memory: MemoryConfig {
            device: DeviceProperties::new(1 << 40, 256),
            ..MemoryConfig::default()
        },
        budget: Some(64 * MIB),
        ..quiet()
    });
    let stream = device.stream(StreamId(0)).unwrap();
    let err = stream.reserve(1 << 40).unwrap_err();
    assert!(matches!(err, ServiceError::OutOfMemory(_)), "{err}");
    assert!(device.device_stats().peak_bytes_reserved <= 64 * MIB);
}

/// Item 7: printing an out-of-range error near `u64::MAX` does not overflow.
#[test]
fn item07_out_of_range_prints_without_overflow() {
    let err = StorageError::OutOfRange {
        id: StorageId(3),
        offset: u64::MAX - 1,
        len: 10,
        page_size: 4096,
    };
    let text = err.to_string();
    assert!(text.contains(&(u64::MAX - 1).to_string()), "{text}");
    assert!(text.contains("page#3"), "{text}");
}

/// Item 8: a failure recorded on one stream means nothing on another.
#[test]
fn item08_failure_ids_are_scoped_to_their_stream() {
    let device = Supervisor::host(quiet());
    let s0 = device.stream(StreamId(0)).unwrap();
    let s1 = device.stream(StreamId(1)).unwrap();
    let on_s0 = s0.record_failure("s0's kernel failed", &[]).unwrap();
    let on_s1 = s1.record_failure("s1's copy failed", &[]).unwrap();
    assert_ne!(on_s0, on_s1);
    let a = s1.reserve(64).unwrap();
    let err = s1.taint(&a, 0..8, on_s0).unwrap_err();
    assert!(
        matches!(err, ServiceError::Memory(MemoryError::UnknownFailure(id)) if id == on_s0),
        "{err}"
    );
    assert_eq!(s1.failure(&a, 0..8).unwrap(), None);
    s1.taint(&a, 0..8, on_s1).unwrap();
    assert_eq!(s1.failure(&a, 0..8).unwrap(), Some(on_s1));

    let mut m0 = MemoryManager::new(HostStorage::new(), MemoryConfig::default());
    let mut m1 = MemoryManager::new(HostStorage::new(), MemoryConfig::default());
    let f0 = m0.record_failure("m0", &[]);
    let b = m1.reserve(64, PageUpdate::Allow).unwrap();
    assert!(matches!(
        m1.taint(&b, 0..1, f0),
        Err(MemoryError::UnknownFailure(_))
    ));
    let f1 = m1.record_failure("m1", &[f0]);
    assert!(
        m1.failures().causes(f1).is_empty(),
        "a foreign cause is dropped"
    );
}

/// Item 9: a pin that outlives shutdown keeps its page: the bytes stay
/// readable until the pin drops, and only then go back to the device.
#[test]
fn item09_a_pin_keeps_its_page_past_shutdown() {
    let device = Supervisor::host(quiet());
    let stream = device.stream(StreamId(0)).unwrap();
    let a = stream.reserve(MIB).unwrap();
    stream.write(&a, 0, &vec![0x5A; MIB as usize]).unwrap();
    let other = stream.reserve(8 * MIB).unwrap();
    let pinned = stream.resolve(&a).unwrap();
    drop(other);
    let reports = device.shutdown();
    let report = reports[0].as_ref().unwrap();
    assert_eq!(report.pinned_at_exit, 1);
    assert!(report.bytes_left >= MIB, "the pinned page was returned");
    let held = device.device_stats().bytes_reserved;
    assert!(
        (MIB..8 * MIB).contains(&held),
        "held {held}: unpinned pages go back"
    );
    // SAFETY: the pin keeps the page mapped.
    let bytes = unsafe { std::slice::from_raw_parts(pinned.addr() as *const u8, MIB as usize) };
    assert!(bytes.iter().all(|&byte| byte == 0x5A));
    assert!(matches!(
        stream.resolve(&a),
        Err(ServiceError::StreamStopped(_))
    ));
    drop(pinned);
    assert_eq!(
        device.device_stats().bytes_reserved,
        0,
        "back once unpinned"
    );
    drop(a);
}

/// Item 9, dropping the supervisor with a pin alive (the same path).
#[test]
fn item09_dropping_the_supervisor_keeps_pinned_pages() {
    let device = Supervisor::host(quiet());
    let budget_view = device.stream(StreamId(0)).unwrap();
    let a = budget_view.reserve(4096).unwrap();
    budget_view.write(&a, 0, &[9; 4096]).unwrap();
    let pinned = budget_view.resolve(&a).unwrap();
    drop(device);
    // SAFETY: the pin keeps the page.
    let bytes = unsafe { std::slice::from_raw_parts(pinned.addr() as *const u8, 4096) };
    assert!(bytes.iter().all(|&byte| byte == 9));
    drop(pinned);
}

/// Item 10: compaction copies within a page while other allocations on it
/// are read through pinned raw pointers on other threads. (The defect was a
/// `&mut` over the whole page during the copy: undefined behaviour that no
/// run shows without Miri; this test pins down the behaviour the fix keeps.)
#[test]
fn item10_copies_leave_pinned_neighbours_intact() {
    let device = Supervisor::host(quiet());
    let stream = device.stream(StreamId(0)).unwrap();
    let keep: Vec<_> = (0..16u8)
        .map(|i| {
            let a = stream.reserve(64 * 1024).unwrap();
            stream.write(&a, 0, &vec![i; 64 * 1024]).unwrap();
            a
        })
        .collect();
    let pins: Vec<_> = keep
        .iter()
        .step_by(2)
        .map(|a| stream.resolve(a).unwrap())
        .collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = pins
        .iter()
        .enumerate()
        .map(|(i, pin)| {
            let (addr, len, stop) = (pin.addr() as usize, pin.len() as usize, stop.clone());
            std::thread::spawn(move || {
                let expect = (i * 2) as u8;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // SAFETY: the pin keeps the bytes in place until the
                    // main thread joins this reader.
                    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
                    assert!(bytes.iter().all(|&b| b == expect));
                }
            })
        })
        .collect();
    for round in 0..20 {
        let scratch: Vec<_> = (0..8).map(|_| stream.reserve(64 * 1024).unwrap()).collect();
        drop(
            scratch
                .into_iter()
                .step_by(2 + round % 2)
                .collect::<Vec<_>>(),
        );
        stream.compact().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for reader in readers {
        reader.join().unwrap();
    }
    for (i, a) in keep.iter().enumerate() {
        assert_eq!(
            stream.read(a, 0, 64 * 1024).unwrap(),
            vec![i as u8; 64 * 1024]
        );
    }
    drop(pins);
}

/// Item 11: exclusive pages never exceed the device's largest page, even
/// when that is not a power of two.
#[test]
fn item11_exclusive_pages_stay_within_the_largest_page() {
    let config = MemoryConfig {
        device: DeviceProperties::new(100 * MIB, 256),
        pools: MemoryConfiguration::ExclusivePages,
        ..MemoryConfig::default()
    };
    let mut memory = MemoryManager::new(VirtualStorage::new(), config);
    let big = memory.reserve(99 * MIB, PageUpdate::Allow).unwrap();
    assert!(
        memory.bytes_reserved() <= 100 * MIB,
        "{}",
        memory.bytes_reserved()
    );
    drop(big);
    let full = memory.reserve(100 * MIB, PageUpdate::Allow).unwrap();
    assert!(memory.bytes_reserved() <= 100 * MIB);
    drop(full);
}
