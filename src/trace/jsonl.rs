//! This project's trace format: JSON Lines, one event per line
//! (`docs/trace.md`): `{"time_ns":0,"stream":0,"action":"alloc","id":1,"size":4096}`,
//! optionally after one `{"meta": {...}}` line that says where the trace
//! came from (a converted PyTorch snapshot's devices and settings). Read a
//! line at a time.

use super::{Trace, TraceError, TraceEvent, TraceMeta};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};

/// The first line of a trace that carries its [`TraceMeta`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetaLine {
    meta: TraceMeta,
}

/// JSON Lines events, read a line at a time.
#[derive(Debug)]
pub struct JsonlReader<R> {
    input: R,
    line: String,
    number: usize,
    /// The meta line, once read; events follow it.
    meta: TraceMeta,
    /// An event read while looking for the meta line.
    first: Option<TraceEvent>,
    done: bool,
}

impl<R: BufRead> JsonlReader<R> {
    /// Events of `input`; its meta line (if any) is read at once.
    pub fn new(input: R) -> Result<Self, TraceError> {
        let mut reader = Self {
            input,
            line: String::new(),
            number: 0,
            meta: TraceMeta::default(),
            first: None,
            done: false,
        };
        if let Some(line) = reader.next_line()? {
            let text = line.trim_start_matches('\u{feff}');
            if text.trim_start().starts_with("{\"meta\"") {
                let meta: MetaLine =
                    serde_json::from_str(text).map_err(|err| TraceError::Malformed {
                        line: reader.number,
                        message: format!("bad meta line: {}", json_message(&err)),
                    })?;
                reader.meta = meta.meta;
            } else {
                let text = text.to_string();
                reader.first = Some(reader.parse(&text)?);
            }
        }
        Ok(reader)
    }

    /// What the trace says of itself.
    pub fn meta(&self) -> &TraceMeta {
        &self.meta
    }

    fn next_line(&mut self) -> Result<Option<String>, TraceError> {
        loop {
            self.line.clear();
            if super::read_text_line(&mut self.input, &mut self.line, self.number)? == 0 {
                return Ok(None);
            }
            self.number = self.number.saturating_add(1);
            if !self.line.trim().is_empty() {
                return Ok(Some(self.line.trim_end().to_string()));
            }
        }
    }

    fn parse(&self, text: &str) -> Result<TraceEvent, TraceError> {
        serde_json::from_str(text).map_err(|err| TraceError::Malformed {
            line: self.number,
            message: json_message(&err),
        })
    }

    fn next_event(&mut self) -> Result<Option<TraceEvent>, TraceError> {
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        match self.next_line()? {
            Some(line) => self.parse(&line).map(Some),
            None => Ok(None),
        }
    }
}

line_iterator!(JsonlReader);

/// Read JSON Lines events whole; blank lines are skipped.
pub fn read_jsonl(input: impl BufRead) -> Result<Vec<TraceEvent>, TraceError> {
    JsonlReader::new(input)?.collect()
}

/// Write events as JSON Lines.
pub fn write_jsonl(events: &[TraceEvent], out: impl Write) -> Result<(), TraceError> {
    write_trace_jsonl(&TraceMeta::default(), events, out)
}

/// Write a trace as JSON Lines: its meta line first (unless it says
/// nothing), then its events.
pub fn write_trace_jsonl(
    meta: &TraceMeta,
    events: &[TraceEvent],
    mut out: impl Write,
) -> Result<(), TraceError> {
    let io = |e: serde_json::Error| TraceError::Io(e.to_string());
    if *meta != TraceMeta::default() {
        serde_json::to_writer(&mut out, &MetaLine { meta: meta.clone() }).map_err(io)?;
        out.write_all(b"\n")?;
    }
    for event in events {
        serde_json::to_writer(&mut out, event).map_err(io)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

impl Trace {
    /// Write this trace as JSON Lines (what `streamalloc convert` writes).
    pub fn write_jsonl(&self, out: impl Write) -> Result<(), TraceError> {
        write_trace_jsonl(&self.meta, &self.events, out)
    }
}

/// What serde_json says is wrong with a line, without its own "at line 1"
/// (the reader numbers lines of the file) and with at most a short
/// excerpt of any value it quotes.
fn json_message(err: &serde_json::Error) -> String {
    const LONGEST: usize = 160;
    let text = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    let text = text.strip_suffix(&suffix).unwrap_or(&text);
    let text = match text.char_indices().nth(LONGEST) {
        Some((cut, _)) => format!("{}... ({} bytes)", &text[..cut], text.len()),
        None => text.to_string(),
    };
    if err.column() > 0 {
        format!("column {}: {text}", err.column())
    } else {
        text
    }
}
