//! Model-based property tests: random operation sequences against the real
//! manager (and the service) beside a simple reference model. After every
//! step: no two live allocations overlap in a page; each reads back what was
//! last written to it; in use <= reserved; after a flush, reserved equals
//! what the storage holds; the report agrees with the model.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use std::collections::HashMap;
use streamalloc::memory::{
    Allocation, AllocationMode, Cleanup, DeviceProperties, MemoryConfig, MemoryConfiguration,
    MemoryManager, PageGuard, PageUpdate, Pinned, PoolConfig, PoolKind, RelocationReason,
};
use streamalloc::storage::{DeviceStorage, HostStorage};

/// One step of a sequence.
#[derive(Debug, Clone)]
enum Op {
    Reserve { size: u64, mode: u8, update: u8 },
    Write { pick: usize, byte: u8 },
    Release { pick: usize },
    Bind { pick: usize, cursor: u64 },
    Cleanup { explicit: bool },
    Relocate { reason: RelocationReason },
    Guard { pick: usize },
    DropGuard,
    Pin { pick: usize },
    Unpin,
    Taint { pick: usize, start: u64, len: u64 },
    DryRun { on: bool },
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        4 => 1u64..512,
        4 => 512u64..16_384,
        2 => 16_384u64..200_000,
        1 => 200_000u64..1_500_000,
    ];
    prop_oneof![
        8 => (size, 0u8..6, 0u8..6).prop_map(|(size, mode, update)| Op::Reserve { size, mode, update }),
        4 => (any::<usize>(), any::<u8>()).prop_map(|(pick, byte)| Op::Write { pick, byte }),
        5 => any::<usize>().prop_map(|pick| Op::Release { pick }),
        1 => (any::<usize>(), 0u64..100).prop_map(|(pick, cursor)| Op::Bind { pick, cursor }),
        1 => any::<bool>().prop_map(|explicit| Op::Cleanup { explicit }),
        2 => prop_oneof![
            Just(RelocationReason::Outdated),
            Just(RelocationReason::Compaction),
            // Evacuates, slides and re-homes what keeps a handle held.
            Just(RelocationReason::Settle),
        ]
        .prop_map(|reason| Op::Relocate { reason }),
        1 => any::<usize>().prop_map(|pick| Op::Guard { pick }),
        1 => Just(Op::DropGuard),
        1 => any::<usize>().prop_map(|pick| Op::Pin { pick }),
        1 => Just(Op::Unpin),
        1 => (any::<usize>(), 0u64..1000, 0u64..100).prop_map(|(pick, start, len)| Op::Taint { pick, start, len }),
        1 => any::<bool>().prop_map(|on| Op::DryRun { on }),
    ]
}

/// Small pages so sequences fill, grow, outdate and empty them.
fn config(preset: u8) -> MemoryConfig {
    let pools = match preset {
        0 => MemoryConfiguration::Custom(vec![
            PoolConfig {
                kind: PoolKind::Sliced {
                    page_size: 64 * 1024,
                },
                max_alloc_size: 4096,
                dealloc_period: Some(20),
            },
            PoolConfig {
                kind: PoolKind::Adaptive {
                    min_page_size: 256 * 1024,
                },
                max_alloc_size: 4 << 20,
                dealloc_period: Some(20),
            },
        ]),
        1 => MemoryConfiguration::ExclusivePages,
        2 => MemoryConfiguration::Adaptive,
        // The default where the storage maps granules (host memory does):
        // growth, evacuation, the trim and the idle sweeps on real bytes.
        _ => MemoryConfiguration::Expandable,
    };
    MemoryConfig {
        device: DeviceProperties::new(4 << 20, [32, 256, 100][preset as usize % 3]),
        ..MemoryConfig::with_pools(pools)
    }
}

/// What the model knows of a live allocation.
struct Entry {
    handle: Allocation,
    size: u64,
    /// The byte every position holds (the last whole write), if written.
    fill: Option<u8>,
    /// Whether it was reserved under a dry run and never written (no bytes to check).
    lazy: bool,
}

