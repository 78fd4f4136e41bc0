//! Memory goes back in stream order: a flush lets what was given back go
//! behind a fence and never waits; granules mapped again before their
//! fence passed are taken back with no driver call; only a drain (explicit
//! cleanup, shutdown, the last try before running out) waits.

mod common;

use common::{Lcg, MIB};
use proptest::prelude::*;
use std::sync::Arc;
use streamalloc::memory::{Cleanup, MemoryConfig, MemoryConfiguration, MemoryManager, PageUpdate};
use streamalloc::storage::{
    BudgetedStorage, DeviceBudget, DeviceStorage, HOST_GRANULE, HostStorage, StorageError,
    VirtualStorage,
};

#[test]
fn granules_mapped_again_before_they_go_keep_their_memory_and_cost_no_call() {
    let g = HOST_GRANULE;
    let mut storage = HostStorage::new().with_reclaim_lag(1);
    let range = storage.reserve_range(4 * g).unwrap();
    let two = range.sub_range(0, 2 * g).unwrap();
    storage.map(&two).unwrap();
    let second = range.sub_range(g, 2 * g).unwrap();
    storage.write(&second, &[7; 64]).unwrap();
    // (A write from the host waits for its copy; nothing after does.)
    let waits = storage.driver_ops().stream_waits;
    storage.unmap(&second);
    storage.flush();
    let ops = storage.driver_ops();
    assert_eq!(ops.stream_waits, waits, "a flush never waits");
    assert_eq!(ops.events_recorded, 1);
    assert_eq!(
        storage.bytes_allocated(),
        2 * g,
        "still held behind its fence"
    );
    assert_eq!(storage.bytes_in_reclaim(), g);
    // Given back: the memory layer may not touch it.
    assert!(matches!(
        storage.write(&second, &[1]),
        Err(StorageError::Unmapped { .. })
    ));
    // Mapped again before its fence passed: taken back as it was.
    storage.map(&second).unwrap();
    assert_eq!(storage.driver_ops().maps, ops.maps, "no driver call");
    assert_eq!(storage.bytes_in_reclaim(), 0);
    let mut back = [0; 64];
    storage.read(&second, &mut back).unwrap();
    assert_eq!(back, [7; 64], "its bytes never left");
    let waits = storage.driver_ops().stream_waits;
    // Its old batch passes and leaves it alone.
    storage.flush();
    storage.flush();
    assert_eq!(storage.driver_ops().unmaps, 0);
    assert_eq!(storage.bytes_allocated(), 2 * g);
    // Given back again, it goes with its new batch, one flush later.
    storage.unmap(&second);
    storage.flush();
    assert_eq!(storage.bytes_allocated(), 2 * g);
    storage.flush();
    assert_eq!(storage.bytes_allocated(), g);
    assert_eq!(storage.driver_ops().unmaps, 1);
    assert_eq!(storage.driver_ops().stream_waits, waits);
}

#[test]
fn a_drain_waits_once_and_gives_everything_back() {
    let g = HOST_GRANULE;
    for mut storage in [
        Box::new(HostStorage::new().with_reclaim_lag(5)) as Box<dyn DeviceStorage>,
        Box::new(VirtualStorage::new().with_reclaim_lag(5)),
    ] {
        let range = storage.reserve_range(4 * g).unwrap();
        storage.map(&range).unwrap();
        storage.unmap(&range.sub_range(0, g).unwrap());
        storage.flush();
        storage.unmap(&range.sub_range(g, 3 * g).unwrap());
        let page = storage.allocate(MIB).unwrap();
        storage.deallocate(page.id);
        assert_eq!(storage.bytes_in_reclaim(), 3 * g + MIB);
        storage.drain();
        assert_eq!(storage.bytes_allocated(), g);
        assert_eq!(storage.bytes_in_reclaim(), 0);
        assert_eq!(storage.driver_ops().stream_waits, 1);
        // Nothing left: no wait.
        storage.drain();
        assert_eq!(storage.driver_ops().stream_waits, 1);
    }
}

