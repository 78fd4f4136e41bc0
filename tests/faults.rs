//! Injected faults through `LimitedStorage`: an allocation failure at every
//! point of a sequence, a copy failure at every point of a relocation, and a
//! capacity below the working set. Each gives a typed error, leaves the
//! manager consistent, and loses no written byte.

use streamalloc::memory::{
    Allocation, Cleanup, MemoryConfig, MemoryConfiguration, MemoryError, MemoryManager, PageUpdate,
    RelocationReason,
};
use streamalloc::storage::{FaultPlan, HostStorage, LimitedStorage, StorageError};

mod common;
use common::{KIB, MIB};

type Memory = MemoryManager<LimitedStorage<HostStorage>>;

fn memory(capacity: u64, faults: FaultPlan) -> Memory {
    MemoryManager::new(
        LimitedStorage::new(HostStorage::new(), capacity).with_faults(faults),
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    )
}

/// The sequence: sizes across pools, each written with its own byte.
fn sizes() -> Vec<u64> {
    (0..40u64)
        .map(|i| [100, 3000, 70 * KIB, 700 * KIB, 3 * MIB][(i % 5) as usize] + i)
        .collect()
}

fn verify(memory: &mut Memory, live: &[(Allocation, u64, u8)]) {
    for (a, size, byte) in live {
        assert_eq!(
            memory.read(a, 0, 1).unwrap(),
            vec![*byte],
            "first byte of {a:?}"
        );
        assert_eq!(
            memory.read(a, size - 1, 1).unwrap(),
            vec![*byte],
            "last byte of {a:?}"
        );
    }
    memory.process_releases();
    let usage = memory.memory_report().usage();
    assert_eq!(usage.number_allocs, live.len() as u64);
    assert_eq!(
        usage.bytes_in_use,
        live.iter().map(|(_, s, _)| s).sum::<u64>()
    );
}

/// A compaction that meets its injected copy fault: a typed error, every
/// byte where a reader finds it, and consistent after: a second pass
/// completes, everything still reads, and all goes back. How many moved
/// before the fault.
fn compaction_fails_and_loses_nothing(mut memory: Memory, live: Vec<(Allocation, u64, u8)>) -> u64 {
    let err = memory.relocate(RelocationReason::Compaction).unwrap_err();
    assert!(matches!(
        err.error,
        MemoryError::Storage(StorageError::InjectedFault(_))
    ));
    verify(&mut memory, &live);
    memory.compact().unwrap();
    verify(&mut memory, &live);
    drop(live);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 0);
    err.report.moved
}

#[test]
fn an_allocation_failure_at_every_point_is_typed_and_harmless() {
    // How many page allocations the clean sequence makes.
    let clean_pages = {
        let mut memory = memory(u64::MAX, FaultPlan::none());
        let _live: Vec<_> = sizes()
            .into_iter()
            .map(|s| memory.reserve(s, PageUpdate::Allow).unwrap())
            .collect();
        memory.storage().allocation_attempts()
    };
    assert!(clean_pages > 5);
    let mut injected = 0;
    for nth in 1..=clean_pages {
        let mut memory = memory(u64::MAX, FaultPlan::none().fail_allocation(nth));
        let mut live = Vec::new();
        let mut failed = 0;
        for (i, size) in sizes().into_iter().enumerate() {
            match memory.reserve(size, PageUpdate::Allow) {
                Ok(a) => {
                    let byte = i as u8 + 1;
                    memory.write(&a, 0, &vec![byte; size as usize]).unwrap();
                    live.push((a, size, byte));
                }
                Err(MemoryError::Storage(StorageError::InjectedFault(_))) => failed += 1,
                Err(other) => panic!("fault {nth}: unexpected {other}"),
            }
            verify(&mut memory, &live);
        }
        assert_eq!(failed, 1, "fault {nth} fired once");
        injected += 1;
        drop(live);
        memory.cleanup(Cleanup::Explicit);
        assert_eq!(memory.bytes_allocated(), 0, "fault {nth} leaked");
    }
    assert_eq!(injected, clean_pages);
    eprintln!("injected {injected} allocation faults, one at each page allocation");
}

#[test]
fn a_copy_failure_at_every_point_of_a_relocation_loses_nothing() {
    let build = |faults: FaultPlan| {
        let mut memory = memory(u64::MAX, faults);
        let all: Vec<_> = (0..48u64)
            .map(|i| {
                let size = 300 * KIB + i * 1000;
                let a = memory.reserve(size, PageUpdate::Allow).unwrap();
                memory.write(&a, 0, &vec![i as u8; size as usize]).unwrap();
                (a, size, i as u8)
            })
            .collect();
        let live: Vec<_> = all.into_iter().filter(|(_, _, b)| b % 3 == 0).collect();
        memory.process_releases();
        (memory, live)
    };
    let copies = {
        let (mut memory, _live) = build(FaultPlan::none());
        memory.compact().unwrap().moved
    };
    assert!(copies > 3);
    eprintln!("injected {copies} copy faults, one at each copy of the relocation");
    for nth in 1..=copies {
        let (memory, live) = build(FaultPlan::none().fail_copy(nth));
        assert_eq!(compaction_fails_and_loses_nothing(memory, live), nth - 1);
    }
}

