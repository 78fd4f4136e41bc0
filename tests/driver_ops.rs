//! Every storage counts the driver operations a CUDA device would perform
//! for the same calls, and a replay prices them: host memory and no memory
//! at all count the same, a device meters its own peak, and the price is
//! the measured table's.

#![cfg(unix)]

use std::sync::Arc;
use streamalloc::clock::ManualClock;
use streamalloc::memory::{Cleanup, MemoryConfig, MemoryConfiguration, MemoryManager, PageUpdate};
use streamalloc::replay::Replayer;
use streamalloc::service::{ServiceConfig, Supervisor};
use streamalloc::storage::{
    BudgetedStorage, DeviceBudget, DeviceStorage, DriverCosts, DriverOps, FaultPlan, HOST_GRANULE,
    HostStorage, LimitedStorage, StagedMove, UserStream, VirtualStorage,
};
use streamalloc::trace::{TraceAction, TraceEvent};

mod common;
use common::{KIB, Lcg, MIB};

const G: u64 = HOST_GRANULE;

/// The same calls on any storage: a range mapped and unmapped in parts, a
/// page, copies, a slide and a staged move.
fn drive(storage: &mut dyn DeviceStorage) -> DriverOps {
    let range = storage.reserve_range(8 * G).unwrap();
    storage.map(&range.sub_range(0, 3 * G).unwrap()).unwrap();
    storage
        .map(&range.sub_range(4 * G, 6 * G).unwrap())
        .unwrap();
    let first = range.sub_range(0, 1024).unwrap();
    let second = range.sub_range(4 * G, 4 * G + 1024).unwrap();
    storage.copy(&first, &second).unwrap();
    // 3 KiB slid down by 1 KiB: three device copies of at most 1 KiB.
    let from = range.sub_range(2048, 5120).unwrap();
    let to = range.sub_range(1024, 4096).unwrap();
    storage.slide(&from, &to).unwrap();
    // Down 1 KiB more through 2 KiB apart: two pieces, two copies each.
    let staging = range.sub_range(4 * G + 4096, 4 * G + 6144).unwrap();
    let bottom = range.sub_range(0, 3072).unwrap();
    let staged = StagedMove {
        source: to,
        staging,
        target: bottom,
    };
    storage.stage(&staged).unwrap();
    storage.unmap(&range.sub_range(G, 3 * G).unwrap());
    storage.flush();
    // Another stream's work ordered after this one's (a loan): an event
    // recorded here and waited on there.
    storage.order_for(UserStream(7)).unwrap();
    let page = storage.allocate(5 * MIB).unwrap();
    storage.deallocate(page.id);
    storage.deallocate(range.id);
    storage.flush();
    // Nothing queued: no event.
    storage.flush();
    storage.driver_ops()
}

#[test]
fn host_and_virtual_storage_count_what_a_device_would_call() {
    let host = drive(&mut HostStorage::new());
    let virtual_ = drive(&mut VirtualStorage::new());
    assert_eq!(host, virtual_);
    // A storage that copies a staged move piece by piece (the trait's
    // default) counts what one overlapping move on host memory counts.
    let pieces = drive(&mut LimitedStorage::new(HostStorage::new(), u64::MAX));
    assert_eq!(pieces, host);
    let expected = DriverOps {
        handles_created: 5,
        handle_granules_created: 5,
        handles_released: 5,
        handle_granules_released: 5,
        handles_moved: 0,
        handle_granules_moved: 0,
        handles_adopted: 0,
        handle_granules_adopted: 0,
        handles_handed_over: 0,
        handle_granules_handed_over: 0,
        handle_granules_released_unmapped: 0,
        maps: 5,
        access_grants: 5,
        unmaps: 5,
        ranges_reserved: 1,
        ranges_freed: 1,
        pages_allocated: 1,
        page_granules_allocated: 3,
        pages_freed: 1,
        page_granules_freed: 3,
        // Each flush that gave back recorded an event and asked it once
        // (a storage with no lag: passed at once), and the order for
        // another stream recorded one more; none waited.
        events_recorded: 3,
        events_queried: 2,
        stream_waits: 0,
        stream_orders: 1,
        copies: 8,
        bytes_copied: 1024 + 3072 + 2 * 3072,
        peak_granules_mapped: 5,
    };
    assert_eq!(virtual_, expected);
    assert_eq!(virtual_.granules_mapped(), 0);
}

