//! The service end to end: many clients on several streams, every error
//! path, release without a round trip, lock-free resolve, shutdown and
//! failure. Bounded so `cargo test` stays quick.

use std::sync::Arc;
use std::time::Duration;
use streamalloc::memory::{
    AllocationMode, Cleanup, MemoryConfig, MemoryConfiguration, MemoryError, MemoryManager,
    PageUpdate, RelocationReason, StreamId,
};
use streamalloc::service::{Calls, ServiceConfig, ServiceError, StreamState, Supervisor};
use streamalloc::storage::{
    DeviceStorage, HostStorage, Resource, StorageError, StorageHandle, StorageId,
};

fn host() -> Supervisor {
    Supervisor::host(ServiceConfig::default())
}

#[test]
fn many_clients_on_several_streams_keep_their_bytes() {
    let device = Arc::new(host());
    let threads: Vec<_> = (0..6u32)
        .map(|client| {
            let stream = device.stream(StreamId(client % 3)).unwrap();
            std::thread::spawn(move || {
                let mut live = Vec::new();
                for i in 0..300u64 {
                    let size = 16 + (i * 7919 + u64::from(client) * 104_729) % 200_000;
                    let a = stream.reserve(size).unwrap();
                    let mark = [client as u8, i as u8, (i >> 8) as u8];
                    stream.write(&a, size - 3, &mark).unwrap();
                    live.push((a, size, mark));
                    if i % 3 == 0 {
                        let (a, size, mark) = live.swap_remove((i as usize * 31) % live.len());
                        assert_eq!(stream.read(&a, size - 3, 3).unwrap(), mark);
                    }
                    if i % 97 == 0 {
                        stream.compact().unwrap();
                    }
                }
                for (a, size, mark) in &live {
                    assert_eq!(stream.read(a, size - 3, 3).unwrap(), *mark);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let stats = device.stats();
    assert_eq!(stats.len(), 3);
    // Each stream's 600: reserved there, or lent by another stream past
    // the headroom (`docs/service.md`, "Serving another stream").
    assert!(
        stats.iter().all(|s| s.reservations + s.borrowed == 600),
        "{stats:?}"
    );
    let lent: u64 = stats.iter().map(|s| s.lent).sum();
    let borrowed: u64 = stats.iter().map(|s| s.borrowed).sum();
    assert_eq!(lent, borrowed);
    for report in device.shutdown() {
        let report = report.unwrap();
        assert_eq!(report.bytes_left, 0, "{report:?}");
    }
}

#[test]
fn release_needs_no_round_trip_and_reaches_the_actor() {
    let device = host();
    let stream = device.stream(StreamId(0)).unwrap();
    let batch = stream.reserve_many(&[1000; 64]).unwrap();
    assert_eq!(batch.len(), 64);
    assert_eq!(stream.report().unwrap().usage().number_allocs, 64);
    drop(batch);
    assert_eq!(stream.report().unwrap().usage().number_allocs, 0);
}

#[test]
fn reserve_many_is_all_or_nothing() {
    let device = host();
    let stream = device.stream(StreamId(0)).unwrap();
    let err = stream.reserve_many(&[100, 200, 0, 300]).unwrap_err();
    assert_eq!(err, ServiceError::Memory(MemoryError::ZeroSize));
    assert_eq!(stream.report().unwrap().usage().number_allocs, 0);
}

#[test]
fn resolve_is_lock_free_when_published_and_pins_hold_the_address() {
    let device = host();
    let stream = device.stream(StreamId(0)).unwrap();
    let a = stream.reserve(4096).unwrap();
    stream.write(&a, 0, &[42; 16]).unwrap();
    let pinned = stream
        .try_resolve(&a)
        .unwrap()
        .expect("published at reserve");
    assert_eq!(pinned.len(), 4096);
    // SAFETY: the pin keeps the bytes at this address; host storage.
    let first = unsafe { *(pinned.addr() as *const u8) };
    assert_eq!(first, 42);
    // While pinned, compaction leaves it in place.
    let before = pinned.addr();
    stream.compact().unwrap();
    assert_eq!(stream.resolve(&a).unwrap().addr(), before);
    drop(pinned);
}

#[test]
fn windows_are_per_client() {
    let device = host();
    let loader = device.stream(StreamId(0)).unwrap();
    let server = loader.clone();
    let outer = loader.window(AllocationMode::Persistent);
    let inner = loader.window(AllocationMode::Persistent);
    drop(inner);
    let weight = loader.reserve(1 << 20).unwrap();
    let activation = server.reserve(1 << 20).unwrap();
    drop(outer);
    let after = loader.reserve(1 << 20).unwrap();
    let report = loader.report().unwrap();
    assert_eq!(report.persistent.usage.number_allocs, 1);
    assert_eq!(report.usage().number_allocs, 3);
    drop((weight, activation, after));
}

#[test]
fn caller_errors_are_typed() {
    let device = host();
    let s0 = device.stream(StreamId(0)).unwrap();
    let s1 = device.stream(StreamId(1)).unwrap();
    assert_eq!(
        s0.reserve(0).unwrap_err(),
        ServiceError::Memory(MemoryError::ZeroSize)
    );
    assert!(matches!(
        s0.reserve(u64::MAX).unwrap_err(),
        ServiceError::Memory(MemoryError::TooLarge { .. })
    ));
    let a = s0.reserve(100).unwrap();
    assert_eq!(
        s1.read(&a, 0, 1).unwrap_err(),
        ServiceError::WrongStream {
            owner: StreamId(0),
            used_on: StreamId(1)
        }
    );
    let target = s1.unbound().unwrap();
    assert!(matches!(
        s1.bind(a.clone(), &target, 0),
        Err(ServiceError::WrongStream { .. })
    ));
    assert!(matches!(
        s0.read(&a, 90, 20).unwrap_err(),
        ServiceError::Memory(MemoryError::OutOfBounds { .. })
    ));
    let unbound = s0.unbound().unwrap();
    assert_eq!(
        s0.read(&unbound, 0, 1).unwrap_err(),
        ServiceError::Memory(MemoryError::Uninitialized)
    );
    assert!(s0.resolve(&unbound).is_err());
    let reserved = s0.reserve(64).unwrap();
    let stale = reserved.clone();
    let assigned = s0.unbound().unwrap();
    s0.bind(reserved, &assigned, 5).unwrap();
    assert!(matches!(
        s0.read(&stale, 0, 1),
        Err(ServiceError::Memory(MemoryError::Stale(_)))
    ));
    assert!(matches!(
        s0.resolve(&stale),
        Err(ServiceError::Memory(MemoryError::Stale(_)))
    ));
    assert!(s0.resolve(&assigned).is_ok());
    assert_eq!(
        s0.reserve_with(1 << 30, PageUpdate::Forbidden).unwrap_err(),
        ServiceError::Memory(MemoryError::PageUpdateForbidden { size: 1 << 30 })
    );
}

/// One stream removed leaves the device's timers and its settled totals
/// working for the others, and its handles answer `StreamStopped`.
#[test]
fn a_removed_stream_leaves_the_device_ticking() {
    let device = host();
    let stopped = device.stream(StreamId(0)).unwrap();
    let serving = device.stream(StreamId(1)).unwrap();
    let kept = serving.reserve(10_000).unwrap();
    device.remove_stream(stopped.stream()).unwrap();
    device.tick().unwrap();
    let settled = device.settled().unwrap();
    assert_eq!(settled.bytes_in_use, 10_000);
    assert_eq!(
        stopped.reserve(10).unwrap_err(),
        ServiceError::StreamStopped(StreamId(0))
    );
    drop(kept);
    assert_eq!(serving.reserve(64).unwrap().size(), 64);
}

#[test]
fn handles_outliving_the_service_answer_stopped() {
    let device = host();
    let stream = device.stream(StreamId(7)).unwrap();
    let a = stream.reserve(10_000).unwrap();
    let reports = device.shutdown();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].as_ref().unwrap().bytes_left, 0);
    assert_eq!(
        stream.reserve(10).unwrap_err(),
        ServiceError::StreamStopped(StreamId(7))
    );
    assert_eq!(
        stream.read(&a, 0, 1).unwrap_err(),
        ServiceError::StreamStopped(StreamId(7))
    );
    assert!(
        stream.resolve(&a).is_err(),
        "no address after the pages went back"
    );
    assert_eq!(stream.stats().state, StreamState::Stopped);
    drop(a); // harmless
    assert_eq!(
        device.stream(StreamId(8)).unwrap_err(),
        ServiceError::SupervisorStopped
    );
}

#[test]
fn a_removed_stream_can_be_created_again() {
    let device = host();
    let old = device.stream(StreamId(3)).unwrap();
    let a = old.reserve(100).unwrap();
    let report = device.remove_stream(StreamId(3)).unwrap();
    assert_eq!(report.bytes_left, 0);
    let new = device.stream(StreamId(3)).unwrap();
    assert!(new.reserve(100).is_ok());
    assert!(matches!(
        new.read(&a, 0, 1),
        Err(ServiceError::WrongStream { .. })
    ));
    assert_eq!(
        old.reserve(1).unwrap_err(),
        ServiceError::StreamStopped(StreamId(3))
    );
}

/// A storage that panics on its third allocation: a driver bug, say.
struct PanickingStorage(HostStorage, u32);

impl DeviceStorage for PanickingStorage {
    fn alignment(&self) -> u64 {
        self.0.alignment()
    }
    fn allocate(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        self.1 += 1;
        assert!(self.1 < 3, "driver exploded");
        self.0.allocate(size)
    }
    fn deallocate(&mut self, id: StorageId) {
        self.0.deallocate(id)
    }
    fn flush(&mut self) {
        self.0.flush()
    }
    fn resource(&mut self, handle: &StorageHandle) -> Result<Resource, StorageError> {
        self.0.resource(handle)
    }
    fn write(&mut self, handle: &StorageHandle, data: &[u8]) -> Result<(), StorageError> {
        self.0.write(handle, data)
    }
    fn read(&mut self, handle: &StorageHandle, out: &mut [u8]) -> Result<(), StorageError> {
        self.0.read(handle, out)
    }
    fn copy(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        self.0.copy(from, to)
    }
    fn bytes_allocated(&self) -> u64 {
        self.0.bytes_allocated()
    }
}

/// A lone client on a manual clock (so the coordinator sends the stream
/// nothing) serves every blocking call in place, and the same calls give
/// the same answers through the actor's thread; an async call always goes
/// to the thread.
#[test]
fn a_lone_client_serves_its_calls_in_place() {
    for serve_in_place in [true, false] {
        let device = Supervisor::host(ServiceConfig {
            clock: streamalloc::clock::ManualClock::shared(),
            calls: Calls {
                serve_in_place,
                ..Calls::default()
            },
            ..ServiceConfig::default()
        });
        let stream = device.stream(StreamId(0)).unwrap();
        let mut kept = Vec::new();
        for size in [256, 4096, 1 << 20] {
            let allocation = stream.reserve(size).unwrap();
            stream.write(&allocation, 0, b"kept").unwrap();
            assert_eq!(stream.read(&allocation, 0, 4).unwrap(), b"kept");
            kept.push(allocation);
        }
        device.tick().unwrap();
        let stats = stream.stats();
        assert_eq!(stats.requests, 9);
        assert_eq!(stats.served_in_place, if serve_in_place { 9 } else { 0 });
        let awaited = pollster::block_on(stream.reserve_async(64)).unwrap();
        assert_eq!(stream.stats().requests, 10);
        assert_eq!(
            stream.stats().served_in_place,
            stats.served_in_place,
            "an async call is served by the thread"
        );
        drop((awaited, kept));
    }
}

/// On the actor's thread and in a turn a client takes in place alike.
#[test]
fn a_panicking_actor_fails_its_stream_without_hanging_clients() {
    for serve_in_place in [true, false] {
        a_panicking_turn_fails_the_stream(serve_in_place);
    }
}

fn a_panicking_turn_fails_the_stream(serve_in_place: bool) {
    let device = Supervisor::new(
        ServiceConfig {
            calls: Calls {
                serve_in_place,
                ..Calls::default()
            },
            ..ServiceConfig::default()
        },
        Box::new(|_| Ok(Box::new(PanickingStorage(HostStorage::new(), 0)))),
    );
    let stream = device.stream(StreamId(1)).unwrap();
    let _small = stream.reserve(100).unwrap();
    let _big = stream.reserve(4 << 20).unwrap();
    let waiting: Vec<_> = (0..4)
        .map(|_| {
            let stream = stream.clone();
            std::thread::spawn(move || stream.reserve(8 << 20))
        })
        .collect();
    for thread in waiting {
        match thread.join().unwrap() {
            Err(ServiceError::StreamFailed { stream, message }) => {
                assert_eq!(stream, StreamId(1));
                assert!(message.contains("driver exploded"), "{message}");
            }
            other => panic!("expected StreamFailed, got {other:?}"),
        }
    }
    assert!(matches!(
        stream.reserve(1),
        Err(ServiceError::StreamFailed { .. })
    ));
    assert!(matches!(stream.stats().state, StreamState::Failed(_)));
    // A failed stream can be replaced.
    assert!(device.stream(StreamId(1)).is_ok());
}

#[test]
fn idle_streams_give_pages_back() {
    // Only the idle tick may return the pages (settle, headroom and the
    // coordinator's compaction would race it, and which wins depends on
    // the machine's load).
    let clock = streamalloc::clock::ManualClock::shared();
    let device = Supervisor::host(ServiceConfig {
        idle_tick: Some(Duration::from_millis(20)),
        settle: None,
        headroom: None,
        compaction_threshold: None,
        clock: clock.clone(),
        ..ServiceConfig::default()
    });
    let stream = device.stream(StreamId(0)).unwrap();
    let burst = stream.reserve_many(&[1 << 20; 16]).unwrap();
    let reserved = stream.report().unwrap().usage().bytes_reserved;
    assert!(reserved >= 16 << 20);
    drop(burst);
    // Watched, then quiet for less than the idle tick: nothing yet.
    device.tick().unwrap();
    clock.advance(Duration::from_millis(19));
    device.tick().unwrap();
    assert_eq!(stream.stats().idle_cleanups, 0);
    assert!(stream.stats().bytes_reserved >= 16 << 20);
    // Quiet for the whole tick: the stream tidies up.
    clock.advance(Duration::from_millis(1));
    device.tick().unwrap();
    assert_eq!(
        stream.stats().bytes_reserved,
        0,
        "idle pages were not returned"
    );
    assert!(stream.stats().idle_cleanups > 0);
}

#[test]
fn copy_guard_and_taint_through_the_service() {
    let device = host();
    let stream = device.stream(StreamId(0)).unwrap();
    let a = stream.reserve(64).unwrap();
    let b = stream.reserve(128).unwrap();
    stream.write(&a, 0, &[3; 64]).unwrap();
    let failure = stream.record_failure("kernel failed", &[]).unwrap();
    stream.taint(&a, 10..20, failure).unwrap();
    stream.copy(&a, &b).unwrap();
    assert_eq!(stream.read(&b, 0, 64).unwrap(), vec![3; 64]);
    assert_eq!(
        stream.failure(&b, 0..128).unwrap(),
        Some(failure),
        "taint travels with a copy"
    );
    stream.written(&b, 0..64).unwrap();
    assert_eq!(stream.failure(&b, 0..128).unwrap(), None);
    let guard = stream.guard(&a).unwrap();
    drop(guard);
    stream.cleanup(Cleanup::Explicit).unwrap();
    assert!(stream.copy(&b, &a).is_err(), "128 bytes do not fit in 64");
}

#[test]
fn async_calls_work_and_cancellation_releases() {
    let device = host();
    let stream = device.stream(StreamId(0)).unwrap();
    let a = pollster::block_on(stream.reserve_async(1000)).unwrap();
    pollster::block_on(stream.write_async(&a, 0, b"async")).unwrap();
    assert_eq!(
        pollster::block_on(stream.read_async(&a, 0, 5)).unwrap(),
        b"async"
    );
    let many = pollster::block_on(stream.reserve_many_async(&[10, 20, 30])).unwrap();
    assert_eq!(many.len(), 3);
    drop(many);
    // Every message has an awaitable form.
    let failure = pollster::block_on(stream.record_failure_async("async kernel", &[])).unwrap();
    pollster::block_on(stream.taint_async(&a, 0..3, failure)).unwrap();
    assert_eq!(
        pollster::block_on(stream.failure_async(&a, 0..10)).unwrap(),
        Some(failure)
    );
    pollster::block_on(stream.written_async(&a, 0..3)).unwrap();
    assert_eq!(
        pollster::block_on(stream.failure_async(&a, 0..10)).unwrap(),
        None
    );
    let target = pollster::block_on(stream.unbound_async()).unwrap();
    let scratch = pollster::block_on(stream.reserve_with_async(64, PageUpdate::AddOnly)).unwrap();
    pollster::block_on(stream.bind_async(scratch, &target, 9)).unwrap();
    let guard = pollster::block_on(stream.guard_async(&target)).unwrap();
    drop(guard);
    pollster::block_on(stream.compact_async()).unwrap();
    assert_eq!(
        pollster::block_on(stream.resolve_async(&a)).unwrap().len(),
        1000
    );
    drop(target);
    // A reserve future polled once (request sent) and then dropped: the
    // answer arrives to nobody and the allocation is released.
    {
        let future = std::pin::pin!(stream.reserve_async(5000));
        let waker = std::task::Waker::noop();
        let _ = future.poll(&mut std::task::Context::from_waker(waker));
    }
    // The report is served after the reserve (one inbox, in order), and
    // processes the release its unclaimed answer queued.
    let allocs = stream.report().unwrap().usage().number_allocs;
    assert_eq!(allocs, 1, "the cancelled reserve leaked");
    drop(a);
}

#[test]
fn a_borrowed_pin_holds_the_address_until_it_drops() {
    // Pages: settling moves a page's survivor into a smaller page.
    let device = Supervisor::host(ServiceConfig {
        memory: MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
        ..ServiceConfig::default()
    });
    let stream = device.stream(StreamId(0)).unwrap();
    // A sparse 8 MiB page: settling moves the survivor into a smaller one.
    let big = stream.reserve(6 << 20).unwrap();
    let a = stream.reserve(1 << 20).unwrap();
    stream.write(&a, 0, &[7; 16]).unwrap();
    drop(big);
    let pinned = stream
        .try_resolve_ref(&a)
        .unwrap()
        .expect("published at reserve");
    let before = pinned.addr();
    assert_eq!(pinned.len(), 1 << 20);
    // SAFETY: the pin keeps the bytes at this address; host storage.
    assert_eq!(unsafe { *(before as *const u8) }, 7);
    let report = stream.relocate(RelocationReason::Settle).unwrap();
    assert_eq!(report.moved, 0, "a pinned allocation stays");
    drop(pinned);
    let report = stream.relocate(RelocationReason::Settle).unwrap();
    assert_eq!(report.moved, 1, "unpinned, it moves");
    let after = stream.resolve(&a).unwrap();
    assert_ne!(after.addr(), before);
    assert_eq!(stream.read(&a, 0, 16).unwrap(), vec![7; 16]);
}

#[test]
fn a_failed_bind_hands_its_reservation_back() {
    let device = host();
    let s0 = device.stream(StreamId(0)).unwrap();
    let s1 = device.stream(StreamId(1)).unwrap();
    let reserved = s0.reserve(64).unwrap();
    s0.write(&reserved, 0, &[3; 64]).unwrap();
    // Bound already: refused by the actor, the reservation comes back.
    let taken = s0.reserve(8).unwrap();
    let failed = s0.try_bind(reserved, &taken, 0).unwrap_err();
    assert!(matches!(
        failed.error,
        ServiceError::Memory(MemoryError::AlreadyBound(_))
    ));
    let reserved = failed.allocation.expect("handed back");
    assert_eq!(s0.read(&reserved, 0, 64).unwrap(), vec![3; 64]);
    // The wrong stream: refused before it is sent.
    let target = s1.unbound().unwrap();
    let failed = s1.try_bind(reserved, &target, 0).unwrap_err();
    assert!(matches!(failed.error, ServiceError::WrongStream { .. }));
    let reserved = failed.allocation.expect("handed back");
    assert_eq!(s0.read(&reserved, 0, 64).unwrap(), vec![3; 64]);
    // A stopped stream: the refusal hands it back too.
    let unbound = s0.unbound().unwrap();
    device.remove_stream(s0.stream()).unwrap();
    let failed = s0.try_bind(reserved, &unbound, 0).unwrap_err();
    assert!(matches!(failed.error, ServiceError::StreamStopped(_)));
    assert!(failed.allocation.is_some());
    // And on the manager alone.
    let mut memory = MemoryManager::new(HostStorage::new(), MemoryConfig::default());
    let a = memory.reserve(16, PageUpdate::Allow).unwrap();
    let bound = memory.reserve(16, PageUpdate::Allow).unwrap();
    let failed = memory.try_bind(a, &bound, 0).unwrap_err();
    assert!(matches!(failed.error, MemoryError::AlreadyBound(_)));
    assert_eq!(memory.bytes_in_use(), 32, "nothing was freed");
    drop(failed);
    memory.process_releases();
    assert_eq!(memory.bytes_in_use(), 16);
}

#[test]
fn the_supervisor_has_awaitable_forms() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let device = host();
    let s0 = pollster::block_on(device.stream_async(StreamId(0))).unwrap();
    let s1 = pollster::block_on(device.stream_async(StreamId(1))).unwrap();
    drop(s0.reserve(1 << 20).unwrap());
    let held = s1.reserve(4096).unwrap();
    let settled = pollster::block_on(device.settled_async()).unwrap();
    assert!(settled.bytes_in_use >= 4096);
    let report = pollster::block_on(device.remove_stream_async(StreamId(0))).unwrap();
    assert_eq!(report.stream, StreamId(0));
    assert!(matches!(s0.reserve(1), Err(ServiceError::StreamStopped(_))));
    // A removal given up on (polled once, dropped) still stops its stream.
    let s2 = device.stream(StreamId(2)).unwrap();
    {
        let mut removal = std::pin::pin!(device.remove_stream_async(StreamId(2)));
        let _ = removal
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()));
    }
    drop(held);
    let reports = pollster::block_on(device.shutdown_async());
    assert_eq!(reports.len(), 1, "stream 1 was still registered");
    assert!(
        reports
            .iter()
            .all(|r| r.as_ref().is_ok_and(|r| r.bytes_left == 0))
    );
    assert!(matches!(s2.reserve(1), Err(ServiceError::StreamStopped(_))));
    assert!(matches!(s1.reserve(1), Err(ServiceError::StreamStopped(_))));
    assert!(matches!(
        pollster::block_on(device.stream_async(StreamId(3))),
        Err(ServiceError::SupervisorStopped)
    ));
}

#[test]
fn one_handle_shared_by_threads_serves_each_of_them() {
    // Concurrent calls on one clone: one finds the kept reply channel, the
    // others make their own; every answer reaches its own caller.
    let device = host();
    let stream = Arc::new(device.stream(StreamId(0)).unwrap());
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let stream = stream.clone();
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    let size = 256 * (1 + u64::from(t)) + i;
                    let a = stream.reserve(size).unwrap();
                    assert_eq!(a.size(), size, "an answer went to another caller");
                    stream.write(&a, 0, &[t; 8]).unwrap();
                    assert_eq!(stream.read(&a, 0, 8).unwrap(), vec![t; 8]);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    stream.report().unwrap();
    assert_eq!(stream.stats().bytes_in_use, 0);
}