/// An expandable arena's compaction slides allocations of 2-3 MiB down
/// over holes of 384 KiB: up to six copies each in place, so each goes
/// through a free block apart from it, two copies (room for all of it
/// above them), or four (room for half). A copy failure at any one of them
/// (a first copy of a piece, or a second, whose target overlaps the
/// source, or one while the pieces moved go back) leaves every byte where
/// a reader finds it.
#[test]
fn a_copy_failure_at_every_point_of_an_arena_compaction_loses_nothing() {
    let build = |faults: FaultPlan, room: u64| {
        let mut memory = MemoryManager::new(
            LimitedStorage::new(HostStorage::new(), u64::MAX).with_faults(faults),
            MemoryConfig::with_pools(MemoryConfiguration::Expandable),
        );
        let all: Vec<_> = (0..24u64)
            .map(|i| {
                let size = if i % 2 == 0 {
                    384 * KIB
                } else {
                    2 * MIB + i * 40 * KIB
                };
                let a = memory.reserve(size, PageUpdate::Allow).unwrap();
                memory.write(&a, 0, &vec![i as u8; size as usize]).unwrap();
                (a, size, i as u8)
            })
            .collect();
        // Room above them all to stage in, and the holes among them.
        drop(memory.reserve(room, PageUpdate::Allow).unwrap());
        let live: Vec<_> = all.into_iter().filter(|(_, _, b)| b % 2 == 1).collect();
        memory.process_releases();
        (memory, live)
    };
    let mut copies_by_room = Vec::new();
    for room in [6 * MIB, MIB + MIB / 4] {
        let (copies, moved) = {
            let (mut memory, live) = build(FaultPlan::none(), room);
            let before = memory.memory_report().driver.copies;
            let moved = memory.compact().unwrap().moved;
            let copies = memory.memory_report().driver.copies - before;
            verify(&mut memory, &live);
            (copies, moved)
        };
        assert!(moved > 3, "{moved} moved");
        copies_by_room.push((copies, moved));
        for nth in 1..=copies {
            let (memory, live) = build(FaultPlan::none().fail_copy(nth), room);
            compaction_fails_and_loses_nothing(memory, live);
        }
    }
    // Room for all of one: two copies a move at most (23 in place).
    let [(whole, moved), (halves, _)] = copies_by_room[..] else {
        unreachable!()
    };
    assert!(whole <= 2 * moved, "{whole} copies for {moved} moves");
    assert!(halves > whole, "staged in halves: {halves} copies");
}

#[test]
fn a_capacity_below_the_working_set_fails_cleanly() {
    let mut memory = memory(20 * MIB, FaultPlan::none());
    let mut live = Vec::new();
    let mut refused = 0;
    for (i, size) in (0..64u64).map(|i| (i, MIB + i * 4096)) {
        match memory.reserve(size, PageUpdate::Allow) {
            Ok(a) => {
                memory.write(&a, 0, &vec![i as u8; size as usize]).unwrap();
                live.push((a, size, i as u8));
            }
            Err(MemoryError::Storage(StorageError::OutOfMemory {
                requested,
                capacity,
                ..
            })) => {
                assert_eq!(capacity, 20 * MIB);
                assert!(requested >= size);
                refused += 1;
            }
            Err(other) => panic!("unexpected {other}"),
        }
        assert!(memory.bytes_allocated() <= 20 * MIB);
        verify(&mut memory, &live);
    }
    assert!(refused > 0 && !live.is_empty());
    // Freeing half makes room again.
    live.truncate(live.len() / 2);
    memory.cleanup(Cleanup::Explicit);
    assert!(memory.reserve(MIB, PageUpdate::Allow).is_ok());
    verify(&mut memory, &live);
}

/// A storage whose `copy` is not a `memmove` slides in chunks no longer
/// than the distance; a chunk that fails puts back the ones before it.
#[test]
fn a_slide_failing_at_any_chunk_leaves_the_bytes_where_they_were() {
    use streamalloc::storage::{DeviceStorage, HOST_GRANULE, StorageHandle};
    let pattern: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let len = pattern.len() as u64;
    // From 1000 down to 0: ten chunks of 1000 bytes, each overlapping the
    // source of the next.
    let setup = |faults: FaultPlan| {
        let mut storage = LimitedStorage::new(HostStorage::new(), u64::MAX).with_faults(faults);
        let range = storage.reserve_range(HOST_GRANULE).unwrap();
        storage.map(&range).unwrap();
        let at = |offset: u64| StorageHandle {
            id: range.id,
            offset,
            size: len,
        };
        storage.write(&at(1000), &pattern).unwrap();
        (storage, at(1000), at(0))
    };
    let (mut storage, from, to) = setup(FaultPlan::none());
    storage.slide(&from, &to).unwrap();
    assert_eq!(storage.copy_attempts(), 10, "one copy a chunk");
    let mut out = vec![0; pattern.len()];
    storage.read(&to, &mut out).unwrap();
    assert_eq!(out, pattern, "slid intact");
    for chunk in 1..=10 {
        let (mut storage, from, to) = setup(FaultPlan::none().fail_copy(chunk));
        let error = storage.slide(&from, &to).unwrap_err();
        assert!(matches!(error, StorageError::InjectedFault(_)), "{error}");
        storage.read(&from, &mut out).unwrap();
        assert_eq!(out, pattern, "chunk {chunk} failed: bytes put back");
    }
    // Up, or across allocations, is no slide.
    let (mut storage, from, to) = setup(FaultPlan::none());
    assert!(matches!(
        storage.slide(&to, &from),
        Err(StorageError::NotASlide { .. })
    ));
}
