//! Allocation traces: the events an allocator sees, read from the formats
//! people already record (PyTorch memory snapshots, RMM's logging CSV) and
//! from and to this project's own JSON Lines format, and recorded from a
//! running service ([`TraceRecorder`]).

// Traces are untrusted input: every sum on their numbers is checked.
#![warn(clippy::arithmetic_side_effects, clippy::disallowed_methods)]

/// The iterator of a line reader (one with `done` and `next_event`):
/// events until an error or the end, then nothing.
macro_rules! line_iterator {
    ($reader:ident) => {
        impl<R: std::io::BufRead> Iterator for $reader<R> {
            type Item = Result<TraceEvent, TraceError>;

            fn next(&mut self) -> Option<Self::Item> {
                let mut done = self.done;
                let item = super::step(&mut done, || self.next_event());
                self.done = done;
                item
            }
        }
    };
}

mod jsonl;
mod pickle;
mod recorder;
mod rmm;
mod torch;

pub use jsonl::{JsonlReader, read_jsonl, write_jsonl, write_trace_jsonl};
pub use recorder::TraceRecorder;
pub use rmm::{RmmReader, read_rmm_csv, write_rmm_csv};
pub use torch::{read_torch_snapshot, read_torch_trace};

use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::io::{BufRead, BufReader, Read, Seek};
use std::path::Path;
use std::rc::Rc;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TraceAction {
    /// `size` bytes were allocated as `id`.
    Alloc,
    /// `id` was freed.
    Free,
    /// An allocation of `size` bytes failed (the recording allocator ran
    /// out of memory).
    AllocFailure,
    /// The recording allocator took `size` more bytes from the device (a
    /// PyTorch segment allocated or mapped). Replay does not act on it: it
    /// is how much memory the recorded allocator held, to set beside ours.
    SegmentAlloc,
    /// The recording allocator gave `size` bytes back to the device.
    SegmentFree,
}

/// One event of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// Nanoseconds since the trace began.
    pub time_ns: u64,
    /// The device (0 unless the trace names several).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub device: u32,
    /// The stream, as the trace names it.
    pub stream: u64,
    /// What happened.
    pub action: TraceAction,
    /// The allocation (a pointer in RMM and PyTorch traces); an id may be
    /// reused after its free. For segment events, the segment.
    pub id: u64,
    /// Bytes.
    pub size: u64,
    /// The stack that made an allocation, where the trace recorded it: an
    /// index from 1 into [`TraceMeta::stacks`] (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stack: u32,
}

/// One frame of the stack that made an allocation, as a PyTorch snapshot
/// recorded it (Python frames, and C++ ones where it was asked for them).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    /// The function.
    pub name: String,
    /// Its file.
    pub filename: String,
    /// The line.
    pub line: u64,
}

/// A field of the input as an error message quotes it: at most 32
/// characters, and how long it was when it was longer (a 100,000-digit
/// number is not worth a 100 KB message).
pub(crate) fn excerpt(field: &str) -> String {
    const SHOWN: usize = 32;
    match field.char_indices().nth(SHOWN) {
        None => format!("{field:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &field[..cut], field.len()),
    }
}

fn is_zero(device: &u32) -> bool {
    *device == 0
}

impl TraceEvent {
    /// An event on device 0.
    pub fn new(time_ns: u64, stream: u64, action: TraceAction, id: u64, size: u64) -> Self {
        Self {
            time_ns,
            device: 0,
            stream,
            action,
            id,
            size,
            stack: 0,
        }
    }
}

/// What a trace says about itself beyond its events (a PyTorch snapshot's
/// devices and allocator settings). Kept by `convert` as the first line
/// of a JSON Lines trace (`{"meta": {...}}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceMeta {
    /// Where the trace came from (`"pytorch snapshot"`, say).
    #[serde(default)]
    pub source: String,
    /// The recording allocator's settings, as it printed them.
    #[serde(default)]
    pub allocator_settings: std::collections::BTreeMap<String, String>,
    /// Per device, what the recording showed.
    #[serde(default)]
    pub devices: Vec<DeviceMeta>,
    /// The stacks allocations were made from, each once (events name them
    /// by [`TraceEvent::stack`]), innermost frame first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<Vec<Frame>>,
}

