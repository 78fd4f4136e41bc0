//! PyTorch's memory snapshot (`torch.cuda.memory._dump_snapshot`): a pickle
//! of a dict whose `device_traces` holds, per device, the allocator's
//! events: `action` (`alloc`, `free_requested`, `free_completed`,
//! `segment_alloc`, `segment_free`, `oom`, ...), `addr`, `size`, `stream`,
//! `time_us`. Allocations are `alloc` ... `free_completed` (a
//! `free_requested` alone, from older snapshots, counts as the free);
//! segment events are PyTorch's own device allocations and are skipped:
//! replay puts our allocator in PyTorch's place.

use super::{TraceAction, TraceError, TraceEvent};
use serde_pickle::{DeOptions, HashableValue, Value};
use std::collections::BTreeMap;

fn field<'a>(entry: &'a BTreeMap<HashableValue, Value>, name: &str) -> Option<&'a Value> {
    entry.get(&HashableValue::String(name.into()))
}

fn int(value: Option<&Value>) -> Option<u64> {
    match value? {
        Value::I64(v) => u64::try_from(*v).ok(),
        Value::Int(v) => u64::try_from(v.clone()).ok(),
        Value::F64(v) if *v >= 0.0 => Some(*v as u64),
        _ => None,
    }
}

fn text(value: Option<&Value>) -> Option<&str> {
    match value? {
        Value::String(s) => Some(s),
        _ => None,
    }
}

/// Read a snapshot pickle's `device_traces` (every device, in order).
pub fn read_torch_snapshot(bytes: &[u8]) -> Result<Vec<TraceEvent>, TraceError> {
    let options = DeOptions::new()
        .replace_unresolved_globals()
        .decode_strings();
    // serde-pickle can panic on some malformed input (sorting a set whose
    // members hold NaN, found by fuzzing); a reader answers malformed input
    // with an error, never a panic.
    let parsed = std::panic::catch_unwind(|| serde_pickle::value_from_slice(bytes, options));
    let value = match parsed {
        Ok(Ok(value)) => value,
        Ok(Err(err)) => {
            return Err(TraceError::Invalid(format!(
                "not a PyTorch snapshot pickle: {err}"
            )));
        }
        Err(_) => {
            return Err(TraceError::Invalid(
                "not a PyTorch snapshot pickle: the decoder rejected its structure".into(),
            ));
        }
    };
    let Value::Dict(root) = value else {
        return Err(TraceError::Invalid("snapshot is not a dict".into()));
    };
    let Some(Value::List(devices)) = field(&root, "device_traces") else {
        return Err(TraceError::Invalid("snapshot has no device_traces".into()));
    };
    let mut events = Vec::new();
    let mut start = None;
    for (device, trace) in devices.iter().enumerate() {
        let Value::List(entries) = trace else {
            return Err(TraceError::Invalid(format!(
                "device_traces[{device}] is not a list"
            )));
        };
        // Old snapshots have no free_completed: their free_requested frees.
        let completes = entries.iter().any(
            |e| matches!(e, Value::Dict(d) if text(field(d, "action")) == Some("free_completed")),
        );
        for (index, entry) in entries.iter().enumerate() {
            let malformed = |message: &str| TraceError::Malformed {
                line: index + 1,
                message: format!("device_traces[{device}][{index}]: {message}"),
            };
            let Value::Dict(entry) = entry else {
                return Err(malformed("not a dict"));
            };
            let action = text(field(entry, "action")).ok_or_else(|| malformed("no action"))?;
            let action = match action {
                "alloc" => TraceAction::Alloc,
                "free_completed" => TraceAction::Free,
                "free_requested" | "free" if !completes => TraceAction::Free,
                "oom" => TraceAction::AllocFailure,
                _ => continue,
            };
            let addr = int(field(entry, "addr")).unwrap_or(0);
            let size = int(field(entry, "size")).ok_or_else(|| malformed("no size"))?;
            let stream = int(field(entry, "stream")).unwrap_or(0);
            let time_us = int(field(entry, "time_us")).unwrap_or(index as u64);
            let start = *start.get_or_insert(time_us);
            // Keep ids distinct across devices.
            let id = addr ^ ((device as u64) << 56);
            events.push(TraceEvent {
                time_ns: time_us.saturating_sub(start) * 1000,
                stream: stream ^ ((device as u64) << 48),
                action,
                id,
                size,
            });
        }
    }
    Ok(events)
}
