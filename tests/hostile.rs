//! Hostile inputs and odd configurations (issue 45): each once made the
//! process exhaust memory, abort, or run without bound; each now answers a
//! typed error, quickly.

use std::collections::BTreeMap;
use streamalloc::clock::ManualClock;
use streamalloc::memory::{DeviceProperties, MemoryConfig, MemoryManager, PageUpdate};
use streamalloc::replay::{MAX_REPLAY_DEVICES, MAX_REPLAY_STREAMS, Replayer};
use streamalloc::service::{ServiceConfig, ServiceError, Supervisor};
use streamalloc::storage::HostStorage;
use streamalloc::trace::{TraceAction, TraceEvent, read_torch_trace};

/// A snapshot with one segment on `device` (and no traces).
fn snapshot_on_device(device: i64) -> Vec<u8> {
    use serde_pickle::{HashableValue as K, Value as V};
    let mut block = BTreeMap::new();
    block.insert(K::String("address".into()), V::I64(0x1000));
    block.insert(K::String("size".into()), V::I64(512));
    block.insert(
        K::String("state".into()),
        V::String("active_allocated".into()),
    );
    let mut segment = BTreeMap::new();
    segment.insert(K::String("device".into()), V::I64(device));
    segment.insert(K::String("total_size".into()), V::I64(2 << 20));
    segment.insert(K::String("stream".into()), V::I64(0));
    segment.insert(K::String("blocks".into()), V::List(vec![V::Dict(block)]));
    let mut root = BTreeMap::new();
    root.insert(
        K::String("segments".into()),
        V::List(vec![V::Dict(segment)]),
    );
    serde_pickle::value_to_vec(&V::Dict(root), serde_pickle::SerOptions::new()).unwrap()
}

/// Item 1: a 300-byte pickle whose segment names device 99,999,999 made a
/// device for every id below it (12.5 GB in a minute).
#[test]
fn a_snapshot_naming_a_huge_device_id_reads_as_that_one_device() {
    let trace = read_torch_trace(&snapshot_on_device(99_999_999)).unwrap();
    let devices: Vec<u32> = trace.meta.devices.iter().map(|d| d.device).collect();
    assert_eq!(devices, vec![99_999_999]);
}

/// Item 2: a reservation of 2^63 bytes on host memory, with the device's
/// largest page unbounded, aborted the process allocating the granule
/// bitmap of its range before the `mmap`.
#[cfg(unix)]
#[test]
fn a_huge_reservation_on_host_memory_is_refused_not_aborted() {
    let mut memory = MemoryManager::new(
        HostStorage::new(),
        MemoryConfig {
            device: DeviceProperties::new(u64::MAX, 256),
            ..MemoryConfig::default()
        },
    );
    for size in [u64::MAX / 2, 1 << 62, 1 << 50] {
        let refused = memory.reserve(size, PageUpdate::Allow);
        assert!(refused.is_err(), "{size} bytes reserved on host memory");
    }
    // The manager still serves.
    assert!(memory.reserve(4096, PageUpdate::Allow).is_ok());
}

fn replayer() -> Replayer<'static> {
    Replayer::new(|_| {
        Supervisor::virtual_device(ServiceConfig {
            clock: ManualClock::shared(),
            ..ServiceConfig::default()
        })
    })
}

/// Item 4: one device per line ran one supervisor per line (3,000 lines,
/// 430 MB): devices, and streams across devices, are bounded per replay.
#[test]
fn a_trace_of_a_device_per_line_is_refused_past_the_device_limit() {
    let mut replayer = replayer();
    let mut refused = None;
    for id in 0..3_000u32 {
        let mut event = TraceEvent::new(u64::from(id) * 1000, 0, TraceAction::Alloc, 1, 1024);
        event.device = id;
        if let Err(err) = replayer.event(&event) {
            refused = Some((id, err));
            break;
        }
    }
    let (at, err) = refused.expect("refused");
    assert_eq!(at as usize, MAX_REPLAY_DEVICES);
    assert!(matches!(err, ServiceError::TooManyDevices { .. }), "{err}");
    assert!(err.to_string().contains("devices"), "{err}");
}

