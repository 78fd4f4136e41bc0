//! The manager's behaviour beyond the seed: modes and persistent policies,
//! page updates, periodic and dedicated returns, every caller error, and
//! no leak.

use streamalloc::memory::{
    AllocationMode, Cleanup, DeviceProperties, MemoryConfig, MemoryConfiguration, MemoryError,
    MemoryManager, PageUpdate, PersistentMemory, PoolConfig, PoolKind,
};
use streamalloc::storage::{
    DeviceStorage, FaultPlan, HostStorage, LimitedStorage, StorageError, VirtualStorage,
};

mod common;
use common::MIB;

fn host(config: MemoryConfig) -> MemoryManager<HostStorage> {
    MemoryManager::new(HostStorage::new(), config)
}

#[test]
fn every_size_error_is_typed() {
    let mut memory = host(MemoryConfig {
        device: DeviceProperties::new(64 * MIB, 256),
        ..MemoryConfig::default()
    });
    assert_eq!(
        memory.reserve(0, PageUpdate::Allow).unwrap_err(),
        MemoryError::ZeroSize
    );
    assert_eq!(
        memory.reserve(64 * MIB + 1, PageUpdate::Allow).unwrap_err(),
        MemoryError::TooLarge {
            size: 64 * MIB + 1,
            aligned: 64 * MIB + 256,
            max: 64 * MIB
        }
    );
    assert!(memory.reserve(64 * MIB, PageUpdate::Allow).is_ok());
    assert_eq!(
        memory.reserve(u64::MAX, PageUpdate::Allow).unwrap_err(),
        MemoryError::TooLarge {
            size: u64::MAX,
            aligned: u64::MAX,
            max: 64 * MIB
        }
    );
}

#[test]
fn foreign_handles_are_refused() {
    let mut a = host(MemoryConfig::default());
    let mut b = host(MemoryConfig::default());
    let from_a = a.reserve(100, PageUpdate::Allow).unwrap();
    let _from_b = b.reserve(100, PageUpdate::Allow).unwrap();
    assert!(matches!(
        b.get_cursor(&from_a),
        Err(MemoryError::Foreign(_))
    ));
    assert!(matches!(
        b.read(&from_a, 0, 1),
        Err(MemoryError::Foreign(_))
    ));
    let unbound_b = b.unbound();
    let reserved = a.reserve(10, PageUpdate::Allow).unwrap();
    assert!(matches!(
        a.bind(reserved, &unbound_b, 0),
        Err(MemoryError::Foreign(_))
    ));
    let again = a.reserve(10, PageUpdate::Allow).unwrap();
    let bound = a.reserve(10, PageUpdate::Allow).unwrap();
    assert!(matches!(
        a.bind(again, &bound, 0),
        Err(MemoryError::AlreadyBound(_))
    ));
}

#[test]
fn out_of_bounds_reads_and_writes_are_refused() {
    let mut memory = host(MemoryConfig::default());
    let a = memory.reserve(100, PageUpdate::Allow).unwrap();
    assert_eq!(
        memory.write(&a, 90, &[0; 20]),
        Err(MemoryError::OutOfBounds {
            start: 90,
            end: 110,
            size: 100
        })
    );
    assert_eq!(
        memory.read(&a, 50, 51),
        Err(MemoryError::OutOfBounds {
            start: 50,
            end: 101,
            size: 100
        })
    );
    assert!(memory.get_resource(&a, Some(60), Some(50)).is_err());
    let r = memory.get_resource(&a, Some(10), Some(30)).unwrap();
    assert_eq!(r.len, 20);
    let whole = memory.get_resource(&a, None, None).unwrap();
    assert_eq!(r.addr, whole.addr + 10);
    assert!(memory.write(&a, u64::MAX, &[1]).is_err());
}

#[test]
fn forbidden_and_add_only_page_updates() {
    let mut memory = host(MemoryConfig::default());
    assert_eq!(
        memory.reserve(1000, PageUpdate::Forbidden).unwrap_err(),
        MemoryError::PageUpdateForbidden { size: 1000 }
    );
    let a = memory.reserve(1000, PageUpdate::AddOnly).unwrap();
    // Room is held now: a forbidden update can use it.
    let b = memory.reserve(1000, PageUpdate::Forbidden).unwrap();
    let id = memory.get_storage(&a).unwrap().id;
    assert_eq!(memory.get_storage(&b).unwrap().id, id);
    drop((a, b));
}

