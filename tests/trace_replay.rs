//! Traces in each format (fixtures the tests write), the replay report's
//! fields, malformed input, the recorder, and the CLI end to end.

use std::collections::BTreeMap;
use std::process::Command;
use streamalloc::clock::ManualClock;
use streamalloc::memory::StreamId;
use streamalloc::replay::{Replayer, replay};
use streamalloc::service::{ServiceConfig, Supervisor};
use streamalloc::trace::{
    TraceAction, TraceError, TraceEvent, TraceFormat, TraceRecorder, read_jsonl, read_rmm_csv,
    read_torch_snapshot, read_trace, write_jsonl, write_rmm_csv,
};

mod common;
use common::MIB;

/// A generated RMM log: two streams, pointers reused after their free, one
/// free of a pointer never allocated, one recorded failure.
fn rmm_csv() -> String {
    let mut lines = vec!["Thread,Time,Action,Pointer,Size,Stream".to_string()];
    let mut t = 0;
    for round in 0..20u64 {
        for (stream, base) in [(0x1u64, 0x7f00_0000_0000u64), (0x2, 0x7e00_0000_0000)] {
            for i in 0..4u64 {
                t += 1;
                lines.push(format!(
                    "1,00:00:{:09.6},allocate,{:#x},{},{:#x}",
                    t as f64 / 1e6,
                    base + i * 0x100_0000,
                    (i + 1 + round % 3) * MIB,
                    stream
                ));
            }
            for i in 0..4u64 {
                t += 1;
                lines.push(format!(
                    "1,00:00:{:09.6},free,{:#x},{},{:#x}",
                    t as f64 / 1e6,
                    base + i * 0x100_0000,
                    (i + 1 + round % 3) * MIB,
                    stream
                ));
            }
        }
    }
    lines.push("1,00:00:01.000000,free,0xdead,0,0x1".into());
    lines.push("1,00:00:01.000001,allocate failure,0x0,1073741824,0x1".into());
    lines.join("\n") + "\n"
}

#[test]
fn rmm_csv_reads_with_hex_pointers_and_reuse() {
    let events = read_rmm_csv(rmm_csv().as_bytes()).unwrap();
    assert_eq!(events.len(), 20 * 16 + 2);
    assert_eq!(events[0].action, TraceAction::Alloc);
    assert_eq!(events[0].id, 0x7f00_0000_0000);
    assert_eq!(events[0].stream, 1);
    assert_eq!(events.last().unwrap().action, TraceAction::AllocFailure);
    // Round trip through our writer.
    let mut out = Vec::new();
    write_rmm_csv(&events, &mut out).unwrap();
    let again = read_rmm_csv(&out[..]).unwrap();
    assert_eq!(
        again
            .iter()
            .map(|e| (e.id, e.size, e.action))
            .collect::<Vec<_>>(),
        events
            .iter()
            .map(|e| (e.id, e.size, e.action))
            .collect::<Vec<_>>()
    );
}

#[test]
fn malformed_lines_are_named() {
    let bad = "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.1,allocate,0x10,100,0x1\n1,00:00:00.2,explode,0x10,100,0x1\n";
    assert_eq!(
        read_rmm_csv(bad.as_bytes()).unwrap_err(),
        TraceError::Malformed {
            line: 3,
            message: "unknown action \"explode\" (allocate, allocate failure, free)".into()
        }
    );
    let short = "Thread,Time,Action,Pointer,Size,Stream\n1,2,allocate\n";
    assert!(matches!(
        read_rmm_csv(short.as_bytes()),
        Err(TraceError::Malformed { line: 2, .. })
    ));
    let size = "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.1,allocate,0x10,lots,0x1\n";
    assert!(
        read_rmm_csv(size.as_bytes())
            .unwrap_err()
            .to_string()
            .starts_with("line 2: bad size")
    );
    let json =
        "{\"time_ns\":0,\"stream\":0,\"action\":\"alloc\",\"id\":1,\"size\":10}\n{not json}\n";
    assert!(matches!(
        read_jsonl(json.as_bytes()),
        Err(TraceError::Malformed { line: 2, .. })
    ));
    assert!(matches!(
        read_torch_snapshot(b"not a pickle"),
        Err(TraceError::Invalid(_))
    ));
}

