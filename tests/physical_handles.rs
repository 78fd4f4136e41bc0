//! Physical handles of several granules: a map of a long run of fresh
//! granules costs one driver call per handle, not per granule; the arena
//! gives back only what frees whole handles, so no memory is stranded at
//! a fence that passed; and nothing is lost or kept once everything goes.

mod common;

use common::MIB;
use proptest::prelude::*;
use streamalloc::memory::{
    Cleanup, MemoryConfig, MemoryConfiguration, MemoryManager, PageUpdate, RelocationReason,
};
use streamalloc::storage::{DeviceStorage, HostStorage, VirtualStorage};

fn expandable<S: DeviceStorage>(storage: S) -> MemoryManager<S> {
    MemoryManager::new(
        storage,
        MemoryConfig::with_pools(MemoryConfiguration::Expandable),
    )
}

#[test]
fn a_large_arena_maps_in_few_handles_and_gives_them_all_back() {
    let mut memory = expandable(VirtualStorage::new().with_handle_granules(16));
    // 1.5 GiB in 24 tensors of 64 MiB: the arena grows to 768 granules.
    let held: Vec<_> = (0..24)
        .map(|_| memory.reserve(64 * MIB, PageUpdate::Allow).unwrap())
        .collect();
    let ops = memory.storage().driver_ops();
    assert_eq!(ops.handle_granules_created, 768);
    assert!(
        ops.handles_created * 2 < ops.handle_granules_created,
        "{} handles for {} granules",
        ops.handles_created,
        ops.handle_granules_created
    );
    assert_eq!(ops.maps, ops.handles_created, "one map per handle");
    assert_eq!(ops.access_grants, ops.handles_created);
    drop(held);
    memory.cleanup(Cleanup::Explicit);
    let ops = memory.storage().driver_ops();
    assert_eq!(memory.bytes_allocated(), 0, "every handle gone");
    assert_eq!(memory.bytes_stranded(), 0);
    assert_eq!(ops.handles_released, ops.handles_created);
    assert_eq!(ops.unmaps, ops.handles_released, "one unmap per handle");
}

#[test]
fn bytes_kept_beside_a_partly_free_handle_stay_intact() {
    // Host memory, so the bytes are real (mapped, never touched but for
    // the pattern): 1 GiB of tensors makes the arena's handles several
    // granules long; one small allocation placed among them keeps its
    // handle, and its bytes, while the rest goes.
    let mut memory = expandable(HostStorage::new().with_handle_granules(16));
    let mut held: Vec<_> = (0..8)
        .map(|_| memory.reserve(128 * MIB, PageUpdate::Allow).unwrap())
        .collect();
    let ops = memory.storage().driver_ops();
    assert!(ops.handles_created * 2 < ops.handle_granules_created);
    drop(held.swap_remove(7));
    let kept = memory.reserve(MIB, PageUpdate::Allow).unwrap();
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    memory.write(&kept, 0, &pattern).unwrap();
    drop(held);
    memory.cleanup(Cleanup::Explicit);
    assert!(
        memory.bytes_allocated() <= 32 * MIB,
        "what is free went back"
    );
    assert_eq!(memory.bytes_stranded(), 0, "none stranded by the arena");
    assert_eq!(memory.read(&kept, 0, 4096).unwrap(), pattern);
    drop(kept);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 0);
}

/// An arena on host memory (the bytes are real) grown to 2 GiB, in
/// handles of 8 granules at its start (a range cuts its handles at 1/64
/// of what it holds), then emptied: all of it free and mapped.
fn grown_and_emptied() -> MemoryManager<HostStorage> {
    let mut memory = expandable(HostStorage::new().with_handle_granules(16));
    let grown = [(); 2].map(|()| memory.reserve(1024 * MIB, PageUpdate::Allow).unwrap());
    drop(grown);
    memory
}