#[test]
fn idle_pages_return_after_their_period_but_not_on_add_only() {
    let period = 10;
    let mut memory = host(MemoryConfig::with_pools(MemoryConfiguration::Custom(vec![
        PoolConfig {
            kind: PoolKind::Sliced { page_size: MIB },
            max_alloc_size: 64 * 1024,
            dealloc_period: Some(period),
        },
        PoolConfig {
            kind: PoolKind::ExclusivePages,
            max_alloc_size: 16 * MIB,
            dealloc_period: Some(period),
        },
    ])));
    let big = memory.reserve(4 * MIB, PageUpdate::Allow).unwrap();
    drop(big);
    let small = memory.reserve(100, PageUpdate::Allow).unwrap();
    assert!(memory.bytes_allocated() >= 4 * MIB + MIB);
    for _ in 0..period * 2 {
        drop(memory.reserve(100, PageUpdate::AddOnly).unwrap());
    }
    assert!(
        memory.bytes_allocated() >= 5 * MIB,
        "add-only never returns pages"
    );
    drop(memory.reserve(100, PageUpdate::Allow).unwrap());
    assert_eq!(
        memory.bytes_allocated(),
        MIB,
        "the idle exclusive page went back"
    );
    drop(small);
    for _ in 0..period + 1 {
        drop(memory.reserve(4 * MIB, PageUpdate::Allow).unwrap());
    }
    assert_eq!(
        memory.bytes_allocated(),
        4 * MIB,
        "the idle sliced page went back"
    );
}

#[test]
fn default_pools_return_idle_pages_without_an_explicit_cleanup() {
    let mut memory = host(MemoryConfig::with_pools(MemoryConfiguration::Adaptive));
    let burst: Vec<_> = (0..8)
        .map(|_| memory.reserve(MIB, PageUpdate::Allow).unwrap())
        .collect();
    assert_eq!(memory.bytes_allocated(), 8 * MIB, "four 2 MiB arena pages");
    drop(burst);
    let adaptive = MemoryConfiguration::Adaptive.pools(&DeviceProperties::default());
    let period = adaptive[1]
        .dealloc_period
        .expect("the preset returns idle pages");
    for _ in 0..period + 1 {
        drop(memory.reserve(1024, PageUpdate::Allow).unwrap());
    }
    let report = memory.memory_report();
    assert_eq!(
        report.dynamic[1].pages, 0,
        "the idle arena pages went back: {memory}"
    );
    assert_eq!(
        memory.bytes_allocated(),
        8 * MIB,
        "only the metadata page is left"
    );
}

#[test]
fn dedicated_buffers_go_back_on_the_next_tick() {
    let mut memory = host(MemoryConfig::default());
    memory.mode(AllocationMode::Dedicated);
    let buffer = memory.reserve(3 * MIB, PageUpdate::Allow).unwrap();
    memory.mode(AllocationMode::Auto);
    let report = memory.memory_report();
    assert_eq!(report.dedicated.usage.bytes_in_use, 3 * MIB);
    assert_eq!(report.dedicated.usage.bytes_reserved, 3 * MIB);
    drop(buffer);
    let _next = memory.reserve(100, PageUpdate::Allow).unwrap();
    assert_eq!(memory.memory_report().dedicated.usage.bytes_reserved, 0);
}

#[test]
fn persistent_policies() {
    // Enforced: everything is persistent.
    let mut enforced = host(MemoryConfig {
        persistent: PersistentMemory::Enforced,
        ..Default::default()
    });
    let _w = enforced.reserve(4096, PageUpdate::Allow).unwrap();
    assert_eq!(enforced.memory_report().persistent.usage.number_allocs, 1);

    // Disabled: a persistent window changes nothing.
    let mut disabled = host(MemoryConfig {
        persistent: PersistentMemory::Disabled,
        ..Default::default()
    });
    disabled.mode(AllocationMode::Persistent);
    let _w = disabled.reserve(4096, PageUpdate::Allow).unwrap();
    assert_eq!(disabled.memory_report().persistent.usage.number_allocs, 0);

    // SizeMatch: outside a window, a size the pool holds goes persistent.
    let mut size_match = host(MemoryConfig {
        persistent: PersistentMemory::SizeMatch,
        ..Default::default()
    });
    size_match.mode(AllocationMode::Persistent);
    let weight = size_match.reserve(12_345, PageUpdate::Allow).unwrap();
    size_match.mode(AllocationMode::Auto);
    let same = size_match.reserve(12_345, PageUpdate::Allow).unwrap();
    let other = size_match.reserve(999, PageUpdate::Allow).unwrap();
    let report = size_match.memory_report();
    assert_eq!(report.persistent.usage.number_allocs, 2);
    assert_eq!(report.usage().number_allocs, 3);
    drop(weight);
    // The freed exact-size slice is reused by the same size.
    let reused = size_match.reserve(12_345, PageUpdate::Allow).unwrap();
    assert_eq!(size_match.memory_report().persistent.pages, 2);
    drop((same, other, reused));
}

