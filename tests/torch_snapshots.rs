//! PyTorch snapshots as Python's own pickle writes them
//! (`scripts/make_torch_fixtures.py`): shared frame lists through the memo,
//! recordings that start mid-run, two devices, expandable segments. The
//! expected figures come from the fixture generator's own books, not from
//! the reader under test.

use std::path::{Path, PathBuf};
use streamalloc::replay::Replayer;
use streamalloc::service::{ServiceConfig, Supervisor};
use streamalloc::trace::{JsonlReader, TraceAction, read_torch_trace};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch")
}

#[derive(Debug, serde::Deserialize)]
struct Expected {
    devices: Vec<ExpectedDevice>,
}

#[derive(Debug, serde::Deserialize)]
struct ExpectedDevice {
    device: u32,
    peak_live_bytes: u64,
    final_live_bytes: u64,
    live_at_start: u64,
    recorded_peak_reserved_bytes: u64,
    reserved_at_snapshot: u64,
}

fn load(name: &str) -> (streamalloc::trace::Trace, Expected) {
    let bytes = std::fs::read(fixtures().join(format!("{name}.pickle"))).unwrap();
    let expected: Expected = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join(format!("{name}.expected.json"))).unwrap(),
    )
    .unwrap();
    (read_torch_trace(&bytes).unwrap(), expected)
}

fn quiet_device(_device: u32) -> Supervisor {
    Supervisor::virtual_device(ServiceConfig {
        idle_tick: None,
        ..ServiceConfig::default()
    })
}

#[test]
fn every_fixture_replays_with_the_devices_own_live_bytes() {
    for name in ["mid_run", "two_devices", "expandable"] {
        let (trace, expected) = load(name);
        assert_eq!(trace.meta.source, "pytorch snapshot");
        assert_eq!(trace.meta.devices.len(), expected.devices.len(), "{name}");
        let mut replayer = Replayer::new(quiet_device);
        for event in &trace.events {
            replayer.event(event).unwrap();
        }
        let report = replayer.finish().unwrap();
        let per_device = if report.devices.is_empty() {
            vec![report.clone()]
        } else {
            report.devices.clone()
        };
        for (want, got) in expected.devices.iter().zip(&per_device) {
            assert_eq!(got.device, Some(want.device), "{name}");
            assert_eq!(
                got.peak_live_bytes, want.peak_live_bytes,
                "{name} peak live"
            );
            assert_eq!(
                got.settled_live_bytes, want.final_live_bytes,
                "{name} final live"
            );
            assert_eq!(
                got.recorded_peak_reserved_bytes,
                Some(want.recorded_peak_reserved_bytes),
                "{name}: PyTorch's own peak"
            );
            assert_eq!(
                got.unknown_frees, 0,
                "{name}: every free matches an allocation"
            );
            assert_eq!(got.failures, 0, "{name}");
            assert!(got.peak_reserved_bytes >= got.peak_live_bytes);
            let meta = &trace.meta.devices[want.device as usize];
            assert_eq!(meta.reserved_bytes, want.reserved_at_snapshot, "{name}");
        }
        // What was live before the recording is live from the start.
        for want in &expected.devices {
            let meta = &trace.meta.devices[want.device as usize];
            assert_eq!(
                meta.preexisting_bytes, want.live_at_start,
                "{name}: live at the start"
            );
            let head: u64 = trace
                .events
                .iter()
                .filter(|e| e.device == want.device)
                .take_while(|e| e.action != TraceAction::Free && e.time_ns == 0)
                .filter(|e| e.action == TraceAction::Alloc)
                .take(meta.preexisting_allocations as usize)
                .map(|e| e.size)
                .sum();
            assert_eq!(head, want.live_at_start, "{name}: allocated first");
        }
        if expected.devices.len() > 1 {
            assert_eq!(
                report.peak_live_bytes,
                expected
                    .devices
                    .iter()
                    .map(|d| d.peak_live_bytes)
                    .sum::<u64>()
            );
        }
    }
}

#[test]
fn settings_and_devices_survive_conversion() {
    let (trace, _) = load("two_devices");
    assert_eq!(
        trace
            .meta
            .allocator_settings
            .get("expandable_segments")
            .map(String::as_str),
        Some("False")
    );
    let mut jsonl = Vec::new();
    trace.write_jsonl(&mut jsonl).unwrap();
    let reader = JsonlReader::new(&jsonl[..]).unwrap();
    assert_eq!(reader.meta(), &trace.meta);
    let events: Vec<_> = reader.collect::<Result<_, _>>().unwrap();
    assert_eq!(events, trace.events);
    assert!(events.iter().any(|e| e.device == 1));
}

#[test]
fn expandable_segments_map_and_unmap() {
    let (trace, expected) = load("expandable");
    let mapped = trace
        .events
        .iter()
        .filter(|e| e.action == TraceAction::SegmentAlloc)
        .count();
    assert!(mapped > 1, "segment_map events are kept");
    assert!(
        trace
            .events
            .iter()
            .any(|e| e.action == TraceAction::SegmentFree),
        "segment_unmap events are kept"
    );
    // Walked back from the snapshot: what PyTorch held at the start, then
    // every map and unmap, ends at what the snapshot's segments hold.
    let mut held: i128 = 0;
    for event in &trace.events {
        match event.action {
            TraceAction::SegmentAlloc => held += i128::from(event.size),
            TraceAction::SegmentFree => held -= i128::from(event.size),
            _ => {}
        }
    }
    assert_eq!(held, i128::from(expected.devices[0].reserved_at_snapshot));
}
