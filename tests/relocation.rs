//! Relocation and compaction keep every byte, give memory back, and leave
//! pinned, guarded, persistent and dedicated allocations where they are.

use streamalloc::memory::{
    Allocation, AllocationMode, Cleanup, MemoryConfig, MemoryConfiguration, MemoryManager,
    PageUpdate, RelocationNeed, RelocationReason,
};
use streamalloc::storage::{DeviceStorage, FaultPlan, HostStorage, LimitedStorage};

mod common;
use common::MIB;

const KIB: u64 = 1024;

fn pattern(seed: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i * 7) % 251) as u8)
        .collect()
}

fn write_pattern<S: DeviceStorage>(memory: &mut MemoryManager<S>, a: &Allocation, seed: u64) {
    let size = memory.get_storage(a).unwrap().size;
    memory.write(a, 0, &pattern(seed, size)).unwrap();
}

fn assert_pattern<S: DeviceStorage>(memory: &mut MemoryManager<S>, a: &Allocation, seed: u64) {
    let size = memory.get_storage(a).unwrap().size;
    assert_eq!(
        memory.read(a, 0, size).unwrap(),
        pattern(seed, size),
        "bytes of {a:?}"
    );
}

/// A fragmenting sequence: fill many arena pages, then free most of each.
fn fragmented(memory: &mut MemoryManager<impl DeviceStorage>) -> Vec<(Allocation, u64)> {
    let all: Vec<_> = (0..64u64)
        .map(|i| {
            let a = memory
                .reserve(300 * KIB + i * 512, PageUpdate::Allow)
                .unwrap();
            write_pattern(memory, &a, i);
            (a, i)
        })
        .collect();
    let kept = all.into_iter().filter(|(_, i)| i % 4 == 0).collect();
    memory.process_releases();
    kept
}

#[test]
fn compaction_keeps_bytes_and_gives_pages_back() {
    let mut memory = MemoryManager::new(
        HostStorage::new(),
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    );
    let kept = fragmented(&mut memory);
    let ids: Vec<_> = kept.iter().map(|(a, _)| a.id()).collect();
    let before = memory.memory_report().usage();
    assert_eq!(memory.relocation_need(), RelocationNeed::Compaction);
    let report = memory.compact().unwrap();
    let after = memory.memory_report().usage();
    assert!(report.moved > 0 && report.pages_released > 0, "{report:?}");
    assert!(
        after.bytes_reserved < before.bytes_reserved / 2,
        "{before} -> {after}"
    );
    assert_eq!(after.bytes_in_use, before.bytes_in_use);
    assert_eq!(memory.bytes_allocated(), after.bytes_reserved);
    for (a, seed) in &kept {
        assert_pattern(&mut memory, a, *seed);
    }
    assert_eq!(
        kept.iter().map(|(a, _)| a.id()).collect::<Vec<_>>(),
        ids,
        "ids are kept"
    );
    // A second compaction finds nothing more to do.
    let again = memory.compact().unwrap();
    assert_eq!(again.pages_released, 0);
    assert_eq!(memory.relocation_need(), RelocationNeed::None);
}

#[test]
fn outdated_pages_are_emptied_into_current_ones() {
    let mut memory = MemoryManager::new(
        HostStorage::new(),
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    );
    let small: Vec<_> = (0..6u64)
        .map(|i| {
            let a = memory.reserve(700 * KIB, PageUpdate::Allow).unwrap();
            write_pattern(&mut memory, &a, i);
            (a, i)
        })
        .collect();
    // A larger allocation grows the arena's pages: the old ones are outdated.
    let big = memory.reserve(3 * MIB, PageUpdate::Allow).unwrap();
    write_pattern(&mut memory, &big, 99);
    assert!(memory.has_outdated());
    assert_eq!(memory.relocation_need(), RelocationNeed::Outdated);
    let reserved = memory.memory_report().usage().bytes_reserved;
    let report = memory.relocate(RelocationReason::Outdated).unwrap();
    assert_eq!(report.moved, 6);
    assert!(!memory.has_outdated());
    assert!(memory.memory_report().usage().bytes_reserved < reserved);
    for (a, seed) in &small {
        assert_pattern(&mut memory, a, *seed);
    }
    assert_pattern(&mut memory, &big, 99);
}

