//! Memory side by side: each trace replayed through streamalloc's service
//! (each preset, with and without its headroom and settle policies) and
//! through CubeCL's `MemoryManagement` (each of its presets, one per trace
//! stream as CubeCL keeps one per stream, driven as its server drives it).
//! Both count bytes only (no device memory is touched).
//!
//! `cargo run --release --bin memory -- TRACE...` (any format `streamalloc
//! replay` reads); prints, per trace and contender, peak reserved / peak
//! live and reserved / live once the load has fallen (the trace's end, no
//! explicit cleanup). A trace of several devices gets rows per device:
//! each device is its own memory.

use cubecl_server::memory_management::{
    ErrorGraph, MemoryConfiguration as CubeConfig, PageUpdate as CubeUpdate,
};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use streamalloc::memory::{
    Bytes, DeviceProperties, MemoryConfig, MemoryConfiguration, MemoryManager, PageUpdate,
};
use streamalloc::service::{ServiceConfig, Supervisor};
use streamalloc::storage::{
    DEFAULT_GRANULE, DeviceStorage, DriverCosts, DriverOps, DriverReport, VirtualStorage,
};
use streamalloc::trace::{TraceAction, TraceEvent, read_trace};
use streamalloc_vs_cubecl::replays::MAX_PAGE;
use streamalloc_vs_cubecl::{CountedCopies, CountingStorage, cubecl_with};

struct Figures {
    peak_live: u64,
    peak_reserved: u64,
    end_live: u64,
    end_reserved: u64,
    failures: u64,
    /// What the device's driver would be asked, priced with the H200's
    /// costs (`None` for the floors, which are no allocator).
    driver: Option<DriverReport>,
}

/// The driver figures of `ops` over `events` events, with at most
/// `peak_granules` mapped at once.
fn priced(ops: DriverOps, peak_granules: u64, events: &[TraceEvent]) -> Option<DriverReport> {
    let events = events.len() as u64;
    Some(DriverReport::new(
        ops,
        peak_granules,
        events,
        &DriverCosts::H200,
    ))
}

fn ratio(reserved: u64, live: u64) -> String {
    if live == 0 {
        "-".into()
    } else {
        format!("{:.3}", reserved as f64 / live as f64)
    }
}

fn cubecl(events: &[TraceEvent], config: CubeConfig) -> Figures {
    let mut managers = HashMap::new();
    let mut live = HashMap::new();
    let mut failures = ErrorGraph::default();
    let (mut live_bytes, mut peak_live, mut peak_reserved, mut failed) = (0u64, 0u64, 0u64, 0u64);
    for event in events {
        match event.action {
            TraceAction::Alloc => {
                if let Some((size, _)) = live.remove(&(event.device, event.id)) {
                    live_bytes -= size;
                }
                if event.size == 0 {
                    continue;
                }
                let memory = managers
                    .entry((event.device, event.stream))
                    .or_insert_with(|| {
                        cubecl_with(CountingStorage::default(), config.clone(), MAX_PAGE)
                    });
                if let Some(reason) = memory.relocation_need().reason(|| memory.bytes_allocated()) {
                    memory.relocate(&mut CountedCopies, reason, &mut failures);
                }
                match memory.reserve(event.size, CubeUpdate::Allow, &mut failures) {
                    Ok(handle) => {
                        live.insert((event.device, event.id), (event.size, handle));
                        live_bytes += event.size;
                        peak_live = peak_live.max(live_bytes);
                    }
                    Err(_) => failed += 1,
                }
            }
            TraceAction::Free => {
                if let Some((size, _)) = live.remove(&(event.device, event.id)) {
                    live_bytes -= size;
                }
            }
            // Recorded failures and the recording allocator's own segments
            // drive nothing here.
            _ => {}
        }
        let reserved = managers
            .values()
            .map(|m| m.bytes_allocated())
            .fold(0, u64::saturating_add);
        peak_reserved = peak_reserved.max(reserved);
    }
    let ops = managers
        .values_mut()
        .fold(DriverOps::default(), |ops, m| ops.combine(m.storage().ops));
    Figures {
        peak_live,
        peak_reserved,
        end_live: live_bytes,
        end_reserved: managers
            .values()
            .map(|m| m.bytes_allocated())
            .fold(0, u64::saturating_add),
        failures: failed,
        driver: priced(ops, 0, events),
    }
}