#[test]
fn streams_across_devices_are_bounded_as_a_whole() {
    let mut replayer = replayer();
    let per_device = 200u64; // under each device's own limit (256)
    let mut refused = None;
    'outer: for device in 0..MAX_REPLAY_DEVICES as u32 {
        for stream in 0..per_device {
            let id = u64::from(device) * per_device + stream;
            let mut event = TraceEvent::new(id * 1000, stream, TraceAction::Alloc, id, 256);
            event.device = device;
            if let Err(err) = replayer.event(&event) {
                refused = Some((id, err));
                break 'outer;
            }
        }
    }
    let (at, err) = refused.expect("refused");
    assert_eq!(at as usize, MAX_REPLAY_STREAMS);
    assert!(
        matches!(err, ServiceError::TooManyStreams { limit, .. } if limit == MAX_REPLAY_STREAMS),
        "{err}"
    );
}

/// Item 3: with an alignment that does not divide the granule, the default
/// preset refused every reservation (`InvalidSize`; `Unmapped` for 3 MiB):
/// its granule was the granule rounded up to the alignment, which the
/// storage cannot map. Every alignment `DeviceProperties` accepts now
/// works: allocations land on it, hold their bytes, and go back.
#[cfg(unix)]
#[test]
fn every_alignment_works_with_the_default_preset_on_every_storage() {
    use streamalloc::memory::Cleanup;
    use streamalloc::storage::{DeviceStorage, VirtualStorage};
    const MIB: u64 = 1 << 20;
    fn exercise<S: DeviceStorage>(storage: S, alignment: u64, bytes: bool) {
        let mut memory = MemoryManager::new(
            storage,
            MemoryConfig {
                device: DeviceProperties::new(1 << 30, alignment),
                ..MemoryConfig::default()
            },
        );
        let mut held = Vec::new();
        for (i, size) in [1, 100, 4096, 3 * MIB + 5, 64, 9 * MIB, 700_000]
            .into_iter()
            .cycle()
            .take(40)
            .enumerate()
        {
            let allocation = memory
                .reserve(size, PageUpdate::Allow)
                .unwrap_or_else(|err| panic!("alignment {alignment}, {size} bytes: {err}"));
            let at = memory.get_storage(&allocation).unwrap();
            assert_eq!(at.offset % alignment, 0, "alignment {alignment}");
            if bytes {
                memory.write(&allocation, 0, &[i as u8]).unwrap();
            }
            held.push((i as u8, allocation));
            if i % 3 == 2 {
                held.remove(i % held.len());
            }
        }
        if bytes {
            for (byte, allocation) in &held {
                let out = memory.read(allocation, 0, 1).unwrap();
                assert_eq!(out, [*byte], "alignment {alignment}");
            }
        }
        held.clear();
        memory.cleanup(Cleanup::Explicit);
        assert_eq!(memory.bytes_reserved(), 0, "alignment {alignment}");
    }
    for alignment in [3, 7, 255, 4097, 2 * MIB + 1, 3 * MIB, 1, 256] {
        exercise(HostStorage::new(), alignment, true);
        exercise(VirtualStorage::new(), alignment, false);
        let supervisor = Supervisor::virtual_device(ServiceConfig {
            memory: MemoryConfig {
                device: DeviceProperties::new(1 << 30, alignment),
                ..MemoryConfig::default()
            },
            ..ServiceConfig::default()
        });
        let stream = supervisor.stream(streamalloc::memory::StreamId(0)).unwrap();
        let kept: Vec<_> = (1..20u64)
            .map(|i| stream.reserve(i * 77_777).unwrap())
            .collect();
        drop(kept);
        supervisor.shutdown();
    }
}