/// Granules 0..6 of a small range mapped, 1..4 given back while spares
/// are held, then 8..11 mapped: what the storage asked of the driver, and
/// the bytes it held after each step.
fn move_spares(storage: &mut dyn DeviceStorage) -> (DriverOps, Vec<u64>) {
    let range = storage.reserve_range(64 * G).unwrap();
    let granules = |first: u64, last: u64| range.sub_range(first * G, last * G).unwrap();
    storage.map(&granules(0, 6)).unwrap();
    let mut held = vec![storage.bytes_allocated()];
    storage.hold_spares(true);
    storage.unmap(&granules(1, 4));
    storage.flush();
    held.push(storage.bytes_allocated());
    storage.map(&granules(8, 10)).unwrap();
    held.push(storage.bytes_allocated());
    // One spare left, two granules to map: it moves, then one is created.
    storage.map(&granules(10, 12)).unwrap();
    held.push(storage.bytes_allocated());
    storage.hold_spares(false);
    storage.release_spares();
    held.push(storage.bytes_allocated());
    (storage.driver_ops(), held)
}

#[test]
fn a_map_moves_the_handles_held_as_spares_in_place_of_new_ones() {
    let (host, host_held) = move_spares(&mut HostStorage::new());
    let (virtual_, held) = move_spares(&mut VirtualStorage::new());
    assert_eq!((host, &host_held), (virtual_, &held));
    // Spares stay held until moved: the bytes never pass the 6 granules.
    assert_eq!(held, [6 * G, 6 * G, 6 * G, 7 * G, 7 * G]);
    assert_eq!(
        virtual_.handles_created, 7,
        "6, then 1 the spares could not cover"
    );
    assert_eq!(
        (virtual_.handles_moved, virtual_.handle_granules_moved),
        (3, 3)
    );
    assert_eq!(virtual_.handles_released, 0);
    assert_eq!(virtual_.maps, 10);
    assert_eq!(virtual_.unmaps, 3);
    // Moved spares were unmapped where they lay: 10 mapped, 3 of them
    // unmapped, 7 mapped now.
    assert_eq!(virtual_.granules_unmapped(), 3);
    assert_eq!(virtual_.granules_mapped(), 7);
    // A move saves a handle's create and release.
    let costs = DriverCosts::H200;
    let moved = costs.price(&virtual_);
    let fresh = DriverOps {
        handles_moved: 0,
        handle_granules_moved: 0,
        handles_created: 10,
        handle_granules_created: 10,
        handles_released: 3,
        handle_granules_released: 3,
        ..virtual_
    };
    assert_eq!(
        costs.price(&fresh) - moved,
        3 * (costs.handle_create_ns + costs.handle_release_ns)
    );
}

#[test]
fn a_budget_meters_spares_as_held_and_gets_them_back_before_it_refuses() {
    // 128 granules of a large range: handles of 2 granules.
    let budget = Arc::new(DeviceBudget::new(128 * G));
    let mut storage = BudgetedStorage::new(VirtualStorage::new(), budget.clone());
    let range = storage.reserve_range(1024 * G).unwrap();
    let granules = |first: u64, last: u64| range.sub_range(first * G, last * G).unwrap();
    storage.map(&granules(0, 128)).unwrap();
    storage.hold_spares(true);
    storage.unmap(&granules(0, 4));
    storage.flush();
    assert_eq!(budget.held(), 128 * G, "spares are memory held");
    // Two granules: one spare moves there, no grant needed.
    storage.map(&granules(200, 202)).unwrap();
    assert_eq!(storage.driver_ops().handles_moved, 1);
    assert_eq!(budget.held(), 128 * G);
    // One granule: no spare of its size. The budget is full, so the spare
    // left goes back first, then the granule is granted.
    storage.map(&granules(300, 301)).unwrap();
    assert_eq!(budget.held(), 127 * G);
    assert_eq!(budget.peak(), 128 * G);
    assert_eq!(budget.held(), storage.bytes_allocated());
    let ops = storage.driver_ops();
    assert_eq!((ops.handles_moved, ops.handles_released), (1, 1));
    // Full without spares: refused.
    assert!(storage.map(&granules(400, 402)).is_err());
    storage.hold_spares(false);
    storage.release_spares();
    assert_eq!(budget.held(), storage.bytes_allocated());
}

