//! A named counterpart of each test of the seed (CubeCL's
//! `memory_manage.rs`), adapted to our page sizes: the metadata pool's
//! pages are 8 MiB and serve up to 64 KiB; the adaptive arena starts at
//! 2 MiB pages and grows in 1 MiB steps with a quarter to spare.

use streamalloc::memory::{
    AllocationMode, Cleanup, DeviceProperties, MemoryConfig, MemoryConfiguration, MemoryError,
    MemoryManager, PageUpdate, PoolKind,
};
use streamalloc::storage::HostStorage;

mod common;

/// The metadata pool's page (the `Adaptive` preset's, as documented).
const METADATA_PAGE_SIZE: u64 = 8 << 20;
use common::MIB;

const DEVICE: DeviceProperties = DeviceProperties::new(128 * MIB, 32);

fn manager(pools: MemoryConfiguration, device: DeviceProperties) -> MemoryManager<HostStorage> {
    MemoryManager::new(
        HostStorage::new(),
        MemoryConfig {
            device,
            ..MemoryConfig::with_pools(pools)
        },
    )
}

fn adaptive() -> MemoryManager<HostStorage> {
    manager(MemoryConfiguration::Adaptive, DEVICE)
}

fn exclusive() -> MemoryManager<HostStorage> {
    manager(MemoryConfiguration::ExclusivePages, DEVICE)
}

#[test]
fn adaptive_preset_routes_near_page_sizes_to_the_adaptive_pool() {
    let mut memory = adaptive();
    let _near = memory.reserve(7 * MIB, PageUpdate::Allow).unwrap();
    let served = memory
        .memory_report()
        .dynamic
        .into_iter()
        .find(|pool| pool.largest_alloc == 7 * MIB)
        .expect("some pool served it");
    assert!(
        matches!(served.kind, PoolKind::Adaptive { .. }),
        "{:?}",
        served.kind
    );
}

#[test]
fn handle_mutability() {
    for mut memory in [adaptive(), exclusive()] {
        let handle = memory.reserve(10, PageUpdate::Allow).unwrap();
        let other = handle.clone();
        assert!(!handle.can_mut(), "not mutable with two handles");
        drop(other);
        assert!(handle.can_mut(), "mutable with one handle");
        let binding = handle.binding();
        assert!(!handle.can_mut(), "a binding counts as a handle");
        drop(binding);
        assert!(handle.can_mut());
    }
}

#[test]
fn memory_usage_is_stable_across_free_and_reserve() {
    let mut memory = adaptive();
    let handle = memory.reserve(100, PageUpdate::Allow).unwrap();
    let usage = memory.memory_report().usage();
    assert_eq!(usage.bytes_in_use, 100);
    assert_eq!(usage.bytes_reserved, METADATA_PAGE_SIZE);
    drop(handle);
    let _handle = memory.reserve(100, PageUpdate::Allow).unwrap();
    assert_eq!(memory.memory_report().usage(), usage);
}

#[test]
fn find_uninit_binding_returns_not_found() {
    let mut memory = adaptive();
    let _live = memory.reserve(512, PageUpdate::Allow).unwrap();
    let unbound = memory.unbound();
    assert_eq!(memory.get_cursor(&unbound), Err(MemoryError::Uninitialized));
    assert_eq!(
        memory.get_storage(&unbound.binding()),
        Err(MemoryError::Uninitialized)
    );
}

#[test]
fn find_stale_descriptor_returns_not_found() {
    let mut memory = adaptive();
    let reserved = memory.reserve(512, PageUpdate::Allow).unwrap();
    let stale = reserved.clone();
    let assigned = memory.unbound();
    memory.bind(reserved, &assigned, 7).unwrap();
    assert!(matches!(
        memory.get_cursor(&stale),
        Err(MemoryError::Stale(_))
    ));
    assert_eq!(memory.get_cursor(&assigned), Ok(7));
    // The stale handle dropping must not free what `assigned` now owns.
    drop(stale);
    let _other = memory.reserve(512, PageUpdate::Allow).unwrap();
    assert_eq!(memory.memory_report().usage().number_allocs, 2);
    assert!(memory.get_storage(&assigned).is_ok());
}

#[test]
fn held_binding_survives_explicit_cleanup() {
    let mut memory = exclusive();
    let a = memory.reserve(1024, PageUpdate::Allow).unwrap();
    let b = memory.reserve(1024, PageUpdate::Allow).unwrap();
    let c = memory.reserve(1024, PageUpdate::Allow).unwrap();
    let binding = b.binding();
    drop(b);
    let reserved = memory.memory_report().usage().bytes_reserved;
    drop(a);
    drop(c);
    memory.cleanup(Cleanup::Explicit);
    assert!(memory.get_cursor(&binding).is_ok());
    memory.write(&binding, 0, &[9; 16]).unwrap();
    assert_eq!(memory.read(&binding, 0, 16).unwrap(), vec![9; 16]);
    assert!(memory.memory_report().usage().bytes_reserved < reserved);
}

