//! PyTorch's memory snapshot (`torch.cuda.memory._dump_snapshot`): a pickle
//! of a dict with
//!
//! The long form: `docs/modules.md`, "`src/trace/torch.rs`".

use super::pickle::{self, Value};
use super::{DeviceMeta, Frame, Trace, TraceAction, TraceError, TraceEvent, TraceMeta};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The most devices a snapshot may name (a machine has a few GPUs; a file
/// that names thousands is not a recording of one).
const MAX_SNAPSHOT_DEVICES: usize = 1024;

/// Read a snapshot's events (every device, in order).
pub fn read_torch_snapshot(bytes: &[u8]) -> Result<Vec<TraceEvent>, TraceError> {
    read_torch_trace(bytes).map(|trace| trace.events)
}

/// Read a snapshot whole: its events, devices and allocator settings.
pub fn read_torch_trace(bytes: &[u8]) -> Result<Trace, TraceError> {
    let pickle = pickle::parse(bytes)
        .map_err(|err| TraceError::Invalid(format!("not a PyTorch snapshot pickle: {err}")))?;
    let root = pickle.root();
    if !root.is_dict() {
        return Err(TraceError::Invalid(
            "not a PyTorch snapshot: the pickle holds no dict".into(),
        ));
    }
    let traces = root.get("device_traces");
    let segments = root.get("segments");
    if traces.is_none() && segments.is_none() {
        return Err(TraceError::Invalid(
            "not a PyTorch snapshot: no device_traces and no segments".into(),
        ));
    }
    let traces: Vec<Value<'_>> = match traces {
        Some(traces) => traces
            .items()
            .ok_or_else(|| TraceError::Invalid("device_traces is not a list".into()))?
            .collect(),
        None => Vec::new(),
    };
    let segments = read_segments(segments)?;
    let start = traces
        .iter()
        .copied()
        .filter_map(Value::items)
        .flatten()
        .filter_map(|entry| entry.get("time_us").and_then(|t| t.as_u64()))
        .min()
        .unwrap_or(0);
    // The devices the snapshot names: each with a trace, and each that
    // holds segments. Only those: a segment of device 99,999,999 is one
    // device, not a hundred million empty ones.
    let mut devices: std::collections::BTreeSet<u32> = segments.keys().copied().collect();
    devices.extend((0..traces.len()).filter_map(|index| u32::try_from(index).ok()));
    if devices.len() > MAX_SNAPSHOT_DEVICES {
        return Err(TraceError::Invalid(format!(
            "the snapshot names {} devices; at most {MAX_SNAPSHOT_DEVICES} are read",
            devices.len()
        )));
    }
    let mut trace = Trace {
        meta: TraceMeta {
            source: "pytorch snapshot".into(),
            allocator_settings: settings(root.get("allocator_settings")),
            devices: Vec::new(),
            stacks: Vec::new(),
        },
        events: Vec::new(),
    };
    let mut stacks = Stacks::default();
    for device in devices {
        let entries = traces.get(device as usize).copied();
        let held = segments.get(&device).map_or(&[][..], Vec::as_slice);
        let (meta, events) = read_device(device, entries, held, start, &mut stacks)?;
        trace.meta.devices.push(meta);
        trace.events.extend(events);
    }
    trace.meta.stacks = stacks.list;
    Ok(trace)
}

/// Each distinct stack once (a snapshot repeats a few dozen stacks over
/// thousands of events).
#[derive(Default)]
struct Stacks {
    list: Vec<Vec<Frame>>,
    index: HashMap<Vec<Frame>, u32>,
}

impl Stacks {
    /// The stack an entry recorded, as an index from 1 (0: none).
    fn intern(&mut self, entry: Value<'_>) -> u32 {
        let Some(frames) = entry.get("frames").and_then(|f| f.items()) else {
            return 0;
        };
        let frames: Vec<Frame> = frames
            .filter(|frame| frame.is_dict())
            .map(|frame| Frame {
                name: text(frame.get("name")),
                filename: text(frame.get("filename")),
                line: frame.get("line").and_then(|l| l.as_u64()).unwrap_or(0),
            })
            .collect();
        if frames.is_empty() {
            return 0;
        }
        if let Some(&known) = self.index.get(&frames) {
            return known;
        }
        let Ok(id) = u32::try_from(self.list.len().saturating_add(1)) else {
            return 0;
        };
        self.list.push(frames.clone());
        self.index.insert(frames, id);
        id
    }
}

