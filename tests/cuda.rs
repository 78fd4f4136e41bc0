//! The CUDA storage on a real device: bytes round-trip, relocation keeps
//! them, running out of device memory is a typed error, a page used on
//! another stream waits for its work, memory goes back in stream order on
//! a stream of its own and on the default stream, the service runs over
//! it, and one stream lends to another there. Each test prints one skip line and passes where no driver or
//! device exists.

#![cfg(feature = "cuda")]

use std::sync::Arc;
use streamalloc::memory::{
    Cleanup, MemoryConfig, MemoryConfiguration, MemoryManager, PageUpdate, PoolKind, StreamId,
};
use streamalloc::service::{ServiceConfig, Supervisor};
use streamalloc::storage::{
    BudgetedStorage, CudaStorage, DeviceBudget, DeviceStorage, StorageError,
};

fn device() -> Option<CudaStorage> {
    match CudaStorage::new(0) {
        Ok(storage) => Some(storage),
        Err(err) => {
            eprintln!("skipped: no CUDA device ({err})");
            None
        }
    }
}

#[test]
fn bytes_round_trip_through_the_device() {
    let Some(mut storage) = device() else { return };
    let page = storage.allocate(1 << 20).unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    let range = page.sub_range(1000, 1000 + 4096).unwrap();
    storage.write(&range, &data).unwrap();
    let mut back = vec![0; 4096];
    storage.read(&range, &mut back).unwrap();
    assert_eq!(back, data);
    let resource = storage.resource(&range).unwrap();
    assert_eq!(resource.len, 4096);
    assert_ne!(resource.addr, 0);
    storage.deallocate(page.id);
    assert_eq!(storage.bytes_allocated(), 1 << 20, "freed only at flush");
    // A flush lets it go behind an event; a drain waits for it.
    storage.drain();
    assert_eq!(storage.bytes_allocated(), 0);
}

#[test]
fn relocation_keeps_bytes_on_the_device() {
    let Some(storage) = device() else { return };
    // Pages, as CubeCL lays them out: compaction empties whole pages.
    let mut memory = MemoryManager::new(
        storage,
        MemoryConfig::with_pools(MemoryConfiguration::Adaptive),
    );
    let all: Vec<_> = (0..48u64)
        .map(|i| {
            let a = memory
                .reserve(300 * 1024 + i * 256, PageUpdate::Allow)
                .unwrap();
            memory.write(&a, 0, &[i as u8; 4096]).unwrap();
            (a, i)
        })
        .collect();
    let kept: Vec<_> = all.into_iter().filter(|(_, i)| i % 4 == 0).collect();
    memory.process_releases();
    let before = memory.bytes_allocated();
    let report = memory.compact().unwrap();
    assert!(report.moved > 0 && report.pages_released > 0, "{report:?}");
    assert!(memory.bytes_allocated() < before);
    for (a, i) in &kept {
        assert_eq!(memory.read(a, 0, 4096).unwrap(), vec![*i as u8; 4096]);
    }
    drop(kept);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 0);
}

#[test]
fn a_range_maps_granules_and_keeps_their_bytes() {
    let Some(mut storage) = device() else { return };
    let Some(granule) = storage.granule() else {
        eprintln!("skipped: the device has no virtual memory management");
        return;
    };
    let range = storage.reserve_range(16 * granule).unwrap();
    assert_eq!(
        storage.bytes_allocated(),
        0,
        "address space costs no memory"
    );
    let two = range.sub_range(granule, 3 * granule).unwrap();
    storage.map(&two).unwrap();
    assert_eq!(storage.bytes_allocated(), 2 * granule);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 % 251) as u8).collect();
    // Across the boundary of the two granules (two physical allocations).
    let across = range
        .sub_range(2 * granule - 4096, 2 * granule + 4096)
        .unwrap();
    storage.write(&across, &data).unwrap();
    let mut back = vec![0; data.len()];
    storage.read(&across, &mut back).unwrap();
    assert_eq!(back, data);
    let unmapped = range.sub_range(5 * granule, 5 * granule + 64).unwrap();
    assert!(
        storage.write(&unmapped, &[1; 64]).is_err(),
        "nothing is mapped there"
    );
    assert!(storage.map(&two).is_err(), "mapped twice");
    storage.unmap(&range.sub_range(granule, 2 * granule).unwrap());
    assert_eq!(storage.bytes_allocated(), 2 * granule, "unmapped at flush");
    storage.drain();
    assert_eq!(storage.bytes_allocated(), granule);
    storage.deallocate(range.id);
    storage.drain();
    assert_eq!(storage.bytes_allocated(), 0);
}