#[test]
fn a_manager_on_host_memory_counts_the_same_as_on_virtual_memory() {
    fn run<S: DeviceStorage>(storage: S) -> DriverOps {
        let mut memory = MemoryManager::new(
            storage,
            MemoryConfig::with_pools(MemoryConfiguration::Expandable),
        );
        let mut held = Vec::new();
        let mut random = Lcg(17);
        for step in 0..600u64 {
            let state = random.next();
            let size = 4 * KIB + (state >> 33) % (6 * MIB);
            held.push(memory.reserve(size, PageUpdate::Allow).unwrap());
            if step % 3 != 0 {
                let at = ((state >> 20) as usize) % held.len();
                drop(held.swap_remove(at));
            }
        }
        drop(held);
        memory.cleanup(Cleanup::Explicit);
        memory.memory_report().driver
    }
    let host = run(HostStorage::new());
    let virtual_ = run(VirtualStorage::new());
    assert_eq!(host, virtual_);
    assert!(host.handles_created > 0 && host.unmaps > 0, "{host:?}");
}

#[test]
fn a_device_meters_its_own_peak_of_granules_where_its_storages_meet() {
    let budget = Arc::new(DeviceBudget::new(u64::MAX));
    let mut a = BudgetedStorage::new(VirtualStorage::new(), budget.clone());
    let mut b = BudgetedStorage::new(VirtualStorage::new(), budget.clone());
    let ra = a.reserve_range(4 * G).unwrap();
    let rb = b.reserve_range(4 * G).unwrap();
    a.map(&ra.sub_range(0, 3 * G).unwrap()).unwrap();
    a.unmap(&ra.sub_range(0, 3 * G).unwrap());
    a.flush();
    b.map(&rb.sub_range(0, 2 * G).unwrap()).unwrap();
    // Each peaked on its own; together they never held more than 3.
    assert_eq!(a.driver_ops().peak_granules_mapped, 3);
    assert_eq!(b.driver_ops().peak_granules_mapped, 2);
    assert_eq!(budget.peak_granules_mapped(), 3);
    a.map(&ra.sub_range(0, 2 * G).unwrap()).unwrap();
    assert_eq!(budget.peak_granules_mapped(), 4);
    drop(b);
    a.map(&ra.sub_range(2 * G, 4 * G).unwrap()).unwrap();
    assert_eq!(
        budget.peak_granules_mapped(),
        4,
        "a dropped storage's granules went with it"
    );
}

fn ring(streams: u64) -> Vec<TraceEvent> {
    let mut events = Vec::new();
    let mut live = std::collections::VecDeque::new();
    let mut time = 0;
    for id in 0..3_000u64 {
        time += 20_000;
        let size = 64 * KIB + (id * 7919 % 97) * 64 * KIB;
        events.push(TraceEvent::new(
            time,
            id % streams,
            TraceAction::Alloc,
            id,
            size,
        ));
        live.push_back((id, size));
        if live.len() > 40 {
            let (gone, size) = live.pop_front().unwrap();
            time += 1_000;
            events.push(TraceEvent::new(
                time,
                gone % streams,
                TraceAction::Free,
                gone,
                size,
            ));
        }
    }
    events
}