#[test]
fn a_forced_base_mode_holds_outside_windows() {
    let mut memory = host(MemoryConfig {
        mode: Some(AllocationMode::Dedicated),
        ..Default::default()
    });
    let a = memory.reserve(100, PageUpdate::Allow).unwrap();
    assert_eq!(memory.memory_report().dedicated.usage.number_allocs, 1);
    memory.mode(AllocationMode::Persistent);
    assert_eq!(memory.effective_mode(), AllocationMode::Persistent);
    memory.mode(AllocationMode::Auto);
    memory.mode(AllocationMode::Auto); // closing with no window open is harmless
    assert_eq!(memory.effective_mode(), AllocationMode::Dedicated);
    drop(a);
}

#[test]
fn storage_failures_are_typed_and_leave_the_manager_usable() {
    let storage = LimitedStorage::new(HostStorage::new(), 10 * MIB)
        .with_faults(FaultPlan::none().fail_allocation(2));
    let mut memory = MemoryManager::new(
        storage,
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    );
    let a = memory.reserve(100, PageUpdate::Allow).unwrap(); // 8 MiB metadata page
    let err = memory.reserve(MIB, PageUpdate::Allow).unwrap_err();
    assert!(
        matches!(err, MemoryError::Storage(StorageError::InjectedFault(_))),
        "{err}"
    );
    let err = memory.reserve(4 * MIB, PageUpdate::Allow).unwrap_err();
    assert!(
        matches!(err, MemoryError::Storage(StorageError::OutOfMemory { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("out of memory"));
    let b = memory.reserve(MIB, PageUpdate::Allow).unwrap();
    memory.write(&b, 0, &[5; 8]).unwrap();
    assert_eq!(memory.read(&b, 0, 8).unwrap(), vec![5; 8]);
    assert_eq!(memory.memory_report().usage().number_allocs, 2);
    drop((a, b));
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 0);
}

#[test]
fn virtual_storage_counts_without_bytes() {
    let mut memory = MemoryManager::new(VirtualStorage::new(), MemoryConfig::default());
    let big: Vec<_> = (0..64)
        .map(|_| memory.reserve(512 * MIB, PageUpdate::Allow).unwrap())
        .collect();
    assert!(memory.bytes_allocated() >= 32 * 1024 * MIB);
    assert_eq!(
        memory.read(&big[0], 0, 4).unwrap_err(),
        MemoryError::Storage(StorageError::NoBacking)
    );
    drop(big);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 0);
}

#[test]
fn nothing_leaks_after_every_handle_drops() {
    for pools in [
        MemoryConfiguration::Adaptive,
        MemoryConfiguration::ExclusivePages,
    ] {
        let mut memory = host(MemoryConfig::with_pools(pools));
        let mut live = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for step in 0..2000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let size = 1 + seed % (MIB / 4);
            match step % 7 {
                0 => memory.mode(AllocationMode::Persistent),
                3 => memory.mode(AllocationMode::Auto),
                5 => memory.mode(AllocationMode::Dedicated),
                6 => memory.mode(AllocationMode::Auto),
                _ => {}
            }
            let a = memory.reserve(size, PageUpdate::Allow).unwrap();
            memory.write(&a, size - 1, &[step as u8]).unwrap();
            live.push((a, size, step as u8));
            if seed % 3 == 0 {
                let (a, size, mark) = live.swap_remove((seed as usize / 3) % live.len());
                assert_eq!(memory.read(&a, size - 1, 1).unwrap(), vec![mark]);
            }
        }
        for (a, size, mark) in &live {
            assert_eq!(memory.read(a, size - 1, 1).unwrap(), vec![*mark]);
        }
        drop(live);
        memory.cleanup(Cleanup::Explicit);
        memory.flush();
        assert_eq!(memory.bytes_allocated(), 0);
        assert_eq!(memory.memory_report().usage(), Default::default());
    }
}

#[test]
fn handles_dropped_on_other_threads_are_released() {
    let mut memory = host(MemoryConfig::default());
    let handles: Vec<_> = (0..100)
        .map(|_| memory.reserve(1000, PageUpdate::Allow).unwrap())
        .collect();
    std::thread::spawn(move || drop(handles)).join().unwrap();
    memory.process_releases();
    assert_eq!(memory.memory_report().usage().number_allocs, 0);
}

#[test]
fn the_report_displays_every_pool() {
    let mut memory = host(MemoryConfig::with_pools(MemoryConfiguration::Adaptive));
    let _a = memory.reserve(3 * MIB, PageUpdate::Allow).unwrap();
    let text = memory.to_string();
    assert!(text.contains("adaptive"), "{text}");
    assert!(text.contains("persistent"), "{text}");
    assert!(text.contains("3.00 MiB in use"), "{text}");
    let usage = memory.memory_report().usage();
    assert_eq!(usage.bytes_reserved, memory.storage().bytes_allocated());
}