/// The least any allocator that maps `granule`s per trace stream could
/// hold: each stream's live bytes rounded up to whole granules. Two
/// floors: `at_calls` counts each stream as it was at its last
/// reservation (a manager alone, CubeCL's or ours, acts only when
/// called, so what its stream freed since is still held), otherwise
/// every stream as it is now (a service that acts between calls).
fn granule_floor(events: &[TraceEvent], granule: u64, at_calls: bool) -> Figures {
    let whole = |bytes: u64| bytes.div_ceil(granule) * granule;
    let mut live = HashMap::new();
    let mut per_stream: HashMap<(u32, u64), u64> = HashMap::new();
    let mut held: HashMap<(u32, u64), u64> = HashMap::new();
    let (mut live_bytes, mut peak_live, mut peak_floor) = (0u64, 0u64, 0u64);
    let mut floor = 0u64;
    for event in events {
        let key = (event.device, event.stream);
        let freed = match event.action {
            TraceAction::Alloc | TraceAction::Free => live.remove(&(event.device, event.id)),
            _ => continue,
        };
        if let Some((stream, size)) = freed {
            live_bytes -= size;
            *per_stream.entry(stream).or_default() -= size;
        }
        let called = event.action == TraceAction::Alloc && event.size > 0;
        if called {
            live.insert((event.device, event.id), (key, event.size));
            live_bytes += event.size;
            peak_live = peak_live.max(live_bytes);
            *per_stream.entry(key).or_default() += event.size;
        }
        // A stream's holding is rounded again where it may have moved: at
        // its calls, and (unless only calls count) at its frees.
        let mut round = |stream| {
            let now = whole(per_stream.get(&stream).copied().unwrap_or(0));
            floor = floor + now - held.insert(stream, now).unwrap_or(0);
        };
        if let Some((stream, _)) = freed.filter(|_| !at_calls) {
            round(stream);
        }
        if called {
            round(key);
        }
        peak_floor = peak_floor.max(floor);
    }
    Figures {
        peak_live,
        peak_reserved: peak_floor,
        end_live: live_bytes,
        end_reserved: per_stream
            .values()
            .map(|&bytes| whole(bytes))
            .fold(0, u64::saturating_add),
        failures: 0,
        driver: None,
    }
}

/// Our manager alone, one per trace stream (as CubeCL's side), driven the
/// same way: every reservation with `PageUpdate::Allow`, no policies.
fn manager_alone(events: &[TraceEvent], pools: MemoryConfiguration) -> Figures {
    let mut managers = HashMap::new();
    let mut live = HashMap::new();
    let (mut live_bytes, mut peak_live, mut peak_reserved, mut failed) = (0u64, 0u64, 0u64, 0u64);
    let mut reserved = HashMap::new();
    let mut total_reserved = 0u64;
    let mut mapped = HashMap::new();
    let (mut total_mapped, mut peak_mapped) = (0u64, 0u64);
    for event in events {
        let key = (event.device, event.stream);
        match event.action {
            TraceAction::Alloc => {
                if let Some((size, _)) = live.remove(&(event.device, event.id)) {
                    live_bytes -= size;
                }
                if event.size == 0 {
                    continue;
                }
                let memory = managers.entry(key).or_insert_with(|| {
                    MemoryManager::new(
                        VirtualStorage::new(),
                        MemoryConfig {
                            device: DeviceProperties::new(MAX_PAGE, 256),
                            ..MemoryConfig::with_pools(pools.clone())
                        },
                    )
                });
                match memory.reserve(event.size, PageUpdate::Allow) {
                    Ok(handle) => {
                        live.insert((event.device, event.id), (event.size, handle));
                        live_bytes += event.size;
                        peak_live = peak_live.max(live_bytes);
                    }
                    Err(_) => failed += 1,
                }
                let now = memory.bytes_reserved();
                let before = reserved.insert(key, now).unwrap_or(0);
                total_reserved = total_reserved + now - before;
                let granules = memory.storage().driver_ops().granules_mapped();
                let before = mapped.insert(key, granules).unwrap_or(0);
                total_mapped = total_mapped + granules - before;
                peak_mapped = peak_mapped.max(total_mapped);
            }
            TraceAction::Free => {
                if let Some((size, _)) = live.remove(&(event.device, event.id)) {
                    live_bytes -= size;
                }
            }
            _ => {}
        }
        peak_reserved = peak_reserved.max(total_reserved);
    }
    for memory in managers.values_mut() {
        memory.process_releases();
    }
    let ops = managers.values_mut().fold(DriverOps::default(), |ops, m| {
        ops.combine(m.storage().driver_ops())
    });
    Figures {
        peak_live,
        peak_reserved,
        end_live: live_bytes,
        end_reserved: managers
            .values()
            .map(|m| m.bytes_reserved())
            .fold(0, u64::saturating_add),
        failures: failed,
        driver: priced(ops, peak_mapped, events),
    }
}