#[test]
fn a_settle_rehomes_what_keeps_a_handle_held_and_keeps_its_bytes() {
    // Host memory: the bytes are real. The arena grew to 2 GiB in handles
    // of 8 granules at its start (a range cuts its handles at 1/64 of what
    // it holds) and emptied; 20 MiB kept at its start holds the first
    // handle and 4 MiB of the second, whose other 12 MiB no cleanup can
    // give back. A settle moves it into 20 MiB of fresh granules, and
    // both old handles go.
    let mut memory = grown_and_emptied();
    let kept = memory.reserve(20 * MIB, PageUpdate::Allow).unwrap();
    let pattern: Vec<u8> = (0..20 * MIB).map(|i| (i % 253) as u8).collect();
    memory.write(&kept, 0, &pattern).unwrap();
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 32 * MIB, "two handles held");
    let report = memory.relocate(RelocationReason::Settle).unwrap();
    memory.flush();
    assert_eq!(report.moved, 1, "{report:?}");
    assert_eq!(memory.bytes_allocated(), 20 * MIB, "only its own granules");
    assert_eq!(memory.read(&kept, 0, 20 * MIB).unwrap(), pattern);
    drop(kept);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 0);
}

#[test]
fn a_settle_rehomes_a_group_that_keeps_a_handle_held_and_keeps_their_bytes() {
    // The same 2 GiB arena, emptied: 16 MiB kept at its start, pinned by a
    // client, fills the first handle (granules 0..8); three allocations
    // of 1 MiB right after it hold the second handle (8..16), whose other
    // 13 MiB no cleanup can give back. No one of the three frees the
    // handle by moving (the others stay), and the island's move would
    // need the pinned one: the three move together, packed into two
    // fresh granules, and the handle goes.
    let mut memory = grown_and_emptied();
    let first = memory.reserve(16 * MIB, PageUpdate::Allow).unwrap();
    let pin = memory.pin(&first).unwrap();
    let group = [(); 3].map(|()| memory.reserve(MIB, PageUpdate::Allow).unwrap());
    let patterns: Vec<Vec<u8>> = (0..3u8)
        .map(|k| (0..MIB).map(|i| (i % 251) as u8 ^ k).collect())
        .collect();
    for (allocation, pattern) in group.iter().zip(&patterns) {
        memory.write(allocation, 0, pattern).unwrap();
    }
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 32 * MIB, "two handles held");
    let report = memory.relocate(RelocationReason::Settle).unwrap();
    memory.flush();
    assert_eq!(report.moved, 3, "{report:?}");
    assert_eq!(
        memory.bytes_allocated(),
        20 * MIB,
        "the first handle, and the group's 3 MiB in two granules"
    );
    for (allocation, pattern) in group.iter().zip(&patterns) {
        assert_eq!(&memory.read(allocation, 0, MIB).unwrap(), pattern);
    }
    drop((pin, first, group));
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any reservations and releases, on a device 0-3 flushes behind its
    /// host, with handles of 1-32 granules: memory held is what the pools
    /// hold plus what waits behind fences or beside a handle still in use;
    /// on a device that keeps up none is ever stranded (the arena unmaps
    /// only whole handles); and once nothing is live an explicit cleanup
    /// gives every handle back.
    #[test]
    fn every_handle_goes_back_and_none_is_stranded_on_a_device_that_keeps_up(
        lag in 0u64..4,
        handle_granules in prop::sample::select(vec![1u64, 4, 16, 32]),
        steps in prop::collection::vec((1u64..96 * MIB, any::<bool>(), any::<u16>()), 1..120),
    ) {
        let storage = VirtualStorage::new()
            .with_reclaim_lag(lag)
            .with_handle_granules(handle_granules);
        let mut memory = expandable(storage);
        let mut held = Vec::new();
        for (i, (size, release, pick)) in steps.into_iter().enumerate() {
            held.push(memory.reserve(size, PageUpdate::Allow).unwrap());
            if release && !held.is_empty() {
                let at = usize::from(pick) % held.len();
                drop(held.swap_remove(at));
            }
            if i % 7 == 0 {
                memory.cleanup(Cleanup::Periodic);
            }
            prop_assert_eq!(
                memory.bytes_allocated(),
                memory.bytes_reserved() + memory.bytes_in_reclaim() + memory.bytes_stranded()
            );
            if lag == 0 {
                prop_assert_eq!(memory.bytes_stranded(), 0);
            }
        }
        drop(held);
        memory.cleanup(Cleanup::Explicit);
        let ops = memory.storage().driver_ops();
        prop_assert_eq!(memory.bytes_allocated(), 0);
        prop_assert_eq!(memory.bytes_stranded(), 0);
        prop_assert_eq!(ops.handles_released, ops.handles_created);
        prop_assert_eq!(ops.handle_granules_released, ops.handle_granules_created);
    }
}