#[test]
fn persistent_windows_nest() {
    let mut memory = adaptive();
    memory.mode(AllocationMode::Persistent); // the load's window
    memory.mode(AllocationMode::Persistent); // one parameter's window
    memory.mode(AllocationMode::Auto); // that parameter is done
    let weight = memory.reserve(1024, PageUpdate::Allow).unwrap();
    let report = memory.memory_report();
    assert_eq!(report.persistent.usage.bytes_in_use, 1024);
    assert_eq!(report.dynamic.iter().map(|p| p.pages_peak).sum::<u64>(), 0);

    memory.mode(AllocationMode::Auto);
    let _transient = memory.reserve(1024, PageUpdate::Allow).unwrap();
    assert_eq!(
        memory
            .memory_report()
            .dynamic
            .iter()
            .map(|p| p.pages_peak)
            .sum::<u64>(),
        1
    );
    drop(weight);
}

#[test]
fn alloc_two_chunks_on_one_page() {
    let mut memory = adaptive();
    let _a = memory.reserve(512, PageUpdate::Allow).unwrap();
    let _b = memory.reserve(512, PageUpdate::Allow).unwrap();
    let usage = memory.memory_report().usage();
    assert_eq!(usage.number_allocs, 2);
    assert_eq!(usage.bytes_in_use, 1024);
    assert_eq!(usage.bytes_reserved, METADATA_PAGE_SIZE);
}

#[test]
fn alloc_reuses_storage() {
    let mut memory = adaptive();
    drop(memory.reserve(512, PageUpdate::Allow).unwrap());
    let _b = memory.reserve(512, PageUpdate::Allow).unwrap();
    let usage = memory.memory_report().usage();
    assert_eq!(usage.number_allocs, 1);
    assert_eq!(usage.bytes_in_use, 512);
    assert_eq!(usage.bytes_reserved, METADATA_PAGE_SIZE);
}

#[test]
fn alloc_allocs_new_storage() {
    let mut memory = adaptive();
    let page = 2 * MIB;
    let size = page / 4 * 3;
    let _a = memory.reserve(size, PageUpdate::Allow).unwrap();
    let _b = memory.reserve(size, PageUpdate::Allow).unwrap();
    let usage = memory.memory_report().usage();
    assert_eq!(usage.number_allocs, 2);
    assert_eq!(usage.bytes_in_use, size * 2);
    assert_eq!(usage.bytes_reserved, page * 2);
}

#[test]
fn alloc_respects_alignment_size() {
    for pools in [
        MemoryConfiguration::Adaptive,
        MemoryConfiguration::ExclusivePages,
    ] {
        let mut memory = manager(pools, DeviceProperties::new(DEVICE.max_page_size, 50));
        let a = memory.reserve(40, PageUpdate::Allow).unwrap();
        let b = memory.reserve(40, PageUpdate::Allow).unwrap();
        assert_eq!(memory.memory_report().usage().bytes_padding, 10 * 2);
        let (ra, rb) = (
            memory.get_storage(&a).unwrap(),
            memory.get_storage(&b).unwrap(),
        );
        assert_eq!(ra.offset % 50, 0);
        assert_eq!(rb.offset % 50, 0);
    }
}

#[test]
fn allocs_on_correct_page() {
    let mut memory = adaptive();
    let sizes = [4096, 4 * MIB];
    let handles = sizes.map(|size| memory.reserve(size, PageUpdate::Allow).unwrap());
    let pools: Vec<_> = memory
        .memory_report()
        .dynamic
        .iter()
        .map(|pool| pool.usage.number_allocs)
        .collect();
    assert_eq!(
        pools,
        vec![1, 1],
        "metadata and the workload must not share a pool"
    );
    let usage = memory.memory_report().usage();
    assert_eq!(usage.bytes_in_use, sizes.iter().sum::<u64>());
    // One metadata page and one adaptive page grown to 4 MiB + a quarter.
    assert_eq!(usage.bytes_reserved, METADATA_PAGE_SIZE + 5 * MIB);
    drop(handles);
}

#[test]
fn single_arena_reuses_across_sizes() {
    let mut memory = adaptive();
    drop(memory.reserve(128 * 1024, PageUpdate::Allow).unwrap());
    let _large = memory.reserve(512 * 1024, PageUpdate::Allow).unwrap();
    let usage = memory.memory_report().usage();
    assert_eq!(
        usage.bytes_reserved,
        2 * MIB,
        "both sizes share one arena page"
    );
    assert_eq!(usage.number_allocs, 1);
}

