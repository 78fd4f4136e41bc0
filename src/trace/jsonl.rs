//! This project's trace format: JSON Lines, one event per line
//! (`docs/trace.md`): `{"time_ns":0,"stream":0,"action":"alloc","id":1,"size":4096}`.

use super::{TraceError, TraceEvent};
use std::io::{BufRead, Write};

/// Read JSON Lines events; blank lines are skipped.
pub fn read_jsonl(input: impl BufRead) -> Result<Vec<TraceEvent>, TraceError> {
    let mut events = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(&line).map_err(|err| TraceError::Malformed {
            line: index + 1,
            message: err.to_string(),
        })?;
        events.push(event);
    }
    Ok(events)
}

/// Write events as JSON Lines.
pub fn write_jsonl(events: &[TraceEvent], mut out: impl Write) -> Result<(), TraceError> {
    for event in events {
        serde_json::to_writer(&mut out, event).map_err(|e| TraceError::Io(e.to_string()))?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}