/// One device of a recording.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMeta {
    /// The device.
    pub device: u32,
    /// Segments the recording allocator held when the snapshot was taken.
    pub segments: u64,
    /// Bytes of those segments.
    pub reserved_bytes: u64,
    /// Blocks live (allocated or pending free) when the snapshot was taken.
    pub active_blocks: u64,
    /// Bytes of those blocks.
    pub active_bytes: u64,
    /// Allocations live before the recording began (freed in it, or still
    /// active at its end, but never allocated in it): replayed as live
    /// from the start.
    pub preexisting_allocations: u64,
    /// Bytes of those.
    pub preexisting_bytes: u64,
    /// Bytes the recording allocator held when the recording began
    /// (walked back from the snapshot's segments through the segment
    /// events): replayed as one `segment_alloc` at the start.
    pub initial_reserved_bytes: u64,
}

/// A whole trace: what it says of itself, and its events in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// Devices and settings, where the format has them.
    pub meta: TraceMeta,
    /// The events.
    pub events: Vec<TraceEvent>,
}

/// A format this crate reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// This project's JSON Lines (`docs/trace.md`).
    Jsonl,
    /// RMM's logging resource adaptor CSV.
    RmmCsv,
    /// PyTorch's `torch.cuda.memory._dump_snapshot` pickle.
    TorchSnapshot,
}

impl std::str::FromStr for TraceFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "jsonl" | "json" => Ok(Self::Jsonl),
            "rmm" | "csv" | "rmm-csv" => Ok(Self::RmmCsv),
            "torch" | "pytorch" | "pickle" => Ok(Self::TorchSnapshot),
            other => Err(format!("unknown trace format {other:?} ({})", Self::NAMES)),
        }
    }
}

/// Why a trace could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// A line (1-based) that is not what its format says.
    #[error("line {line}: {message}")]
    Malformed {
        /// Line number, from 1.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The file as a whole is not what its format says (a pickle, say).
    #[error("{0}")]
    Invalid(String),
    /// Reading or writing failed.
    #[error("{0}")]
    Io(String),
}

impl From<std::io::Error> for TraceError {
    fn from(err: std::io::Error) -> Self {
        Self::Io(err.to_string())
    }
}

impl TraceFormat {
    /// Guess a file's format from its first bytes (and name).
    pub fn detect(path: &Path, head: &[u8]) -> Option<Self> {
        let head = head.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(head);
        if head.first() == Some(&0x80) {
            return Some(Self::TorchSnapshot);
        }
        let text = String::from_utf8_lossy(head);
        let first = text.trim_start();
        if first.starts_with('{') {
            return Some(Self::Jsonl);
        }
        if first.to_ascii_lowercase().starts_with("thread") {
            return Some(Self::RmmCsv);
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl" | "json") => Some(Self::Jsonl),
            Some("csv") => Some(Self::RmmCsv),
            Some("pickle" | "pkl") => Some(Self::TorchSnapshot),
            _ => None,
        }
    }

    /// The names `--format` takes, for help and error messages.
    pub const NAMES: &'static str = "jsonl, rmm, torch";
}

/// One step of a line reader's iterator: the next event, an error (after
/// which the reader is `done`), or the end.
pub(crate) fn step<T>(
    done: &mut bool,
    next: impl FnOnce() -> Result<Option<T>, TraceError>,
) -> Option<Result<T, TraceError>> {
    if *done {
        return None;
    }
    let item = next().transpose();
    *done = !matches!(item, Some(Ok(_)));
    item
}

/// Counts the bytes read through it (for progress).
/// Read one line of a text trace into `line` (line `number` is the one
/// before it): bytes that are not UTF-8 say what they likely are.
pub(crate) fn read_text_line(
    input: &mut impl BufRead,
    line: &mut String,
    number: usize,
) -> Result<usize, TraceError> {
    input.read_line(line).map_err(|err| {
        if err.kind() == std::io::ErrorKind::InvalidData {
            TraceError::Malformed {
                line: number.saturating_add(1),
                message: format!(
                    "not UTF-8 text: a binary file? (a PyTorch snapshot is read with --format torch, or no --format at all; formats: {})",
                    TraceFormat::NAMES
                ),
            }
        } else {
            err.into()
        }
    })
}

/// The first two bytes of a gzip file.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

struct Counting<R> {
    inner: R,
    read: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.set(self.read.get().saturating_add(n as u64));
        Ok(n)
    }
}

