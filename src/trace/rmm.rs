//! RMM's logging CSV (`rmm::mr::logging_resource_adaptor`):
//! `Thread,Time,Action,Pointer,Size,Stream`, actions `allocate`,
//! `allocate failure` and `free`, pointers and streams in hex. Times are
//! `HH:MM:SS.ffffff` (or plain numbers of nanoseconds).

use super::{TraceAction, TraceError, TraceEvent};
use std::io::{BufRead, Write};

fn hex(field: &str) -> Option<u64> {
    let field = field.trim();
    let digits = field
        .strip_prefix("0x")
        .or_else(|| field.strip_prefix("0X"))
        .unwrap_or(field);
    if digits.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(digits, 16).ok()
}

fn time_ns(field: &str) -> Option<u64> {
    let field = field.trim();
    if let Ok(ns) = field.parse::<u64>() {
        return Some(ns);
    }
    let mut parts = field.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    let seconds: f64 = s.parse().ok()?;
    if !(0.0..1e9).contains(&seconds) {
        return None;
    }
    let whole = h
        .parse::<u64>()
        .ok()?
        .checked_mul(3600)?
        .checked_add(m.parse::<u64>().ok()?.checked_mul(60)?)?;
    whole
        .checked_mul(1_000_000_000)?
        .checked_add((seconds * 1e9).round() as u64)
}

/// Read RMM's logging CSV. Times become relative to the first event.
pub fn read_rmm_csv(input: impl BufRead) -> Result<Vec<TraceEvent>, TraceError> {
    let mut events = Vec::new();
    let mut start = None;
    for (index, line) in input.lines().enumerate() {
        let line = line?;
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if number == 1
            && fields
                .first()
                .is_some_and(|f| f.eq_ignore_ascii_case("thread"))
        {
            continue;
        }
        let malformed = |message: String| TraceError::Malformed {
            line: number,
            message,
        };
        if fields.len() < 6 {
            return Err(malformed(format!(
                "expected 6 fields (Thread,Time,Action,Pointer,Size,Stream), found {}",
                fields.len()
            )));
        }
        let action = match fields[2].to_ascii_lowercase().as_str() {
            "allocate" => TraceAction::Alloc,
            "allocate failure" => TraceAction::AllocFailure,
            "free" => TraceAction::Free,
            other => return Err(malformed(format!("unknown action {other:?}"))),
        };
        let time =
            time_ns(fields[1]).ok_or_else(|| malformed(format!("bad time {:?}", fields[1])))?;
        let id = hex(fields[3]).ok_or_else(|| malformed(format!("bad pointer {:?}", fields[3])))?;
        let size = fields[4]
            .parse::<u64>()
            .map_err(|_| malformed(format!("bad size {:?}", fields[4])))?;
        let stream =
            hex(fields[5]).ok_or_else(|| malformed(format!("bad stream {:?}", fields[5])))?;
        let start = *start.get_or_insert(time);
        events.push(TraceEvent {
            time_ns: time.saturating_sub(start),
            stream,
            action,
            id,
            size,
        });
    }
    Ok(events)
}

/// Write events as RMM's logging CSV (times as nanoseconds).
pub fn write_rmm_csv(events: &[TraceEvent], mut out: impl Write) -> Result<(), TraceError> {
    writeln!(out, "Thread,Time,Action,Pointer,Size,Stream")?;
    for event in events {
        let action = match event.action {
            TraceAction::Alloc => "allocate",
            TraceAction::AllocFailure => "allocate failure",
            TraceAction::Free => "free",
        };
        writeln!(
            out,
            "0,{},{action},{:#x},{},{:#x}",
            event.time_ns, event.id, event.size, event.stream
        )?;
    }
    out.flush()?;
    Ok(())
}