#[test]
fn a_budget_waits_for_what_its_storage_gave_back_before_refusing() {
    let g = 2 * MIB;
    let budget = Arc::new(DeviceBudget::new(4 * g));
    let mut storage =
        BudgetedStorage::new(VirtualStorage::new().with_reclaim_lag(3), budget.clone());
    let a = storage.reserve_range(4 * g).unwrap();
    let b = storage.reserve_range(4 * g).unwrap();
    storage.map(&a).unwrap();
    storage.unmap(&a);
    storage.flush();
    assert_eq!(budget.granted(), 4 * g, "still held behind its fence");
    // The budget is spent on memory on its way back: the map waits for it
    // (its last try) rather than failing.
    storage.map(&b).unwrap();
    assert_eq!(budget.granted(), 4 * g);
    assert_eq!(storage.driver_ops().stream_waits, 1);
    // Taking back what is on its way costs the budget nothing more.
    storage.unmap(&b.sub_range(0, g).unwrap());
    storage.flush();
    storage.map(&b.sub_range(0, g).unwrap()).unwrap();
    assert_eq!(budget.granted(), 4 * g);
    assert_eq!(storage.driver_ops().stream_waits, 1);
}

#[test]
fn an_explicit_cleanup_returns_everything_and_a_reservation_never_waits() {
    let mut memory = MemoryManager::new(
        VirtualStorage::new().with_reclaim_lag(2),
        MemoryConfig::with_pools(MemoryConfiguration::Expandable),
    );
    let mut held = Vec::new();
    let mut random = Lcg(5);
    for step in 0..2_000u64 {
        let state = random.next();
        let size = 4096 + (state >> 33) % (24 * MIB);
        held.push(memory.reserve(size, PageUpdate::Allow).unwrap());
        if step % 3 != 0 {
            let at = ((state >> 20) as usize) % held.len();
            drop(held.swap_remove(at));
        }
        if step % 97 == 0 {
            memory.cleanup(Cleanup::Periodic);
        }
    }
    assert_eq!(
        memory.storage().driver_ops().stream_waits,
        0,
        "reserving, releasing and trimming never wait"
    );
    drop(held);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 0, "every granule gone");
    assert_eq!(memory.bytes_in_reclaim(), 0);
}

/// One step a memory layer may take on a range of granules.
#[derive(Debug, Clone)]
enum Step {
    /// Map granules `at..at + len` where all are unmapped to the layer.
    Map(u64, u64),
    /// Give back granules `at..at + len` where all are live.
    Unmap(u64, u64),
    Flush,
    Drain,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..16u64, 1..5u64).prop_map(|(at, len)| Step::Map(at, len)),
        4 => (0..16u64, 1..5u64).prop_map(|(at, len)| Step::Unmap(at, len)),
        3 => Just(Step::Flush),
        1 => Just(Step::Drain),
    ]
}

proptest! {
    /// Whatever the layer maps, gives back and maps again while the device
    /// runs `lag` flushes behind: a granule the layer holds is never
    /// unmapped (every access to it succeeds), a granule is unmapped at most
    /// once per time it was mapped, and the storage holds exactly what the
    /// layer holds plus what waits behind fences.
    #[test]
    fn no_granule_handed_out_is_unmapped_and_none_twice(
        lag in 0..4u64,
        steps in proptest::collection::vec(step(), 1..120),
    ) {
        let g = 2 * MIB;
        let mut storage = VirtualStorage::new().with_reclaim_lag(lag);
        let range = storage.reserve_range(20 * g).unwrap();
        let mut live = [false; 20];
        let mut drains = 0;
        // The model of the fences: each granule given back and not yet
        // gone, with the flush its fence passes at (`None`: not sealed).
        let mut pending: [Option<Option<u64>>; 20] = [None; 20];
        let mut flushes = 0;
        let run = |at: u64, len: u64| range.sub_range(at * g, (at + len) * g).unwrap();
        for step in steps {
            match step {
                Step::Map(at, len) => {
                    let free = (at..at + len).all(|i| !live[i as usize]);
                    let mapped = storage.map(&run(at, len));
                    prop_assert_eq!(mapped.is_ok(), free);
                    if free {
                        for i in at..at + len {
                            live[i as usize] = true;
                            pending[i as usize] = None;
                        }
                    }
                }
                Step::Unmap(at, len) => {
                    if (at..at + len).all(|i| live[i as usize]) {
                        storage.unmap(&run(at, len));
                        for i in at..at + len {
                            live[i as usize] = false;
                            pending[i as usize] = Some(None);
                        }
                    }
                }
                Step::Flush => {
                    storage.flush();
                    flushes += 1;
                    for waiting in pending.iter_mut().flatten() {
                        waiting.get_or_insert(flushes + lag);
                    }
                    for waiting in &mut pending {
                        if waiting.is_some_and(|due| due.is_some_and(|due| due <= flushes)) {
                            *waiting = None;
                        }
                    }
                }
                Step::Drain => {
                    drains += 1;
                    flushes += 1;
                    storage.drain();
                    pending = [None; 20];
                }
            }
            for (i, held) in live.iter().enumerate() {
                let granule = run(i as u64, 1);
                prop_assert_eq!(storage.copy(&granule, &granule).is_ok(), *held);
            }
            let held = live.iter().filter(|held| **held).count() as u64 * g;
            let waiting = pending.iter().filter(|p| p.is_some()).count() as u64 * g;
            // Nothing goes before its fence passed, everything once it has.
            prop_assert_eq!(storage.bytes_in_reclaim(), waiting);
            prop_assert_eq!(storage.bytes_allocated(), held + waiting);
            let ops = storage.driver_ops();
            prop_assert!(ops.unmaps <= ops.maps);
            prop_assert_eq!((ops.maps - ops.unmaps) * g, storage.bytes_allocated());
            prop_assert!(ops.stream_waits <= drains, "only a drain waits");
        }
        storage.drain();
        let held = live.iter().filter(|held| **held).count() as u64 * g;
        prop_assert_eq!(storage.bytes_allocated(), held);
        prop_assert_eq!(storage.bytes_in_reclaim(), 0);
    }
}