#[test]
fn allocate_deallocate_reallocate() {
    for (mut memory, exact) in [(adaptive(), false), (exclusive(), true)] {
        let sizes = (1..=5).map(|i| 1000 * i);
        let handles: Vec<_> = sizes
            .clone()
            .map(|s| memory.reserve(s, PageUpdate::Allow).unwrap())
            .collect();
        let before = memory.memory_report().usage();
        drop(handles);
        let _again: Vec<_> = sizes
            .map(|s| memory.reserve(s, PageUpdate::Allow).unwrap())
            .collect();
        let after = memory.memory_report().usage();
        assert_eq!(before.number_allocs, after.number_allocs);
        assert_eq!(before.bytes_in_use, after.bytes_in_use);
        if exact {
            assert_eq!(before.bytes_reserved, after.bytes_reserved);
        } else {
            assert!(before.bytes_reserved >= after.bytes_reserved);
        }
    }
}

#[test]
fn fragmentation_resistance() {
    let mut memory = adaptive();
    let sizes = [50, 1000, 100, 5000, 200, 10000, 300];
    let mut handles: Vec<_> = sizes
        .iter()
        .map(|&s| Some(memory.reserve(s, PageUpdate::Allow).unwrap()))
        .collect();
    let before = memory.memory_report().usage();
    for handle in handles.iter_mut().step_by(2) {
        *handle = None;
    }
    let _again: Vec<_> = sizes[..sizes.len() / 2]
        .iter()
        .map(|&s| memory.reserve(s, PageUpdate::Allow).unwrap())
        .collect();
    let after = memory.memory_report().usage();
    assert!(after.bytes_reserved as f64 <= before.bytes_reserved as f64 * 1.1);
}

#[test]
fn exclusive_pages_two_chunks_reuse_and_new_storage() {
    let mut memory = exclusive();
    let a = memory.reserve(512, PageUpdate::Allow).unwrap();
    let b = memory.reserve(768, PageUpdate::Allow).unwrap();
    let usage = memory.memory_report().usage();
    assert_eq!(usage.number_allocs, 2);
    assert_eq!(usage.bytes_in_use, 512 + 768);
    assert!(usage.bytes_reserved >= 512 + 768);
    let pages = memory.memory_report().dynamic[0].pages;
    assert_eq!(pages, 2, "one page per allocation");
    drop(a);
    let _c = memory.reserve(512, PageUpdate::Allow).unwrap();
    assert_eq!(
        memory.memory_report().dynamic[0].pages,
        2,
        "the freed page is reused"
    );
    drop(b);
}

#[test]
fn exclusive_pages_allocs_on_correct_page() {
    let mut memory = manager(
        MemoryConfiguration::ExclusivePages,
        DeviceProperties::new(DEVICE.max_page_size, 10),
    );
    let sizes = [50, 150, 250, 350];
    let _handles = sizes.map(|s| memory.reserve(s, PageUpdate::Allow).unwrap());
    let usage = memory.memory_report().usage();
    assert_eq!(usage.bytes_in_use, sizes.iter().sum::<u64>());
    assert_eq!(memory.memory_report().dynamic[0].pages, 4);
    // Binned pages waste at most an eighth over the aligned size.
    assert!(usage.bytes_reserved as f64 <= usage.bytes_in_use as f64 * 1.125 + 40.0);
}

#[test]
fn a_guarded_allocation_is_never_handed_out_again() {
    let mut memory = exclusive();
    let recorded = memory.reserve(1024, PageUpdate::Allow).unwrap();
    let guard = memory.guard(&recorded).unwrap();
    drop(recorded);
    let before = memory.memory_report().usage().bytes_reserved;
    let other = memory.reserve(1024, PageUpdate::Allow).unwrap();
    let after = memory.memory_report().usage().bytes_reserved;
    assert!(after > before, "the guarded page was handed out again");
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.memory_report().usage().bytes_reserved, after);
    drop(guard);
    drop(other);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.memory_report().usage().bytes_reserved, 0);
    assert_eq!(memory.bytes_allocated(), 0);
}

#[test]
fn a_guard_leaves_in_place_updates_alone() {
    let mut memory = exclusive();
    let cache = memory.reserve(1024, PageUpdate::Allow).unwrap();
    let _guard = memory.guard(&cache).unwrap();
    assert!(cache.can_mut(), "a guard does not count as a handle");
    memory.write(&cache, 0, &[1, 2, 3]).unwrap();
    assert_eq!(memory.read(&cache, 0, 3).unwrap(), vec![1, 2, 3]);
}

#[test]
fn a_guarded_sliced_page_carves_nothing_new() {
    let mut memory = adaptive();
    let first = memory.reserve(1024, PageUpdate::Allow).unwrap();
    let guard = memory.guard(&first).unwrap();
    let second = memory.reserve(1024, PageUpdate::Allow).unwrap();
    assert_ne!(
        memory.get_storage(&first).unwrap().id,
        memory.get_storage(&second).unwrap().id,
        "carved from a guarded page"
    );
    drop(guard);
    let third = memory.reserve(1024, PageUpdate::Allow).unwrap();
    let ids = [&first, &second, &third].map(|a| memory.get_storage(a).unwrap().id);
    assert!(ids[2] == ids[0] || ids[2] == ids[1]);
}