#[test]
fn pinned_and_guarded_allocations_stay() {
    let mut memory = MemoryManager::new(
        HostStorage::new(),
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    );
    let kept = fragmented(&mut memory);
    let pinned = memory.pin(&kept[0].0).unwrap();
    let guard = memory.guard(&kept[1].0).unwrap();
    let places: Vec<_> = kept
        .iter()
        .map(|(a, _)| memory.get_storage(a).unwrap())
        .collect();
    let report = memory.compact().unwrap();
    assert!(report.moved > 0);
    assert_eq!(
        memory.get_storage(&kept[0].0).unwrap(),
        places[0],
        "a pinned allocation moved"
    );
    assert_eq!(
        memory.get_storage(&kept[1].0).unwrap(),
        places[1],
        "a guarded page's allocation moved"
    );
    assert_eq!(
        pinned.addr(),
        memory.get_resource(&kept[0].0, None, None).unwrap().addr
    );
    drop((pinned, guard));
    for (a, seed) in &kept {
        assert_pattern(&mut memory, a, *seed);
    }
}

#[test]
fn a_pin_outliving_its_handles_keeps_the_bytes_until_it_drops() {
    let mut memory = MemoryManager::new(
        HostStorage::new(),
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    );
    let a = memory.reserve(1000, PageUpdate::Allow).unwrap();
    memory.write(&a, 0, &[7; 1000]).unwrap();
    let pinned = memory.pin(&a).unwrap();
    assert!(a.can_mut(), "pins do not count as handles");
    drop(a);
    let other = memory.reserve(1000, PageUpdate::Allow).unwrap();
    let other_addr = memory.get_resource(&other, None, None).unwrap().addr;
    assert_ne!(
        other_addr,
        pinned.addr(),
        "pinned bytes were handed out again"
    );
    assert_eq!(memory.memory_report().usage().number_allocs, 2);
    drop(pinned);
    memory.process_releases();
    assert_eq!(memory.memory_report().usage().number_allocs, 1);
}

#[test]
fn persistent_and_dedicated_allocations_never_move() {
    let mut memory = MemoryManager::new(
        HostStorage::new(),
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    );
    memory.mode(AllocationMode::Persistent);
    let weight = memory.reserve(300 * KIB, PageUpdate::Allow).unwrap();
    memory.mode(AllocationMode::Auto);
    memory.mode(AllocationMode::Dedicated);
    let buffer = memory.reserve(300 * KIB, PageUpdate::Allow).unwrap();
    memory.mode(AllocationMode::Auto);
    let places = [&weight, &buffer].map(|a| memory.get_storage(a).unwrap());
    let _kept = fragmented(&mut memory);
    memory.compact().unwrap();
    memory.relocate(RelocationReason::Short).unwrap();
    assert_eq!(
        [&weight, &buffer].map(|a| memory.get_storage(a).unwrap()),
        places
    );
}

#[test]
fn a_copy_failure_mid_relocation_loses_nothing() {
    let storage = LimitedStorage::new(HostStorage::new(), u64::MAX)
        .with_faults(FaultPlan::none().fail_copy(3));
    let mut memory = MemoryManager::new(
        storage,
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    );
    let kept = fragmented(&mut memory);
    let in_use = memory.memory_report().usage().bytes_in_use;
    let err = memory.compact().unwrap_err();
    assert_eq!(
        err.report.moved, 2,
        "two copies went through before the fault"
    );
    assert!(err.to_string().contains("injected fault"), "{err}");
    for (a, seed) in &kept {
        assert_pattern(&mut memory, a, *seed);
    }
    assert_eq!(memory.memory_report().usage().bytes_in_use, in_use);
    // The manager is consistent: the next compaction finishes the job.
    let report = memory.compact().unwrap();
    assert!(report.pages_released > 0);
    for (a, seed) in &kept {
        assert_pattern(&mut memory, a, *seed);
    }
    drop(kept);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 0);
}

#[test]
fn stale_ids_stay_stale_after_relocation() {
    let mut memory = MemoryManager::new(
        HostStorage::new(),
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    );
    let kept = fragmented(&mut memory);
    let reserved = memory.reserve(300 * KIB, PageUpdate::Allow).unwrap();
    let stale = reserved.clone();
    let assigned = memory.unbound();
    memory.bind(reserved, &assigned, 3).unwrap();
    memory.compact().unwrap();
    assert!(memory.get_storage(&stale).is_err());
    assert_eq!(memory.get_cursor(&assigned), Ok(3));
    drop(kept);
}

