//! The bad-input catalogue: every error a caller can cause, one row each,
//! with the error it gives. A table so a new error path is one new row.

use streamalloc::memory::{
    AllocationMode, DeviceProperties, FailureId, MemoryConfig, MemoryError, MemoryManager,
    PageUpdate, StreamId,
};
use streamalloc::service::{ServiceConfig, ServiceError, Supervisor};
use streamalloc::storage::{HostStorage, StorageError, VirtualStorage};
use streamalloc::trace::{TraceError, read_jsonl, read_rmm_csv, read_torch_snapshot};

/// What a row expects: a predicate over the error and a phrase its message holds.
struct Row {
    name: &'static str,
    error: String,
    matches: bool,
    phrase: &'static str,
}

fn row<E: std::fmt::Display>(
    name: &'static str,
    result: Result<impl std::fmt::Debug, E>,
    matches: impl Fn(&E) -> bool,
    phrase: &'static str,
) -> Row {
    match result {
        Ok(value) => Row {
            name,
            error: format!("no error, got {value:?}"),
            matches: false,
            phrase,
        },
        Err(err) => Row {
            name,
            matches: matches(&err),
            error: err.to_string(),
            phrase,
        },
    }
}

#[test]
fn every_caller_error_is_typed_with_a_clear_message() {
    let mut memory = MemoryManager::new(
        HostStorage::new(),
        MemoryConfig {
            device: DeviceProperties::new(1 << 30, 256),
            ..MemoryConfig::default()
        },
    );
    let mut other = MemoryManager::new(HostStorage::new(), MemoryConfig::default());
    let mut virt = MemoryManager::new(VirtualStorage::new(), MemoryConfig::default());
    let live = memory.reserve(100, PageUpdate::Allow).unwrap();
    let foreign = other.reserve(100, PageUpdate::Allow).unwrap();
    let unbound = memory.unbound();
    let reserved = memory.reserve(64, PageUpdate::Allow).unwrap();
    let stale = reserved.clone();
    let target = memory.unbound();
    memory.bind(reserved, &target, 0).unwrap();
    let bound = memory.reserve(8, PageUpdate::Allow).unwrap();
    let spare = memory.reserve(8, PageUpdate::Allow).unwrap();
    let counted = virt.reserve(100, PageUpdate::Allow).unwrap();
    memory.mode(AllocationMode::Dedicated);
    let dedicated = memory.reserve_in(1 << 20, PageUpdate::Forbidden, AllocationMode::Dedicated);
    memory.mode(AllocationMode::Auto);

    let device = Supervisor::host(ServiceConfig::default());
    let s0 = device.stream(StreamId(0)).unwrap();
    let s1 = device.stream(StreamId(1)).unwrap();
    let on_s0 = s0.reserve(10).unwrap();
    let second = Supervisor::host(ServiceConfig::default());
    let elsewhere = second.stream(StreamId(0)).unwrap();
    let tiny = Supervisor::virtual_device(ServiceConfig {
        budget: Some(1 << 20),
        ..ServiceConfig::default()
    });
    let short = tiny.stream(StreamId(0)).unwrap();
    let stopped = Supervisor::host(ServiceConfig::default());
    let gone = stopped.stream(StreamId(9)).unwrap();
    stopped.shutdown();

    use MemoryError as M;
    use ServiceError as S;
    let rows = vec![
        row(
            "zero size",
            memory.reserve(0, PageUpdate::Allow),
            |e| *e == M::ZeroSize,
            "0 bytes",
        ),
        row(
            "larger than the device allows",
            memory.reserve((1 << 30) + 1, PageUpdate::Allow),
            |e| matches!(e, M::TooLarge { .. }),
            "exceeds the largest page",
        ),
        row(
            "u64::MAX bytes",
            memory.reserve(u64::MAX, PageUpdate::Allow),
            |e| matches!(e, M::TooLarge { .. }),
            "exceeds",
        ),
        row(
            "forbidden page update",
            dedicated,
            |e| matches!(e, M::PageUpdateForbidden { .. }),
            "forbids a new page",
        ),
        row(
            "never-initialised handle",
            memory.read(&unbound, 0, 1),
            |e| *e == M::Uninitialized,
            "never bound",
        ),
        row(
            "stale handle (rebound)",
            memory.read(&stale, 0, 1),
            |e| matches!(e, M::Stale(_)),
            "stale",
        ),
        row(
            "foreign handle",
            memory.read(&foreign, 0, 1),
            |e| matches!(e, M::Foreign(_)),
            "another memory manager",
        ),
        row(
            "bind to a bound handle",
            memory.bind(spare.clone(), &bound, 0),
            |e| matches!(e, M::AlreadyBound(_)),
            "already names",
        ),
        row(
            "bind a stale handle",
            memory.bind(stale.clone(), &memory.unbound(), 0),
            |e| matches!(e, M::Stale(_)),
            "stale",
        ),
        row(
            "read past the end",
            memory.read(&live, 90, 20),
            |e| matches!(e, M::OutOfBounds { .. }),
            "outside the allocation",
        ),
        row(
            "write past the end",
            memory.write(&live, 100, &[1]),
            |e| matches!(e, M::OutOfBounds { .. }),
            "outside",
        ),
        row(
            "range end before start",
            memory.get_resource(&live, Some(50), Some(10)),
            |e| matches!(e, M::OutOfBounds { .. }),
            "outside",
        ),
        row(
            "taint past the end",
            memory.taint(&live, 0..101, FailureId(0)),
            |e| matches!(e, M::OutOfBounds { .. }),
            "outside",
        ),
        row(
            "taint with an unknown failure",
            memory.taint(&live, 0..1, FailureId(77)),
            |e| matches!(e, M::UnknownFailure(_)),
            "never recorded",
        ),
        row(
            "copy into a smaller allocation",
            memory.copy(&live, &bound),
            |e| matches!(e, M::OutOfBounds { .. }),
            "outside",
        ),
        row(
            "read bytes of a virtual storage",
            virt.read(&counted, 0, 1),
            |e| *e == M::Storage(StorageError::NoBacking),
            "holds no bytes",
        ),
        row(
            "service: wrong stream",
            s1.read(&on_s0, 0, 1),
            |e| matches!(e, S::WrongStream { .. }),
            "belongs to stream 0",
        ),
        row(
            "service: cross-stream bind",
            s1.bind(on_s0.clone(), &s1.unbound().unwrap(), 0),
            |e| matches!(e, S::WrongStream { .. }),
            "not stream 1",
        ),
        row(
            "service: another device's stream of the same id",
            elsewhere.read(&on_s0, 0, 1),
            |e| {
                *e == S::WrongStream {
                    owner: StreamId(0),
                    used_on: StreamId(0),
                }
            },
            "of another device",
        ),
        row(
            "service: use after shutdown",
            gone.reserve(1),
            |e| *e == S::StreamStopped(StreamId(9)),
            "stopped",
        ),
        row(
            "service: out of memory",
            short.reserve(2 << 20),
            |e| matches!(e, S::OutOfMemory(_)),
            "out of memory on stream 0",
        ),
        row(
            "service: supervisor stopped",
            stopped.stream(StreamId(1)),
            |e| *e == S::SupervisorStopped,
            "shut down",
        ),
        row(
            "trace: malformed RMM line",
            read_rmm_csv("Thread,Time,Action,Pointer,Size,Stream\nx,y\n".as_bytes()),
            |e| matches!(e, TraceError::Malformed { line: 2, .. }),
            "line 2",
        ),
        row(
            "trace: malformed JSON line",
            read_jsonl("{}\n".as_bytes()),
            |e| matches!(e, TraceError::Malformed { line: 1, .. }),
            "line 1",
        ),
        row(
            "trace: not a pickle",
            read_torch_snapshot(b"\x80\x04garbage"),
            |e| matches!(e, TraceError::Invalid(_)),
            "not a PyTorch snapshot",
        ),
    ];
    let mut failures = Vec::new();
    for row in &rows {
        if !row.matches || !row.error.contains(row.phrase) {
            failures.push(format!(
                "{}: got {:?} (wanted a message with {:?})",
                row.name, row.error, row.phrase
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows wrong:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
    eprintln!("{} bad inputs, each a typed error", rows.len());
}