fn check<S: DeviceStorage>(
    memory: &mut MemoryManager<S>,
    live: &[Entry],
    lazy_pages: bool,
) -> Result<(), TestCaseError> {
    // Drops are processed at the manager's next operation; a report is not one.
    memory.process_releases();
    let usage = memory.memory_report().usage();
    prop_assert_eq!(usage.number_allocs, live.len() as u64, "live allocations");
    prop_assert_eq!(
        usage.bytes_in_use,
        live.iter().map(|e| e.size).sum::<u64>(),
        "bytes in use"
    );
    prop_assert!(usage.bytes_in_use <= usage.bytes_reserved);
    // No overlap: ranges per page, sorted, disjoint.
    let mut by_page: HashMap<_, Vec<(u64, u64)>> = HashMap::new();
    for entry in live {
        let range = memory
            .get_storage(&entry.handle)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        by_page
            .entry(range.id)
            .or_default()
            .push((range.offset, range.end()));
    }
    for ranges in by_page.values_mut() {
        ranges.sort();
        for pair in ranges.windows(2) {
            prop_assert!(pair[0].1 <= pair[1].0, "overlap {:?}", pair);
        }
    }
    for entry in live {
        if let Some(fill) = entry.fill {
            let ends = [0, entry.size / 2, entry.size - 1];
            for at in ends {
                let byte = memory
                    .read(&entry.handle, at, 1)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(byte[0], fill, "byte {} of {:?}", at, entry.handle);
            }
        }
    }
    memory.flush();
    let usage = memory.memory_report().usage();
    // Pages carved under a dry run and never touched count as reserved but
    // hold no storage.
    if !lazy_pages {
        prop_assert_eq!(
            usage.bytes_reserved,
            memory.bytes_allocated(),
            "reserved vs storage after flush"
        );
    } else {
        prop_assert!(memory.bytes_allocated() <= usage.bytes_reserved);
    }
    Ok(())
}