#[test]
fn jsonl_round_trips() {
    let events = read_rmm_csv(rmm_csv().as_bytes()).unwrap();
    let mut out = Vec::new();
    write_jsonl(&events, &mut out).unwrap();
    assert_eq!(read_jsonl(&out[..]).unwrap(), events);
    let first = String::from_utf8(out)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    assert!(first.contains("\"action\":\"alloc\""), "{first}");
}

/// A PyTorch snapshot shaped as `_dump_snapshot` writes it.
fn torch_pickle() -> Vec<u8> {
    use serde_pickle::{HashableValue as K, Value as V};
    let entry = |action: &str, addr: i64, size: i64, time: i64| {
        let mut d = BTreeMap::new();
        d.insert(K::String("action".into()), V::String(action.into()));
        d.insert(K::String("addr".into()), V::I64(addr));
        d.insert(K::String("size".into()), V::I64(size));
        d.insert(K::String("stream".into()), V::I64(0));
        d.insert(K::String("time_us".into()), V::I64(time));
        d.insert(K::String("frames".into()), V::List(vec![]));
        V::Dict(d)
    };
    let trace = vec![
        entry("segment_alloc", 0x1000_0000, 20 * MIB as i64, 0),
        entry("alloc", 0x1000_0000, 4 * MIB as i64, 1),
        entry("alloc", 0x1040_0000, 8 * MIB as i64, 2),
        entry("free_requested", 0x1000_0000, 4 * MIB as i64, 3),
        entry("free_completed", 0x1000_0000, 4 * MIB as i64, 4),
        entry("alloc", 0x1000_0000, 2 * MIB as i64, 5),
        entry("oom", 0, 64 * MIB as i64, 6),
        entry("free_completed", 0x1040_0000, 8 * MIB as i64, 7),
    ];
    let mut root = BTreeMap::new();
    root.insert(K::String("segments".into()), V::List(vec![]));
    root.insert(
        K::String("device_traces".into()),
        V::List(vec![V::List(trace)]),
    );
    serde_pickle::value_to_vec(&V::Dict(root), serde_pickle::SerOptions::new()).unwrap()
}

#[test]
fn torch_snapshots_read_allocations_and_segments() {
    let events = read_torch_snapshot(&torch_pickle()).unwrap();
    let actions: Vec<_> = events.iter().map(|e| e.action).collect();
    use TraceAction::*;
    assert_eq!(
        actions,
        vec![SegmentAlloc, Alloc, Alloc, Free, Alloc, AllocFailure, Free]
    );
    assert_eq!(events[2].size, 8 * MIB);
    assert_eq!(
        events[3].time_ns, 4000,
        "times count from the first event, a segment_alloc"
    );
}

fn supervisor(budget: Option<u64>) -> Supervisor {
    Supervisor::virtual_device(ServiceConfig {
        budget,
        idle_tick: None,
        ..ServiceConfig::default()
    })
}

#[test]
fn replay_reports_peaks_failures_and_unknown_frees() {
    let events = read_rmm_csv(rmm_csv().as_bytes()).unwrap();
    let report = replay(&events, &supervisor(None), None, 1, |_| {}).unwrap();
    assert_eq!(report.streams, 2);
    assert_eq!(report.allocations, 160);
    assert_eq!(report.frees, 160);
    assert_eq!(report.unknown_frees, 1);
    assert_eq!(report.trace_failures, 1);
    assert_eq!(report.failures, 0);
    // Peak live: the largest round of one stream (3+4+5+6 MiB); streams take turns.
    assert_eq!(report.peak_live_bytes, (3 + 4 + 5 + 6) * MIB);
    assert!(report.peak_reserved_bytes >= report.peak_live_bytes);
    assert!(report.reserved_over_live >= 1.0);
    assert!(report.ns_per_op > 0.0);
    assert_eq!(report.fits, None);
}

#[test]
fn replay_says_whether_a_trace_fits_a_budget() {
    let events = read_rmm_csv(rmm_csv().as_bytes()).unwrap();
    let fits = replay(&events, &supervisor(Some(256 * MIB)), None, 1, |_| {}).unwrap();
    assert_eq!(fits.fits, Some(true));
    let tight = replay(&events, &supervisor(Some(16 * MIB)), None, 1, |_| {}).unwrap();
    assert_eq!(tight.fits, Some(false));
    assert!(tight.failures > 0);
    assert!(tight.peak_reserved_bytes <= 16 * MIB);
}