/// A trace file being read: what it says of itself, then its events one
/// at a time (JSON Lines and RMM logs are read as they are replayed, in
/// constant memory; a PyTorch pickle is decoded whole first).
pub struct TraceReader {
    format: TraceFormat,
    meta: TraceMeta,
    events: Box<dyn Iterator<Item = Result<TraceEvent, TraceError>>>,
    read: Rc<Cell<u64>>,
    len: u64,
}

impl std::fmt::Debug for TraceReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceReader")
            .field("format", &self.format)
            .field("read", &self.read.get())
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl TraceReader {
    /// Open `path`, detecting its format unless `format` names it.
    ///
    /// # Errors
    /// A file that cannot be opened, is empty, or whose format cannot be
    /// told; a pickle that is not a snapshot. (Messages do not repeat the
    /// path: a caller names it once.)
    pub fn open(path: &Path, format: Option<TraceFormat>) -> Result<Self, TraceError> {
        let mut file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        if len == 0 {
            return Err(TraceError::Invalid(
                "the file is empty: no events to read".into(),
            ));
        }
        let mut magic = [0u8; 2];
        let gzipped = file.read_exact(&mut magic).is_ok() && magic == GZIP_MAGIC;
        file.seek(std::io::SeekFrom::Start(0))?;
        let read = Rc::new(Cell::new(0));
        // Progress follows the file's bytes, compressed or not.
        let counted = Counting {
            inner: file,
            read: Rc::clone(&read),
        };
        let mut input: Box<dyn BufRead> = if gzipped {
            Box::new(BufReader::with_capacity(
                1 << 16,
                flate2::read::MultiGzDecoder::new(counted),
            ))
        } else {
            Box::new(BufReader::with_capacity(1 << 16, counted))
        };
        let head = input.fill_buf()?;
        if head.is_empty() {
            return Err(TraceError::Invalid(
                "the file is empty: no events to read".into(),
            ));
        }
        // `x.pickle.gz` is named as what it holds.
        let named = if gzipped {
            path.with_extension("")
        } else {
            path.to_path_buf()
        };
        let format = match format {
            Some(format) => format,
            None => TraceFormat::detect(&named, &head[..head.len().min(512)]).ok_or_else(|| {
                TraceError::Invalid(format!(
                    "cannot tell the trace format; name it with --format ({})",
                    TraceFormat::NAMES
                ))
            })?,
        };
        let (meta, events): (TraceMeta, Box<dyn Iterator<Item = _>>) = match format {
            TraceFormat::Jsonl => {
                let reader = JsonlReader::new(input)?;
                (reader.meta().clone(), Box::new(reader))
            }
            TraceFormat::RmmCsv => (TraceMeta::default(), Box::new(RmmReader::new(input))),
            TraceFormat::TorchSnapshot => {
                let mut bytes = Vec::with_capacity(len as usize);
                input.read_to_end(&mut bytes)?;
                let trace = read_torch_trace(&bytes)?;
                (trace.meta, Box::new(trace.events.into_iter().map(Ok)))
            }
        };
        Ok(Self {
            format,
            meta,
            events,
            read,
            len,
        })
    }

    /// The format being read.
    pub fn format(&self) -> TraceFormat {
        self.format
    }

    /// What the trace says of itself.
    pub fn meta(&self) -> &TraceMeta {
        &self.meta
    }

    /// Bytes of the file read so far.
    pub fn bytes_read(&self) -> u64 {
        self.read.get()
    }

    /// The file's length in bytes.
    pub fn bytes_total(&self) -> u64 {
        self.len
    }
}

impl Iterator for TraceReader {
    type Item = Result<TraceEvent, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.events.next()
    }
}

/// Read a trace file whole, detecting its format unless `format` names it.
pub fn read_trace(path: &Path, format: Option<TraceFormat>) -> Result<Vec<TraceEvent>, TraceError> {
    read_trace_file(path, format).map(|trace| trace.events)
}

/// Read a trace file whole, with what it says of itself.
pub fn read_trace_file(path: &Path, format: Option<TraceFormat>) -> Result<Trace, TraceError> {
    let mut reader = TraceReader::open(path, format)?;
    let events = reader.by_ref().collect::<Result<Vec<_>, _>>()?;
    Ok(Trace {
        meta: reader.meta,
        events,
    })
}