/// A string field, or empty.
fn text(value: Option<Value<'_>>) -> String {
    value.and_then(|v| v.as_str()).unwrap_or("").to_string()
}

/// One segment as the snapshot shows it.
struct Segment {
    total_size: u64,
    stream: u64,
    /// Active blocks: (address, size).
    active: Vec<(u64, u64)>,
}

fn read_segments(segments: Option<Value<'_>>) -> Result<BTreeMap<u32, Vec<Segment>>, TraceError> {
    let mut by_device: BTreeMap<u32, Vec<Segment>> = BTreeMap::new();
    let Some(segments) = segments else {
        return Ok(by_device);
    };
    let items = segments
        .items()
        .ok_or_else(|| TraceError::Invalid("segments is not a list".into()))?;
    for (index, segment) in items.enumerate() {
        let bad = |what: &str| TraceError::Invalid(format!("segments[{index}]: {what}"));
        if !segment.is_dict() {
            return Err(bad("not a dict"));
        }
        let device = segment.get("device").and_then(|d| d.as_u64()).unwrap_or(0);
        let device = u32::try_from(device).map_err(|_| bad("device out of range"))?;
        let total_size = segment
            .get("total_size")
            .and_then(|s| s.as_u64())
            .ok_or_else(|| bad("no total_size"))?;
        let mut active = Vec::new();
        if let Some(blocks) = segment.get("blocks").and_then(|b| b.items()) {
            for block in blocks {
                let state = block.get("state").and_then(|s| s.as_str()).unwrap_or("");
                if !state.starts_with("active") {
                    continue;
                }
                let (Some(addr), Some(size)) = (
                    block.get("address").and_then(|a| a.as_u64()),
                    block.get("size").and_then(|s| s.as_u64()),
                ) else {
                    return Err(bad("an active block without address or size"));
                };
                if size > total_size {
                    return Err(bad(&format!(
                        "an active block of {size} bytes in a segment of {total_size}"
                    )));
                }
                active.push((addr, size));
            }
            let held = active
                .iter()
                .fold(0u64, |sum, (_, size)| sum.saturating_add(*size));
            if held > total_size {
                return Err(bad(&format!(
                    "active blocks of {held} bytes in a segment of {total_size}"
                )));
            }
        }
        by_device.entry(device).or_default().push(Segment {
            total_size,
            stream: segment.get("stream").and_then(|s| s.as_u64()).unwrap_or(0),
            active,
        });
    }
    Ok(by_device)
}

fn settings(value: Option<Value<'_>>) -> BTreeMap<String, String> {
    value
        .and_then(|v| v.entries())
        .map(|entries| entries.map(|(k, v)| (k.display(), v.display())).collect())
        .unwrap_or_default()
}

