//! RMM's logging CSV (`rmm::mr::logging_resource_adaptor`): a header
//! `Thread,Time,Action,Pointer,Size,Stream` (columns found by name, in any
//! order), then actions `allocate`, `allocate failure` and `free`, pointers
//! and streams in hex. Times are `HH:MM:SS.ffffff` (or plain numbers of
//! nanoseconds). Read a line at a time, so a log of any length replays in
//! constant memory.

use super::excerpt;
use super::{TraceAction, TraceError, TraceEvent};
use std::io::{BufRead, Write};

/// The columns an RMM log holds, in the order RMM writes them.
const COLUMNS: [&str; 6] = ["thread", "time", "action", "pointer", "size", "stream"];

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
    // RMM logs a time of day: hours, minutes below 60, seconds below 60.
    let mut parts = field.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let seconds: f64 = s.parse().ok()?;
    if !(0.0..60.0).contains(&seconds) {
        return None;
    }
    let minutes = m.parse::<u64>().ok().filter(|m| *m < 60)?;
    let whole = h
        .parse::<u64>()
        .ok()?
        .checked_mul(3600)?
        .checked_add(minutes.checked_mul(60)?)?;
    whole
        .checked_mul(1_000_000_000)?
        .checked_add((seconds * 1e9).round() as u64)
}

/// Where each column is: the index of thread, time, action, pointer, size
/// and stream in a line.
#[derive(Debug, Clone, Copy)]
struct Layout([usize; 6]);

impl Layout {
    /// RMM's own order (a log without a header).
    const RMM: Layout = Layout([0, 1, 2, 3, 4, 5]);

    /// The layout a header names, or why it is not an RMM header.
    fn from_header(fields: &[&str]) -> Result<Self, String> {
        let mut at = [usize::MAX; 6];
        for (index, field) in fields.iter().enumerate() {
            if let Some(column) = COLUMNS.iter().position(|c| field.eq_ignore_ascii_case(c)) {
                at[column] = index;
            }
        }
        if at.contains(&usize::MAX) {
            return Err(format!(
                "not an RMM log header: expected the columns Thread,Time,Action,Pointer,Size,Stream, found {}",
                excerpt(&fields.join(","))
            ));
        }
        Ok(Layout(at))
    }

    fn width(&self) -> usize {
        self.0.iter().max().map_or(0, |m| m.saturating_add(1))
    }
}

/// RMM log events, read a line at a time.
#[derive(Debug)]
pub struct RmmReader<R> {
    input: R,
    line: String,
    number: usize,
    layout: Option<Layout>,
    start: Option<u64>,
    done: bool,
}

impl<R: BufRead> RmmReader<R> {
    /// Events of the log `input`.
    pub fn new(input: R) -> Self {
        Self {
            input,
            line: String::new(),
            number: 0,
            layout: None,
            start: None,
            done: false,
        }
    }

    fn next_event(&mut self) -> Result<Option<TraceEvent>, TraceError> {
        loop {
            self.line.clear();
            if super::read_text_line(&mut self.input, &mut self.line, self.number)? == 0 {
                return Ok(None);
            }
            self.number = self.number.saturating_add(1);
            let text = self.line.trim_start_matches('\u{feff}').trim();
            if text.is_empty() {
                continue;
            }
            let number = self.number;
            let malformed = |message: String| TraceError::Malformed {
                line: number,
                message,
            };
            let fields: Vec<&str> = text.split(',').map(str::trim).collect();
            let layout = match self.layout {
                Some(layout) => layout,
                None => {
                    // The first line: a header (any first field that is
                    // not a thread number), or RMM's order without one.
                    let is_header = fields.first().is_some_and(|f| f.parse::<u64>().is_err());
                    if is_header {
                        self.layout = Some(Layout::from_header(&fields).map_err(malformed)?);
                        continue;
                    }
                    *self.layout.insert(Layout::RMM)
                }
            };
            if fields.len() < layout.width() {
                return Err(malformed(format!(
                    "expected {} fields (Thread,Time,Action,Pointer,Size,Stream), found {}",
                    layout.width(),
                    fields.len()
                )));
            }
            let [_, time, action, pointer, size, stream] = layout.0.map(|i| fields[i]);
            let action = match action.to_ascii_lowercase().as_str() {
                "allocate" => TraceAction::Alloc,
                "allocate failure" => TraceAction::AllocFailure,
                "free" => TraceAction::Free,
                other => {
                    return Err(malformed(format!(
                        "unknown action {} (allocate, allocate failure, free)",
                        excerpt(other)
                    )));
                }
            };
            let time = time_ns(time).ok_or_else(|| {
                malformed(format!(
                    "bad time {} (nanoseconds, or hh:mm:ss.ffffff with minutes and seconds below 60)",
                    excerpt(time)
                ))
            })?;
            let id = hex(pointer)
                .ok_or_else(|| malformed(format!("bad pointer {}", excerpt(pointer))))?;
            let size = size.parse::<u64>().map_err(|_| {
                malformed(format!(
                    "bad size {} (bytes, at most {})",
                    excerpt(size),
                    u64::MAX
                ))
            })?;
            let stream =
                hex(stream).ok_or_else(|| malformed(format!("bad stream {}", excerpt(stream))))?;
            let start = *self.start.get_or_insert(time);
            return Ok(Some(TraceEvent::new(
                time.saturating_sub(start),
                stream,
                action,
                id,
                size,
            )));
        }
    }
}

line_iterator!(RmmReader);

/// Read RMM's logging CSV whole. Times become relative to the first event.
pub fn read_rmm_csv(input: impl BufRead) -> Result<Vec<TraceEvent>, TraceError> {
    RmmReader::new(input).collect()
}

/// Write events as RMM's logging CSV (times as nanoseconds).
pub fn write_rmm_csv(events: &[TraceEvent], mut out: impl Write) -> Result<(), TraceError> {
    writeln!(out, "Thread,Time,Action,Pointer,Size,Stream")?;
    for event in events {
        let action = match event.action {
            TraceAction::Alloc => "allocate",
            TraceAction::AllocFailure => "allocate failure",
            TraceAction::Free => "free",
            // RMM's log has no device-level events.
            TraceAction::SegmentAlloc | TraceAction::SegmentFree => continue,
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