#[test]
fn the_default_layout_is_expandable_on_the_device() {
    let Some(storage) = device() else { return };
    if storage.granule().is_none() {
        eprintln!("skipped: the device has no virtual memory management");
        return;
    }
    let mut memory = MemoryManager::new(storage, MemoryConfig::default());
    assert!(matches!(
        memory.memory_report().dynamic[0].kind,
        PoolKind::Expandable { .. }
    ));
    let all: Vec<_> = (0..64u64)
        .map(|i| {
            let a = memory
                .reserve(300 * 1024 + i * 256, PageUpdate::Allow)
                .unwrap();
            memory.write(&a, 0, &[i as u8; 4096]).unwrap();
            (a, i)
        })
        .collect();
    assert_eq!(memory.bytes_reserved(), memory.bytes_allocated());
    let kept: Vec<_> = all.into_iter().filter(|(_, i)| i % 8 == 0).collect();
    memory.cleanup(Cleanup::Explicit);
    for (a, i) in &kept {
        assert_eq!(memory.read(a, 0, 4096).unwrap(), vec![*i as u8; 4096]);
    }
    drop(kept);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 0, "every granule unmapped");
}

#[test]
fn running_out_of_device_memory_is_typed() {
    let Some(mut storage) = device() else { return };
    let (_, total) = storage.device_memory().unwrap();
    match storage.allocate(total * 2) {
        Err(StorageError::OutOfMemory {
            requested,
            capacity,
            ..
        }) => {
            assert_eq!(requested, total * 2);
            assert_eq!(capacity, total);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // Still usable afterwards.
    let page = storage.allocate(4096).unwrap();
    storage.deallocate(page.id);
    storage.flush();
}

#[test]
fn memory_used_on_another_stream_waits_for_its_work() {
    let Some(owner) = device() else { return };
    let context = CudaStorage::context(0).unwrap();
    let mut other = CudaStorage::on_context(context).unwrap();
    let user = other
        .stream_name()
        .expect("a CUDA storage names its stream");
    let scratch = other.allocate(1 << 24).unwrap();
    let mut manager = MemoryManager::new(owner, MemoryConfig::default());
    let used = manager.reserve(1 << 20, PageUpdate::Allow).unwrap();
    manager.record_use(&used, user).unwrap();
    // Work queued on the other stream, then the last handle goes: the
    // memory waits for that work, whether or not it is done yet.
    for _ in 0..8 {
        other.copy(&scratch, &scratch).unwrap();
    }
    drop(used);
    manager.flush();
    // An explicit cleanup waits for it and gives everything back.
    manager.cleanup(Cleanup::Explicit);
    assert_eq!(manager.awaiting_users(), 0);
    assert_eq!(manager.bytes_in_use(), 0);
    assert!(manager.memory_report().driver.events_recorded >= 1);
    other.deallocate(scratch.id);
    other.flush();
}

#[test]
fn the_service_runs_on_the_device() {
    if device().is_none() {
        return;
    }
    let context = CudaStorage::context(0).unwrap();
    let factory_context = context.clone();
    let supervisor = Arc::new(Supervisor::new(
        ServiceConfig::default(),
        Box::new(move |_| {
            CudaStorage::on_context(factory_context.clone())
                .map(|s| Box::new(s) as Box<dyn DeviceStorage>)
        }),
    ));
    let threads: Vec<_> = (0..4u32)
        .map(|i| {
            let stream = supervisor.stream(StreamId(i % 2)).unwrap();
            std::thread::spawn(move || {
                for j in 0..50u8 {
                    let a = stream.reserve(64 * 1024 + u64::from(j) * 512).unwrap();
                    stream.write(&a, 0, &[j ^ i as u8; 256]).unwrap();
                    assert_eq!(stream.read(&a, 0, 256).unwrap(), vec![j ^ i as u8; 256]);
                    let pinned = stream.resolve(&a).unwrap();
                    assert_ne!(pinned.addr(), 0);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    for report in supervisor.shutdown() {
        assert_eq!(report.unwrap().bytes_left, 0);
    }
}

#[test]
fn pages_go_back_in_stream_order_without_a_wait() {
    let Some(storage) = device() else { return };
    gives_a_page_back_behind_an_event(storage);
}

/// A storage on the legacy default stream (PyTorch's default stream,
/// through `streamalloc-torch`) lets memory go as one on its own stream
/// does.
#[test]
fn the_default_stream_gives_memory_back_without_a_wait() {
    let Ok(context) = CudaStorage::context(0) else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    gives_a_page_back_behind_an_event(CudaStorage::on_default_stream(context).unwrap());
}

/// A page freed behind a long device copy queued on `storage`'s stream
/// goes back without a wait: an event recorded on the stream, the bytes
/// counted until it has passed.
fn gives_a_page_back_behind_an_event(mut storage: CudaStorage) {
    let big = 512 << 20;
    let (a, b) = (
        storage.allocate(big).unwrap(),
        storage.allocate(big).unwrap(),
    );
    let page = storage.allocate(1 << 20).unwrap();
    for _ in 0..8 {
        storage.copy(&a, &b).unwrap();
    }
    let waits = storage.driver_ops().stream_waits;
    storage.deallocate(page.id);
    storage.flush();
    assert_eq!(storage.driver_ops().stream_waits, waits, "the flush waited");
    assert_eq!(storage.driver_ops().events_recorded, 1);
    storage.synchronize().unwrap();
    storage.flush();
    assert_eq!(
        storage.bytes_allocated(),
        2 * big,
        "freed once the event passed"
    );
    assert_eq!(storage.driver_ops().pages_freed, 1);
}

/// Handles handed between two streams' storages of one device
/// (`storage/loose.rs`): the giver unmaps its spares without releasing
/// them, the asker maps them (no handle created) and its bytes round-trip
/// through them; what it does not map it releases.
#[test]
fn handles_handed_over_map_on_another_stream() {
    let Ok(context) = CudaStorage::context(0) else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    let (Ok(giver), Ok(asker)) = (
        CudaStorage::on_context(context.clone()),
        CudaStorage::on_context(context.clone()),
    ) else {
        eprintln!("skipped: no CUDA stream");
        return;
    };
    let Some(granule) = giver.granule() else {
        eprintln!("skipped: the device has no virtual memory management");
        return;
    };
    let budget = Arc::new(DeviceBudget::new(u64::MAX));
    let mut giver = BudgetedStorage::new(giver, budget.clone());
    let mut asker = BudgetedStorage::new(asker, budget.clone());
    let from = giver.reserve_range(16 * granule).unwrap();
    giver.map(&from.sub_range(0, 4 * granule).unwrap()).unwrap();
    giver.hold_spares(true);
    giver.unmap(&from.sub_range(granule, 3 * granule).unwrap());
    // Its fence passes once the stream is done: kept then as spares.
    giver.flush();
    context.synchronize().unwrap();
    giver.flush();
    giver.pass_spares_on();
    giver.hold_spares(false);
    assert_eq!(giver.driver_ops().handles_handed_over, 2);
    assert_eq!(giver.driver_ops().handles_released, 0);
    assert_eq!(budget.bytes_passed_on(), 2 * granule);
    asker.take_passed_on();
    let to = asker.reserve_range(16 * granule).unwrap();
    asker.map(&to.sub_range(0, granule).unwrap()).unwrap();
    let ops = asker.driver_ops();
    assert_eq!((ops.handles_adopted, ops.handles_created), (1, 0));
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 29 % 251) as u8).collect();
    let bytes = to.sub_range(granule - 4096, granule).unwrap();
    asker.write(&bytes, &data).unwrap();
    let mut back = vec![0; data.len()];
    asker.read(&bytes, &mut back).unwrap();
    assert_eq!(back, data);
    asker.release_spares();
    assert_eq!(asker.driver_ops().handles_released, 1, "the one not mapped");
    assert_eq!(budget.held(), 3 * granule);
}

/// One stream serves another past the headroom from its room on the
/// device: the borrower writes and reads the loan through its own handle,
/// each loan is an event and a queued stream wait (no host wait), and a
/// loan a compaction moves keeps its bytes.
#[test]
fn a_stream_lends_to_another_on_the_device() {
    use streamalloc::memory::RelocationReason;
    use streamalloc::service::Headroom;
    if device().is_none() {
        return;
    }
    let context = CudaStorage::context(0).unwrap();
    let factory_context = context.clone();
    let supervisor = Supervisor::new(
        ServiceConfig {
            headroom: Some(Headroom::default()),
            ..ServiceConfig::default()
        },
        Box::new(move |_| {
            CudaStorage::on_context(factory_context.clone())
                .map(|s| Box::new(s) as Box<dyn DeviceStorage>)
        }),
    );
    let (a, b) = (
        supervisor.stream(StreamId(0)).unwrap(),
        supervisor.stream(StreamId(1)).unwrap(),
    );
    drop(a.reserve_many(&[1 << 20; 48]).unwrap());
    a.report().unwrap();
    let loan = b.reserve(40 << 20).unwrap();
    assert_eq!(loan.id().unwrap().stream, StreamId(0), "lent by a");
    b.write(&loan, 4096, &[0x5A; 512]).unwrap();
    assert_eq!(b.read(&loan, 4096, 512).unwrap(), vec![0x5A; 512]);
    let ops = a.report().unwrap().driver;
    assert!(ops.stream_orders >= 1, "{ops:?}");
    drop(loan);
    for report in supervisor.shutdown() {
        assert_eq!(report.unwrap().bytes_left, 0);
    }

    // The manager alone: a loan moves, its bytes with it.
    let mut manager = MemoryManager::new(
        CudaStorage::on_context(context.clone()).unwrap(),
        MemoryConfig::default(),
    );
    // The borrower's stream lives as long as its work may: to the end.
    let borrower = CudaStorage::on_context(context).unwrap();
    let user = borrower
        .stream_name()
        .expect("a CUDA storage names its stream");
    let holes: Vec<_> = (0..6)
        .map(|_| manager.reserve(1 << 20, PageUpdate::Allow).unwrap())
        .collect();
    let lent = manager.reserve(1 << 20, PageUpdate::Allow).unwrap();
    manager.write(&lent, 0, &[0xC3; 256]).unwrap();
    manager.lend_to(&lent, user, 1).unwrap();
    drop(holes);
    manager.relocate(RelocationReason::Compaction).unwrap();
    assert_eq!(manager.read(&lent, 0, 256).unwrap(), vec![0xC3; 256]);
    drop(lent);
    manager.cleanup(Cleanup::Explicit);
    assert_eq!(manager.bytes_in_use(), 0);
    drop(manager);
    drop(borrower);
}
