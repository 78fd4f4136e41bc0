//! Allocation traces: the events an allocator sees, read from the formats
//! people already record (PyTorch memory snapshots, RMM's logging CSV) and
//! from and to this project's own JSON Lines format, and recorded from a
//! running service ([`TraceRecorder`]).

mod jsonl;
mod recorder;
mod rmm;
mod torch;

pub use jsonl::{read_jsonl, write_jsonl};
pub use recorder::TraceRecorder;
pub use rmm::{read_rmm_csv, write_rmm_csv};
pub use torch::read_torch_snapshot;

use serde::{Deserialize, Serialize};
use std::path::Path;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceAction {
    /// `size` bytes were allocated as `id`.
    Alloc,
    /// `id` was freed.
    Free,
    /// An allocation of `size` bytes failed.
    AllocFailure,
}

/// One event of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// Nanoseconds since the trace began.
    pub time_ns: u64,
    /// The stream, as the trace names it.
    pub stream: u64,
    /// What happened.
    pub action: TraceAction,
    /// The allocation (a pointer in RMM and PyTorch traces); an id may be
    /// reused after its free.
    pub id: u64,
    /// Bytes.
    pub size: u64,
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
            other => Err(format!(
                "unknown trace format {other:?} (jsonl, rmm, torch)"
            )),
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
}

/// Read a trace file, detecting its format unless `format` names it.
pub fn read_trace(path: &Path, format: Option<TraceFormat>) -> Result<Vec<TraceEvent>, TraceError> {
    let bytes =
        std::fs::read(path).map_err(|e| TraceError::Io(format!("{}: {e}", path.display())))?;
    let format = match format {
        Some(format) => format,
        None => TraceFormat::detect(path, &bytes[..bytes.len().min(512)]).ok_or_else(|| {
            TraceError::Invalid(format!(
                "{}: cannot tell the trace format; name it with --format",
                path.display()
            ))
        })?,
    };
    match format {
        TraceFormat::Jsonl => read_jsonl(&bytes[..]),
        TraceFormat::RmmCsv => read_rmm_csv(&bytes[..]),
        TraceFormat::TorchSnapshot => read_torch_snapshot(&bytes),
    }
}