fn replay(events: &[TraceEvent], costs: Option<DriverCosts>, host: bool) -> serde_json::Value {
    let mut replayer = Replayer::new(|_| {
        let config = ServiceConfig {
            clock: ManualClock::shared(),
            ..ServiceConfig::default()
        };
        if host {
            Supervisor::host(config)
        } else {
            Supervisor::virtual_device(config)
        }
    });
    if let Some(costs) = costs {
        replayer.price_with(costs);
    }
    for event in events {
        replayer.event(event).unwrap();
    }
    let mut json = serde_json::to_value(replayer.finish().unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("ns_per_op");
    json
}

#[test]
fn a_replay_prices_the_driver_per_device_and_per_stream_the_same_on_any_storage() {
    let events = ring(3);
    let report = replay(&events, None, false);
    assert_eq!(report, replay(&events, None, true), "host and virtual");
    let driver = &report["driver"];
    assert_eq!(driver["costs"], "NVIDIA H200");
    let ops: DriverOps = serde_json::from_value(driver["ops"].clone()).unwrap();
    assert_eq!(
        driver["modeled_ns"].as_u64().unwrap(),
        DriverCosts::H200.price(&ops)
    );
    assert!(ops.handle_granules_created >= driver["peak_granules_mapped"].as_u64().unwrap());
    let streams = report["per_stream"].as_array().unwrap();
    assert_eq!(streams.len(), 3);
    let events_per_stream: u64 = streams.iter().map(|s| s["events"].as_u64().unwrap()).sum();
    assert_eq!(events_per_stream, events.len() as u64);
    // Another GPU's table prices the same counts differently.
    let slow = DriverCosts {
        name: "twice the H200".into(),
        access_ns: 2 * DriverCosts::H200.access_ns,
        ..DriverCosts::H200
    };
    let priced = replay(&events, Some(slow.clone()), false);
    assert_eq!(priced["driver"]["ops"], report["driver"]["ops"]);
    assert_eq!(
        priced["driver"]["modeled_ns"].as_u64().unwrap(),
        slow.price(&ops)
    );
    assert!(
        priced["driver"]["modeled_ns"].as_u64().unwrap() > driver["modeled_ns"].as_u64().unwrap()
    );
}

/// A replay says apart what the driver was asked up to the trace's last
/// event and what giving memory back after the load fell added: a stream
/// that grows to 16 granules and then frees them keeps its peak mapped
/// through the trace, and unmaps it only once the load has fallen.
#[test]
fn a_replay_prices_the_give_back_after_the_load_fell_apart() {
    let mut events: Vec<TraceEvent> = (0..16u64)
        .map(|id| TraceEvent::new(id * 1_000, 0, TraceAction::Alloc, id, G))
        .collect();
    events.extend((0..16u64).map(|id| TraceEvent::new(20_000 + id, 0, TraceAction::Free, id, G)));
    let report = replay(&events, None, false);
    let ops =
        |key: &str| -> DriverOps { serde_json::from_value(report[key]["ops"].clone()).unwrap() };
    let (total, in_trace) = (ops("driver"), ops("driver_in_trace"));
    assert_eq!(
        in_trace.handle_granules_created, 16,
        "the peak, mapped once"
    );
    assert_eq!(in_trace.unmaps, 0, "kept mapped through the trace");
    assert_eq!(total.handle_granules_created, 16, "nothing mapped after it");
    assert_eq!(
        total.handle_granules_released, 16,
        "all of it back once the load fell"
    );
    let ns = |key: &str| report[key]["modeled_ns"].as_u64().unwrap();
    assert_eq!(ns("driver_in_trace"), DriverCosts::H200.price(&in_trace));
    assert!(ns("driver") > ns("driver_in_trace"));
    // The same peak prices both: beyond it, the trace itself paid only
    // what mapping it once does not (its range's reservation).
    let peak = |key: &str| report[key]["peak_granules_mapped"].as_u64().unwrap();
    assert_eq!(peak("driver"), peak("driver_in_trace"));
    let beyond = |key: &str| report[key]["beyond_peak_us_per_event"].as_f64().unwrap();
    assert!(beyond("driver_in_trace") < beyond("driver"));
}

/// Found by pricing the driver: on this ring the settles and compactions
/// the ticks ask of three streams ran on their own threads at once, one
/// stream's move (a map) racing another's give-back (an unmap), and the
/// device's peak came out at 72 or 74 granules from run to run. Timer work
/// now waits for the tick's barrier, stream by stream.
#[test]
fn the_ticks_work_gives_one_device_peak_on_every_run_with_a_core_busy() {
    let events = ring(3);
    let first = replay(&events, None, false);
    // Idle first (the threads truly run at once), then with a core busy.
    for run in 2..=6 {
        assert_eq!(replay(&events, None, false), first, "replay {run} differs");
    }
    let busy = common::BusyCore::start();
    for run in 7..=10 {
        assert_eq!(replay(&events, None, false), first, "replay {run} differs");
    }
    drop(busy);
}

/// Two streams' storages of one device: `giver` maps 8 granules of a
/// small range (a handle each), gives 4 back while holding spares and
/// passes them on; `asker` adopts them and maps 6. The ops of each, and
/// the device's bytes after each step.
fn hand_over<S: DeviceStorage>(new: impl Fn() -> S) -> (DriverOps, DriverOps, Vec<u64>) {
    let budget = Arc::new(DeviceBudget::new(u64::MAX));
    let mut giver = BudgetedStorage::new(new(), budget.clone());
    let mut asker = BudgetedStorage::new(new(), budget.clone());
    let from = giver.reserve_range(64 * G).unwrap();
    let to = asker.reserve_range(64 * G).unwrap();
    giver.map(&from.sub_range(0, 8 * G).unwrap()).unwrap();
    let mut held = vec![budget.held()];
    giver.hold_spares(true);
    giver.unmap(&from.sub_range(2 * G, 6 * G).unwrap());
    giver.flush();
    giver.pass_spares_on();
    giver.hold_spares(false);
    held.push(budget.held());
    assert_eq!(giver.bytes_allocated(), 4 * G, "what it passed on left it");
    assert_eq!(budget.bytes_passed_on(), 4 * G, "and waits in the exchange");
    asker.take_passed_on();
    assert_eq!(budget.bytes_passed_on(), 0);
    assert_eq!(asker.bytes_spare(), 4 * G, "adopted: held, unmapped");
    held.push(budget.held());
    asker.map(&to.sub_range(0, 6 * G).unwrap()).unwrap();
    held.push(budget.held());
    assert_eq!(asker.bytes_allocated(), 6 * G);
    // Every granule is memory now: a copy across them is let through.
    let first = to.sub_range(0, 64).unwrap();
    let last = to.sub_range(5 * G, 5 * G + 64).unwrap();
    asker.copy(&first, &last).unwrap();
    asker.release_spares();
    held.push(budget.held());
    assert_eq!(
        budget.held(),
        giver.bytes_allocated() + asker.bytes_allocated()
    );
    assert_eq!(budget.peak_granules_mapped(), 10, "8, less 4, and 6");
    (giver.driver_ops(), asker.driver_ops(), held)
}

#[test]
fn handles_passed_on_are_mapped_by_another_stream_with_none_created_or_released() {
    let (giver, asker, held) = hand_over(VirtualStorage::new);
    let host = hand_over(HostStorage::new);
    assert_eq!((host.0, host.1, &host.2), (giver, asker, &held));
    // The device's bytes never move while handles change hands.
    assert_eq!(held, [8 * G, 8 * G, 8 * G, 10 * G, 10 * G]);
    assert_eq!((giver.handles_handed_over, giver.unmaps), (4, 4));
    assert_eq!(giver.handles_released, 0, "none released");
    assert_eq!((asker.handles_adopted, asker.handles_created), (4, 2));
    assert_eq!((asker.maps, asker.access_grants), (6, 6));
    assert_eq!(asker.handles_released, 0);
    assert_eq!((giver.granules_mapped(), asker.granules_mapped()), (4, 6));
    // What was mapped and is no more: the giver's four handed over, none
    // of the asker's.
    assert_eq!(
        (giver.granules_unmapped(), asker.granules_unmapped()),
        (4, 0)
    );
    // Against the giver releasing and the asker creating: a create and a
    // release saved a handle.
    let costs = DriverCosts::H200;
    let handed = costs.price(&giver) + costs.price(&asker);
    let fresh = costs.price(&DriverOps {
        handles_handed_over: 0,
        handle_granules_handed_over: 0,
        handles_released: 4,
        handle_granules_released: 4,
        ..giver
    }) + costs.price(&DriverOps {
        handles_adopted: 0,
        handle_granules_adopted: 0,
        handles_created: 6,
        handle_granules_created: 6,
        ..asker
    });
    assert_eq!(
        fresh - handed,
        4 * (costs.handle_create_ns + costs.handle_release_ns)
    );
}

#[test]
fn handles_passed_on_that_no_map_uses_are_released_once_and_metered_back() {
    let budget = Arc::new(DeviceBudget::new(u64::MAX));
    let mut giver = BudgetedStorage::new(VirtualStorage::new(), budget.clone());
    let range = giver.reserve_range(64 * G).unwrap();
    giver.map(&range.sub_range(0, 4 * G).unwrap()).unwrap();
    giver.hold_spares(true);
    giver.unmap(&range.sub_range(0, 4 * G).unwrap());
    giver.flush();
    giver.pass_spares_on();
    assert_eq!((budget.held(), budget.bytes_passed_on()), (4 * G, 4 * G));
    // The asker adopts them and releases them unused.
    let mut asker = BudgetedStorage::new(VirtualStorage::new(), budget.clone());
    asker.take_passed_on();
    asker.release_spares();
    let ops = asker.driver_ops();
    assert_eq!(
        (ops.handles_released, ops.unmaps),
        (4, 0),
        "never mapped here"
    );
    assert_eq!(ops.granules_mapped(), 0);
    assert_eq!(ops.granules_unmapped(), 0, "released, never mapped here");
    assert_eq!(budget.held(), 0);
    // Passed on and never taken: the storage that drops while they wait
    // takes them with it.
    giver.map(&range.sub_range(0, 2 * G).unwrap()).unwrap();
    giver.unmap(&range.sub_range(0, 2 * G).unwrap());
    giver.flush();
    giver.pass_spares_on();
    assert_eq!(budget.bytes_passed_on(), 2 * G);
    drop(asker);
    assert_eq!((budget.held(), budget.bytes_passed_on()), (0, 0));
}

#[test]
fn a_grant_refused_while_handles_wait_in_the_exchange_takes_them_first() {
    // A full budget, half of it in handles passed on and never taken (a
    // round that timed out before its asker's retry).
    let budget = Arc::new(DeviceBudget::new(8 * G));
    let mut giver = BudgetedStorage::new(VirtualStorage::new(), budget.clone());
    let range = giver.reserve_range(64 * G).unwrap();
    giver.map(&range.sub_range(0, 8 * G).unwrap()).unwrap();
    giver.hold_spares(true);
    giver.unmap(&range.sub_range(4 * G, 8 * G).unwrap());
    giver.flush();
    giver.pass_spares_on();
    assert_eq!((budget.held(), budget.bytes_passed_on()), (8 * G, 4 * G));
    // Another stream maps 4 granules: the budget has no room left, so
    // the waiting handles are what it maps; 2 more are refused, the
    // budget being full.
    let mut other = BudgetedStorage::new(VirtualStorage::new(), budget.clone());
    let mine = other.reserve_range(64 * G).unwrap();
    other.map(&mine.sub_range(0, 4 * G).unwrap()).unwrap();
    let ops = other.driver_ops();
    assert_eq!((ops.handles_adopted, ops.handles_created), (4, 0));
    assert_eq!(budget.bytes_passed_on(), 0);
    assert!(other.map(&mine.sub_range(4 * G, 6 * G).unwrap()).is_err());
    assert_eq!(budget.held(), 8 * G);
    assert!(budget.peak() <= budget.limit());
}

#[test]
fn a_refused_map_gives_the_budget_back_what_it_granted_for_it_and_no_more() {
    let budget = Arc::new(DeviceBudget::new(64 * G));
    let faulty = LimitedStorage::new(VirtualStorage::new(), u64::MAX)
        .with_faults(FaultPlan::none().fail_allocation(2));
    let mut storage = BudgetedStorage::new(faulty, budget.clone());
    let range = storage.reserve_range(64 * G).unwrap();
    let two = range.sub_range(0, 2 * G).unwrap();
    storage.map(&two).unwrap();
    storage.hold_spares(true);
    storage.unmap(&two);
    storage.flush();
    // Kept as spares, still held: mapping them again needs no grant. The
    // driver refuses it all the same.
    assert!(storage.map(&two).is_err());
    assert_eq!(budget.granted(), 2 * G, "nothing was granted for it");
    assert_eq!(budget.held(), storage.bytes_allocated());
    storage.release_spares();
    assert_eq!((budget.granted(), budget.held()), (0, 0));
}