/// The replays of the torch fixtures on a device running behind its host:
/// nothing on the paths that reserve, release, trim, settle, serve the
/// headroom or give back waits for a stream (a replay has no explicit
/// cleanup, and its storages are dropped, not drained), nothing fails,
/// and the memory the lag holds is reported.
#[test]
fn replays_on_a_lagging_device_never_wait_for_a_stream() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/torch");
    for name in ["expandable", "mid_run", "two_devices"] {
        for lag in [0, 1, 3] {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_streamalloc"))
                .args(["replay", &format!("{fixtures}/{name}.pickle"), "--json"])
                .args(["--quiet", "--reclaim-lag", &lag.to_string()])
                .output()
                .unwrap();
            assert!(out.status.success(), "{name} at lag {lag}: {out:?}");
            let text = String::from_utf8(out.stdout).unwrap();
            let reports = text.lines().filter(|line| line.starts_with('{'));
            assert!(reports.clone().count() > 0, "{name}: no report");
            for line in reports {
                let report: serde_json::Value = serde_json::from_str(line).unwrap();
                assert_eq!(report["failures"], 0, "{name} at lag {lag}");
                assert_eq!(report["driver"]["stream_waits"], 0, "{name} at lag {lag}");
                let events = report["driver"]["ops"]["events_recorded"].as_u64().unwrap();
                assert!(events > 0, "{name}: memory went back behind fences");
            }
        }
    }
}

/// The placement and held-out corpora (small, freshly generated: seeds no
/// figure was tuned on) on a device running behind its host: nothing on
/// the paths that reserve, release, trim, settle, serve the headroom or
/// give back waits for a stream, and nothing fails. Generated with the
/// repository's scripts, so it needs `python3` (it says so and passes
/// where there is none).
#[test]
fn the_corpora_on_a_lagging_device_never_wait_for_a_stream() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("stream_ordered_corpora");
    let generated = [("placement", "3"), ("heldout", "303")]
        .iter()
        .all(|(kind, seed)| {
            std::process::Command::new("python3")
                .arg(format!("{root}/scripts/{kind}_corpus.py"))
                .arg(&dir)
                .args(["--seed", seed, "--events", "3000"])
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        });
    if !generated {
        eprintln!("skipped: no python3 to generate the corpora");
        return;
    }
    let mut traces: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "csv"))
        .collect();
    traces.sort();
    assert_eq!(
        traces.len(),
        13,
        "six placement families and seven held out"
    );
    let mut gave_back = 0;
    for trace in &traces {
        for lag in [0, 1, 3] {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_streamalloc"))
                .arg("replay")
                .arg(trace)
                .args(["--json", "--quiet", "--reclaim-lag", &lag.to_string()])
                .output()
                .unwrap();
            let name = trace.display();
            assert!(out.status.success(), "{name} at lag {lag}: {out:?}");
            let text = String::from_utf8(out.stdout).unwrap();
            let line = text.lines().find(|line| line.starts_with('{'));
            let report: serde_json::Value = serde_json::from_str(line.expect("a report")).unwrap();
            assert_eq!(report["failures"], 0, "{name} at lag {lag}");
            assert_eq!(report["driver"]["stream_waits"], 0, "{name} at lag {lag}");
            if report["driver"]["ops"]["events_recorded"].as_u64().unwrap() > 1 {
                gave_back += 1;
            }
        }
    }
    assert!(
        gave_back > 20,
        "memory went back behind fences on most traces"
    );
}