fn run(preset: u8, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut memory = MemoryManager::new(HostStorage::new(), config(preset));
    let mut live: Vec<Entry> = Vec::new();
    let mut guards: Vec<PageGuard> = Vec::new();
    let mut pins: Vec<Pinned> = Vec::new();
    let mut dry = false;
    let mut ever_dry = false;
    for op in ops {
        match op {
            Op::Reserve { size, mode, update } => {
                let mode = [
                    AllocationMode::Auto,
                    AllocationMode::Persistent,
                    AllocationMode::Dedicated,
                ][(mode % 3) as usize];
                let update = [
                    PageUpdate::Allow,
                    PageUpdate::AddOnly,
                    PageUpdate::Forbidden,
                ][(update % 3) as usize];
                match memory.reserve_in(size, update, mode) {
                    Ok(handle) => {
                        prop_assert_eq!(handle.size(), size);
                        live.push(Entry {
                            handle,
                            size,
                            fill: None,
                            lazy: dry,
                        });
                    }
                    Err(streamalloc::memory::MemoryError::PageUpdateForbidden { .. }) => {
                        prop_assert_eq!(update, PageUpdate::Forbidden)
                    }
                    Err(err) => return Err(TestCaseError::fail(format!("reserve {size}: {err}"))),
                }
            }
            Op::Write { pick, byte } if !live.is_empty() => {
                let index = pick % live.len();
                let entry = &mut live[index];
                memory
                    .write(&entry.handle, 0, &vec![byte; entry.size as usize])
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                entry.fill = Some(byte);
                entry.lazy = false;
            }
            Op::Release { pick } if !live.is_empty() => {
                live.swap_remove(pick % live.len());
            }
            Op::Bind { pick, cursor } if !live.is_empty() => {
                let index = pick % live.len();
                let assigned = memory.unbound();
                let reserved = live[index].handle.clone();
                memory
                    .bind(reserved, &assigned, cursor)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(
                    memory.get_storage(&live[index].handle).is_err(),
                    "the old handle is stale"
                );
                live[index].handle = assigned;
                prop_assert_eq!(memory.get_cursor(&live[index].handle).unwrap(), cursor);
            }
            Op::Cleanup { explicit } => memory.cleanup(if explicit {
                Cleanup::Explicit
            } else {
                Cleanup::Periodic
            }),
            Op::Relocate { reason } => {
                memory
                    .relocate(reason)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::Guard { pick } if !live.is_empty() => {
                guards.push(memory.guard(&live[pick % live.len()].handle).unwrap());
            }
            Op::DropGuard => {
                guards.pop();
            }
            Op::Pin { pick } if !live.is_empty() => {
                let entry = &live[pick % live.len()];
                let pinned = memory.pin(&entry.handle).unwrap();
                prop_assert_eq!(pinned.len(), entry.size);
                pins.push(pinned);
            }
            Op::Unpin => {
                pins.pop();
            }
            Op::Taint { pick, start, len } if !live.is_empty() => {
                let entry = &live[pick % live.len()];
                let start = start.min(entry.size);
                let end = (start + len).min(entry.size);
                let failure = memory.record_failure("model", &[]);
                memory.taint(&entry.handle, start..end, failure).unwrap();
                let claimed = memory.failure(&entry.handle, start..end).unwrap();
                prop_assert_eq!(claimed, (start < end).then_some(failure));
            }
            Op::DryRun { on } => {
                dry = on;
                ever_dry |= on;
                memory.set_dry_run(on);
            }
            _ => {}
        }
        // A pin can keep a released allocation alive past its handle; the
        // model's counts hold only while no pin is out.
        if pins.is_empty() {
            check(&mut memory, &live, ever_dry)?;
        }
    }
    drop(pins);
    drop(guards);
    drop(live);
    memory.cleanup(Cleanup::Explicit);
    prop_assert_eq!(memory.bytes_allocated(), 0, "leak at the end");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct("tests/proptest-regressions/model_based.txt"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_manager_agrees_with_the_model(preset in 0u8..4, ops in prop::collection::vec(op(), 1..120)) {
        run(preset, ops)?;
    }
}

mod service {
    use super::*;
    use streamalloc::memory::StreamId;
    use streamalloc::service::{ServiceConfig, Supervisor};

    #[derive(Debug, Clone)]
    enum ServiceOp {
        Reserve(u64),
        Batch(Vec<u64>),
        Write(usize, u8),
        Release(usize),
        Resolve(usize),
        Compact,
        Cleanup,
    }

    fn service_op() -> impl Strategy<Value = ServiceOp> {
        prop_oneof![
            6 => (1u64..300_000).prop_map(ServiceOp::Reserve),
            1 => prop::collection::vec(1u64..50_000, 1..8).prop_map(ServiceOp::Batch),
            4 => (any::<usize>(), any::<u8>()).prop_map(|(p, b)| ServiceOp::Write(p, b)),
            4 => any::<usize>().prop_map(ServiceOp::Release),
            1 => any::<usize>().prop_map(ServiceOp::Resolve),
            1 => Just(ServiceOp::Compact),
            1 => Just(ServiceOp::Cleanup),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 64,
            failure_persistence: Some(Box::new(FileFailurePersistence::Direct("tests/proptest-regressions/model_based_service.txt"))),
            ..ProptestConfig::default()
        })]

        #[test]
        fn the_service_agrees_with_the_model(ops in prop::collection::vec(service_op(), 1..80)) {
            let device = Supervisor::host(ServiceConfig { idle_tick: None, ..ServiceConfig::default() });
            let stream = device.stream(StreamId(0)).unwrap();
            let mut live: Vec<(Allocation, u64, Option<u8>)> = Vec::new();
            for op in ops {
                match op {
                    ServiceOp::Reserve(size) => live.push((stream.reserve(size).unwrap(), size, None)),
                    ServiceOp::Batch(sizes) => {
                        for (a, size) in stream.reserve_many(&sizes).unwrap().into_iter().zip(sizes) {
                            live.push((a, size, None));
                        }
                    }
                    ServiceOp::Write(pick, byte) if !live.is_empty() => {
                        let index = pick % live.len();
                        let entry = &mut live[index];
                        stream.write(&entry.0, 0, &vec![byte; entry.1 as usize]).unwrap();
                        entry.2 = Some(byte);
                    }
                    ServiceOp::Release(pick) if !live.is_empty() => {
                        live.swap_remove(pick % live.len());
                    }
                    ServiceOp::Resolve(pick) if !live.is_empty() => {
                        let entry = &live[pick % live.len()];
                        let pinned = stream.resolve(&entry.0).unwrap();
                        prop_assert_eq!(pinned.len(), entry.1);
                        if let Some(fill) = entry.2 {
                            // SAFETY: pinned host memory of `len` bytes.
                            let last = unsafe { *((pinned.addr() + entry.1 - 1) as *const u8) };
                            prop_assert_eq!(last, fill);
                        }
                    }
                    ServiceOp::Compact => { stream.compact().unwrap(); }
                    ServiceOp::Cleanup => stream.cleanup(Cleanup::Explicit).unwrap(),
                    _ => {}
                }
                let report = stream.report().unwrap();
                prop_assert_eq!(report.usage().number_allocs, live.len() as u64);
                prop_assert_eq!(report.usage().bytes_in_use, live.iter().map(|e| e.1).sum::<u64>());
                for (a, size, fill) in &live {
                    if let Some(fill) = fill {
                        prop_assert_eq!(stream.read(a, size - 1, 1).unwrap()[0], *fill);
                    }
                }
            }
            drop(live);
            let reports = device.shutdown();
            prop_assert_eq!(reports[0].as_ref().unwrap().bytes_left, 0);
        }
    }
}