fn ours(events: &[TraceEvent], pools: MemoryConfiguration, policies: bool) -> Figures {
    let defaults = ServiceConfig::default();
    let memory = MemoryConfig {
        device: DeviceProperties::new(MAX_PAGE, 256),
        ..MemoryConfig::with_pools(pools)
    };
    let supervisor = Supervisor::virtual_device(ServiceConfig {
        headroom: policies.then(|| streamalloc::service::Headroom::for_memory(&memory)),
        memory,
        // On the trace's clock, as the CLI replays: the same figures on
        // every run.
        clock: streamalloc::clock::ManualClock::shared(),
        settle: if policies { defaults.settle } else { None },
        ..defaults
    });
    let report = streamalloc::replay::replay(events, &supervisor, None, usize::MAX, |_| {})
        .expect("the replay runs");
    supervisor.shutdown();
    Figures {
        peak_live: report.peak_live_bytes,
        peak_reserved: report.peak_reserved_bytes,
        end_live: report.settled_live_bytes,
        end_reserved: report.settled_reserved_bytes,
        failures: report.failures,
        driver: Some(report.driver),
    }
}

fn main() {
    let paths: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if paths.is_empty() {
        eprintln!("usage: memory TRACE...");
        std::process::exit(2);
    }
    println!(
        "| trace | allocator | preset | peak live | peak reserved | peak ratio | live after the fall | reserved after | ratio after | failures | driver us/event (H200) | beyond the peak once | granules mapped / peak | stream waits |"
    );
    println!(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for path in paths {
        let events = read_trace(&path, None).unwrap_or_else(|err| {
            eprintln!("{}: {err}", path.display());
            std::process::exit(1);
        });
        let file = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        // Each device of a trace is its own memory (a PyTorch snapshot of
        // two GPUs): a ratio of the devices' summed peaks would mix one
        // device's peak with what another held at its last call.
        let mut devices: BTreeMap<u32, Vec<TraceEvent>> = BTreeMap::new();
        for event in events {
            devices.entry(event.device).or_default().push(event);
        }
        let several = devices.len() > 1;
        for (device, events) in devices {
            let name = if several {
                format!("{file} (device {device})")
            } else {
                file.clone()
            };
            print_rows(&name, &events);
        }
    }
}

/// Every contender's row for one device's events.
fn print_rows(name: &str, events: &[TraceEvent]) {
    use MemoryConfiguration::{Adaptive, ExclusivePages, Expandable};
    const SERVICE: &str = "streamalloc";
    const ALONE: &str = "streamalloc manager alone";
    const BARE: &str = "streamalloc, no headroom/settle";
    const CUBECL: &str = "CubeCL 0.11.3";
    const NOW: &str = "granule floor (2 MiB), each stream now";
    const AT_CALLS: &str = "granule floor (2 MiB), each stream at its last call";
    let rows: Vec<(&str, &str, Figures)> = vec![
        (SERVICE, "expandable", ours(events, Expandable, true)),
        (ALONE, "expandable", manager_alone(events, Expandable)),
        (ALONE, "adaptive", manager_alone(events, Adaptive)),
        (SERVICE, "adaptive", ours(events, Adaptive, true)),
        (SERVICE, "exclusive", ours(events, ExclusivePages, true)),
        (BARE, "expandable", ours(events, Expandable, false)),
        (BARE, "adaptive", ours(events, Adaptive, false)),
        (BARE, "exclusive", ours(events, ExclusivePages, false)),
        (CUBECL, "Adaptive", cubecl(events, CubeConfig::Adaptive)),
        (NOW, "-", granule_floor(events, DEFAULT_GRANULE, false)),
        (AT_CALLS, "-", granule_floor(events, DEFAULT_GRANULE, true)),
        (
            CUBECL,
            "ExclusivePages",
            cubecl(events, CubeConfig::ExclusivePages),
        ),
    ];
    for (allocator, preset, f) in rows {
        let driver = match &f.driver {
            Some(d) => format!(
                "{:.2} | {:.2} | {} | {}",
                d.modeled_us_per_event,
                d.beyond_peak_us_per_event,
                if d.peak_granules_mapped == 0 {
                    "-".into()
                } else {
                    format!("{:.2}", d.mapped_over_peak)
                },
                d.stream_waits
            ),
            None => "- | - | - | -".into(),
        };
        println!(
            "| {name} | {allocator} | {preset} | {} | {} | {} | {} | {} | {} | {} | {driver} |",
            Bytes(f.peak_live),
            Bytes(f.peak_reserved),
            ratio(f.peak_reserved, f.peak_live),
            Bytes(f.end_live),
            Bytes(f.end_reserved),
            ratio(f.end_reserved, f.end_live),
            f.failures
        );
    }
}