/// One device's events, and what the snapshot says of it.
fn read_device<'a>(
    device: u32,
    entries: Option<Value<'a>>,
    segments: &[Segment],
    start: u64,
    stacks: &mut Stacks,
) -> Result<(DeviceMeta, Vec<TraceEvent>), TraceError> {
    let entries: Vec<Value<'a>> = match entries {
        Some(entries) => entries
            .items()
            .ok_or_else(|| TraceError::Invalid(format!("device_traces[{device}] is not a list")))?
            .collect(),
        None => Vec::new(),
    };
    let action_of = |entry: &Value<'a>| entry.get("action").and_then(|a| a.as_str());
    // Old snapshots have no free_completed: their free_requested frees.
    let completes = entries
        .iter()
        .any(|e| action_of(e) == Some("free_completed"));
    let mut events = Vec::with_capacity(entries.len());
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut preexisting: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    // Segment bytes taken (+) and given back (-) during the recording.
    let mut segment_change: i128 = 0;
    for (index, entry) in entries.iter().enumerate() {
        let malformed = |message: &str| TraceError::Malformed {
            line: index.saturating_add(1),
            message: format!("device_traces[{device}][{index}]: {message}"),
        };
        if !entry.is_dict() {
            return Err(malformed("not a dict"));
        }
        let action = action_of(entry).ok_or_else(|| malformed("no action"))?;
        let field = |name: &str| entry.get(name).and_then(|v| v.as_u64());
        let addr = field("addr").unwrap_or(0);
        let stream = field("stream").unwrap_or(0);
        let time_us = field("time_us").unwrap_or(start);
        let size = || match entry.get("size") {
            None => Err(malformed("no size")),
            Some(value) => value.as_u64().ok_or_else(|| match value.as_i64() {
                Some(negative) if negative < 0 => {
                    malformed(&format!("a negative size ({negative})"))
                }
                _ => malformed("a size that is not a whole number of bytes"),
            }),
        };
        let mut stack = 0;
        let action = match action {
            "alloc" => {
                let size = size()?;
                live.insert(addr, size);
                seen.insert(addr);
                stack = stacks.intern(*entry);
                TraceAction::Alloc
            }
            "free_completed" => TraceAction::Free,
            "free_requested" | "free" if !completes => TraceAction::Free,
            "segment_alloc" | "segment_map" => {
                segment_change = segment_change.saturating_add(i128::from(size()?));
                TraceAction::SegmentAlloc
            }
            "segment_free" | "segment_unmap" => {
                segment_change = segment_change.saturating_sub(i128::from(size()?));
                TraceAction::SegmentFree
            }
            "oom" => TraceAction::AllocFailure,
            // `free_requested` where `free_completed` follows, `snapshot`
            // markers, and actions a later PyTorch may add.
            _ => continue,
        };
        let size = size()?;
        if action == TraceAction::Free && live.remove(&addr).is_none() && seen.insert(addr) {
            // Freed but never allocated here: live since before the start.
            preexisting.insert(addr, (stream, size));
        }
        events.push(TraceEvent {
            time_ns: time_us.saturating_sub(start).saturating_mul(1000),
            device,
            stream,
            action,
            id: addr,
            size,
            stack,
        });
    }
    let mut meta = DeviceMeta {
        device,
        segments: segments.len() as u64,
        reserved_bytes: segments
            .iter()
            .fold(0u64, |sum, s| sum.saturating_add(s.total_size)),
        ..DeviceMeta::default()
    };
    for segment in segments {
        for &(addr, size) in &segment.active {
            meta.active_blocks = meta.active_blocks.saturating_add(1);
            meta.active_bytes = meta.active_bytes.saturating_add(size);
            // Active at the end but never allocated here: live all along.
            if !live.contains_key(&addr) && !seen.contains(&addr) {
                preexisting.insert(addr, (segment.stream, size));
            }
        }
    }
    let initial = i128::from(meta.reserved_bytes).saturating_sub(segment_change);
    meta.initial_reserved_bytes = u64::try_from(initial.max(0)).unwrap_or(u64::MAX);
    meta.preexisting_allocations = preexisting.len() as u64;
    meta.preexisting_bytes = preexisting
        .values()
        .fold(0u64, |sum, (_, size)| sum.saturating_add(*size));
    let mut head = Vec::with_capacity(preexisting.len().saturating_add(1));
    if meta.initial_reserved_bytes > 0 {
        head.push(TraceEvent {
            time_ns: 0,
            device,
            stream: 0,
            action: TraceAction::SegmentAlloc,
            id: 0,
            size: meta.initial_reserved_bytes,
            stack: 0,
        });
    }
    head.extend(
        preexisting
            .into_iter()
            .map(|(addr, (stream, size))| TraceEvent {
                time_ns: 0,
                device,
                stream,
                action: TraceAction::Alloc,
                id: addr,
                size,
                stack: 0,
            }),
    );
    head.extend(events);
    Ok((meta, head))
}