#[test]
fn lazy_backing_materialises_on_first_dereference() {
    let mut memory = MemoryManager::new(
        HostStorage::new(),
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    );
    memory.set_dry_run(true);
    let planned: Vec<_> = (0..4)
        .map(|_| memory.reserve(MIB, PageUpdate::Allow).unwrap())
        .collect();
    assert_eq!(
        memory.bytes_allocated(),
        0,
        "a dry run touches no device memory"
    );
    assert_eq!(memory.memory_report().usage().bytes_reserved, 4 * MIB);
    memory.set_dry_run(false);
    memory.write(&planned[0], 0, b"first touch").unwrap();
    assert_eq!(
        memory.bytes_allocated(),
        2 * MIB,
        "only the touched page got backing"
    );
    assert_eq!(memory.read(&planned[0], 0, 11).unwrap(), b"first touch");
    // Relocating a lazy page copies nothing and keeps it lazy-compatible.
    drop(planned);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 0);
}

#[test]
fn taint_ranges_follow_writes() {
    let mut memory = MemoryManager::new(
        HostStorage::new(),
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    );
    let a = memory.reserve(1000, PageUpdate::Allow).unwrap();
    let copy = memory.record_failure("copy failed", &[]);
    let kernel = memory.record_failure("kernel read tainted input", &[copy]);
    memory.taint(&a, 0..500, copy).unwrap();
    memory.taint(&a, 400..800, kernel).unwrap();
    assert_eq!(memory.failure(&a, 0..10).unwrap(), Some(copy));
    assert_eq!(memory.failure(&a, 450..460).unwrap(), Some(kernel));
    assert_eq!(memory.failure(&a, 800..1000).unwrap(), None);
    memory.write(&a, 0, &[1; 450]).unwrap();
    assert_eq!(memory.failure(&a, 0..450).unwrap(), None);
    assert_eq!(memory.failure(&a, 0..451).unwrap(), Some(kernel));
    memory.written(&a, 450..800).unwrap();
    assert_eq!(memory.failure(&a, 0..1000).unwrap(), None);
    assert_eq!(memory.failures().roots(kernel), vec![copy]);
    assert!(memory.taint(&a, 900..1001, copy).is_err());
    // Taint travels with a relocated allocation.
    memory.taint(&a, 10..20, copy).unwrap();
    let _kept = fragmented(&mut memory);
    memory.compact().unwrap();
    assert_eq!(memory.failure(&a, 0..1000).unwrap(), Some(copy));
}

#[test]
fn settling_moves_a_sparse_page_into_a_smaller_one_and_keeps_the_bytes() {
    let mut memory = MemoryManager::new(
        HostStorage::new(),
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    );
    // A 6 MiB reservation grows the arena's pages to 8 MiB; a 1 MiB one
    // shares that page, and stays when the big one goes.
    let big = memory.reserve(6 * MIB, PageUpdate::Allow).unwrap();
    let small = memory.reserve(MIB, PageUpdate::Allow).unwrap();
    write_pattern(&mut memory, &small, 7);
    let id = small.id();
    drop(big);
    memory.cleanup(Cleanup::Explicit);
    let before = memory.memory_report().usage().bytes_reserved;
    // Compaction alone has nowhere to move it: one page.
    assert_eq!(
        memory.relocate(RelocationReason::Compaction).unwrap().moved,
        0
    );

    let report = memory.relocate(RelocationReason::Settle).unwrap();
    memory.flush();
    let after = memory.memory_report().usage().bytes_reserved;
    assert_eq!(report.moved, 1, "{report:?}");
    assert!(
        before - after >= 7 * MIB,
        "{before} -> {after} bytes reserved"
    );
    assert_eq!(after, memory.bytes_allocated());
    assert_eq!(small.id(), id, "a move keeps the handle's id");
    assert_pattern(&mut memory, &small, 7);
}

#[test]
fn settling_leaves_a_page_with_a_pinned_allocation() {
    let mut memory = MemoryManager::new(
        HostStorage::new(),
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    );
    let big = memory.reserve(6 * MIB, PageUpdate::Allow).unwrap();
    let small = memory.reserve(MIB, PageUpdate::Allow).unwrap();
    drop(big);
    memory.cleanup(Cleanup::Explicit);
    let pinned = memory.pin(&small).unwrap();
    let before = memory.memory_report().usage().bytes_reserved;
    let report = memory.relocate(RelocationReason::Settle).unwrap();
    memory.flush();
    assert_eq!(report.moved, 0);
    assert_eq!(memory.memory_report().usage().bytes_reserved, before);
    assert_eq!(
        memory.get_resource(&small, None, None).unwrap().addr,
        pinned.addr()
    );
}