#[test]
fn the_recorder_captures_a_running_service() {
    let recorder = TraceRecorder::in_memory();
    let device = Supervisor::host(ServiceConfig {
        recorder: Some(recorder.clone()),
        ..ServiceConfig::default()
    });
    let stream = device.stream(StreamId(2)).unwrap();
    let a = stream.reserve(1000).unwrap();
    let b = stream.reserve(2000).unwrap();
    drop(a);
    let _ = stream.reserve(0);
    stream.report().unwrap();
    let events = recorder.events();
    let actions: Vec<_> = events
        .iter()
        .map(|e| (e.action, e.size, e.stream))
        .collect();
    assert_eq!(
        actions,
        vec![
            (TraceAction::Alloc, 1000, 2),
            (TraceAction::Alloc, 2000, 2),
            (TraceAction::Free, 1000, 2),
            (TraceAction::AllocFailure, 0, 2),
        ]
    );
    // What was recorded replays.
    drop(b);
    let report = replay(&events, &supervisor(None), None, 1, |_| {}).unwrap();
    assert_eq!(report.allocations, 2);
}

fn cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_streamalloc"))
        .args(args)
        .output()
        .unwrap()
}

/// A scratch folder `name` of this test process holding the generated RMM
/// log as `trace.csv`: the folder and the log's path.
fn scratch_with_rmm_csv(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("streamalloc-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("trace.csv");
    std::fs::write(&csv, rmm_csv()).unwrap();
    (dir, csv)
}

#[test]
fn cli_replay_json_has_the_fields_for_all_three_formats() {
    let (dir, csv) = scratch_with_rmm_csv("cli");
    let pickle = dir.join("snapshot.pickle");
    std::fs::write(&pickle, torch_pickle()).unwrap();
    let jsonl = dir.join("trace.jsonl");
    let out = cli(&["convert", csv.to_str().unwrap(), jsonl.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        read_trace(&jsonl, Some(TraceFormat::Jsonl)).unwrap().len(),
        322
    );
    for file in [&csv, &pickle, &jsonl] {
        let out = cli(&["replay", file.to_str().unwrap(), "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for field in [
            "events",
            "failures",
            "peak_live_bytes",
            "peak_reserved_bytes",
            "reserved_over_live",
            "ns_per_op",
        ] {
            assert!(report.get(field).is_some(), "{field} missing from {report}");
        }
    }
    let svg = dir.join("replay.svg");
    let out = cli(&[
        "replay",
        csv.to_str().unwrap(),
        "--budget",
        "16M",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("does NOT fit"), "{text}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    // A malformed file is an error naming its line.
    let bad = dir.join("bad.csv");
    std::fs::write(
        &bad,
        "Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x1,10,0x0\n1,0,oops,0x1,10,0x0\n",
    )
    .unwrap();
    let out = cli(&["replay", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 3"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A replay's JSON names the settings it went by, defaults filled in: two
/// reports compare where these agree.
#[test]
fn cli_replay_json_names_its_settings() {
    let trace = "tests/fixtures/torch/expandable.pickle";
    let settings = |extra: &[&str]| {
        let out = cli(&[&["replay", trace, "--json", "--quiet"], extra].concat());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        report["settings"].clone()
    };
    let default = settings(&[]);
    assert_eq!(default["storage"], "virtual");
    assert_eq!(default["config"], "expandable");
    assert_eq!(default["headroom"], 0.01);
    assert_eq!(default["settle"], 1.04);
    assert_eq!(default["handle_share"], 64);
    assert_eq!(default["budget"], serde_json::Value::Null);
    let told = settings(&[
        "--handle-share",
        "16",
        "--config",
        "adaptive",
        "--headroom",
        "off",
        "--budget",
        "1G",
    ]);
    assert_eq!(told["config"], "adaptive");
    assert_eq!(told["headroom"], serde_json::Value::Null);
    assert_eq!(told["handle_share"], 16);
    assert_eq!(
        told["shared_handle_share"], 16,
        "streams that share a device take it too"
    );
    assert_eq!(told["budget"], 1u64 << 30);
}

#[test]
fn cli_simulate_reports_per_stream() {
    let out = cli(&[
        "simulate",
        "--requests",
        "8",
        "--max-prompt",
        "64",
        "--max-new-tokens",
        "4",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["requests"], 8);
    assert_eq!(report["streams"].as_array().unwrap().len(), 2);
    assert_eq!(report["settings"]["storage"], "host", "simulate's default");
    assert!(
        report["peak_reserved_bytes"].as_u64().unwrap()
            >= report["peak_live_bytes"].as_u64().unwrap()
    );
    let _unused: Option<TraceEvent> = None;
}

#[test]
fn cli_min_budget_brackets_the_smallest_budget_that_fits() {
    let (dir, csv) = scratch_with_rmm_csv("min");
    let path = csv.to_str().unwrap();
    let run = || {
        let out = cli(&["replay", path, "--min-budget", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let found = run();
    let bracket = &found["min_budget"];
    let fits = bracket["fits"].as_u64().unwrap();
    let does_not_fit = bracket["does_not_fit"].as_u64().unwrap();
    let precision = bracket["precision"].as_u64().unwrap();
    assert!(
        does_not_fit < fits && fits - does_not_fit <= precision,
        "{bracket}"
    );
    assert_eq!(precision, MIB, "1 MiB is larger than 0.1 % of this trace");
    // No budget under the peak live bytes can hold them.
    assert!(does_not_fit + 1 >= (3 + 4 + 5 + 6) * MIB, "{bracket}");
    assert_eq!(found["fits"], true);
    assert_eq!(found["budget"].as_u64(), Some(fits));
    // Each end checked by a plain replay: the one fits, the other does not.
    let at = |budget: u64| cli(&["replay", path, "--budget", &budget.to_string(), "--quiet"]);
    assert!(at(fits).status.success());
    assert_eq!(at(does_not_fit).status.code(), Some(3));
    // And the same answer again.
    assert_eq!(run()["min_budget"], *bracket);
    // Not with a budget of its own.
    assert!(
        !cli(&["replay", path, "--min-budget", "--budget", "1G"])
            .status
            .success()
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A device's events: sixteen allocations, then the last four freed, so
/// the load falls by a quarter and whole granules lie free at the top.
fn fallen_load(device: u32, first_id: u64) -> Vec<TraceEvent> {
    let event = |time_us: u64, action, id, size| TraceEvent {
        time_ns: time_us * 1_000,
        device,
        stream: 0,
        action,
        id,
        size,
        stack: 0,
    };
    let ids = first_id..first_id + 16;
    let mut events: Vec<TraceEvent> = ids
        .clone()
        .map(|id| event(id - first_id + 1, TraceAction::Alloc, id, 3 * MIB))
        .collect();
    events.extend(
        ids.skip(12)
            .map(|id| event(100 + id - first_id, TraceAction::Free, id, 3 * MIB)),
    );
    events
}

/// The replay of `events`, each device on a supervisor the CLI's way (a
/// manual clock, the default idle tick) but with no settle policy and no
/// scheduled compaction, so what gives the fallen load back is the idle
/// tick, whose timer compares two ticks' times; `shared_clock`: every device's supervisor on one clock,
/// as a caller who clones one config would.
fn replay_devices(events: &[TraceEvent], shared_clock: bool) -> streamalloc::replay::ReplayReport {
    let shared = ManualClock::shared();
    let mut replayer = Replayer::new(|_device| {
        let clock = if shared_clock {
            shared.clone()
        } else {
            ManualClock::shared()
        };
        Supervisor::virtual_device(ServiceConfig {
            clock,
            settle: None,
            compaction_threshold: None,
            ..ServiceConfig::default()
        })
    });
    for event in events {
        replayer.event(event).unwrap();
    }
    replayer.finish().unwrap()
}

#[test]
fn every_device_lets_its_load_fall_even_on_a_shared_clock() {
    // As a PyTorch snapshot lists them: one device's whole trace, then the
    // next one's, on the same span of time.
    let mut events = fallen_load(0, 0);
    events.extend(fallen_load(1, 1_000));
    let alone = replay_devices(&fallen_load(1, 1_000), false);
    assert_eq!(alone.settled_live_bytes, 36 * MIB);
    assert_eq!(
        alone.settled_reserved_bytes,
        36 * MIB,
        "the idle tick gives the free granules back"
    );
    for shared_clock in [false, true] {
        let report = replay_devices(&events, shared_clock);
        assert_eq!(report.devices.len(), 2);
        for device in &report.devices {
            assert_eq!(device.settled_live_bytes, 36 * MIB);
            assert_eq!(
                device.settled_reserved_bytes, alone.settled_reserved_bytes,
                "device {:?}, shared clock {shared_clock}",
                device.device
            );
        }
    }
}
