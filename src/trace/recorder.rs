//! `TraceRecorder`: records a running service's reservations, frees and
//! failures in the JSON Lines format, for replay or conversion later.

use super::{TraceAction, TraceEvent};
use crate::memory::{AllocationId, MemoryError, MemoryObserver, StreamId};
use crate::sync::{Arc, Mutex};
use std::io::Write;
use std::time::Instant;

/// Where events go.
enum Sink {
    /// Kept in memory.
    Memory(Vec<TraceEvent>),
    /// Written as JSON Lines.
    Writer(Box<dyn Write + Send>),
}

/// A shared recorder: give it to `ServiceConfig::recorder` (every stream
/// records into it) or to one manager with [`TraceRecorder::observer`].
pub struct TraceRecorder {
    /// When recording began.
    start: Instant,
    /// The events' destination.
    sink: Mutex<Sink>,
}

impl std::fmt::Debug for TraceRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceRecorder").finish_non_exhaustive()
    }
}

impl TraceRecorder {
    /// A recorder that keeps events in memory ([`events`](Self::events)).
    pub fn in_memory() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            sink: Mutex::new(Sink::Memory(Vec::new())),
        })
    }

    /// A recorder that writes JSON Lines to `out`.
    pub fn to_writer(out: impl Write + Send + 'static) -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            sink: Mutex::new(Sink::Writer(Box::new(std::io::BufWriter::new(out)))),
        })
    }

    /// A recorder that writes JSON Lines to a new file at `path`.
    pub fn to_file(path: &std::path::Path) -> std::io::Result<Arc<Self>> {
        Ok(Self::to_writer(std::fs::File::create(path)?))
    }

    /// The events kept so far (empty for a writer).
    pub fn events(&self) -> Vec<TraceEvent> {
        match &*self.sink.lock() {
            Sink::Memory(events) => events.clone(),
            Sink::Writer(_) => Vec::new(),
        }
    }

    /// Flush a writer.
    pub fn flush(&self) -> std::io::Result<()> {
        match &mut *self.sink.lock() {
            Sink::Memory(_) => Ok(()),
            Sink::Writer(out) => out.flush(),
        }
    }

    /// Record one event now.
    pub fn record(&self, stream: u64, action: TraceAction, id: u64, size: u64) {
        let event = TraceEvent::new(
            self.start.elapsed().as_nanos() as u64,
            stream,
            action,
            id,
            size,
        );
        match &mut *self.sink.lock() {
            Sink::Memory(events) => events.push(event),
            Sink::Writer(out) => {
                if serde_json::to_writer(&mut *out, &event).is_ok() {
                    let _ = out.write_all(b"\n");
                }
            }
        }
    }

    /// An observer to install on a manager (`MemoryManager::set_observer`).
    pub fn observer(recorder: &Arc<Self>) -> Box<dyn MemoryObserver> {
        Box::new(RecordingObserver {
            recorder: recorder.clone(),
            sizes: std::collections::HashMap::new(),
        })
    }
}

/// Records a manager's events into a [`TraceRecorder`].
struct RecordingObserver {
    recorder: Arc<TraceRecorder>,
    /// Sizes of live allocations, for rebinding.
    sizes: std::collections::HashMap<u64, u64>,
}

/// A trace id unique on the device (as an address is): the stream in the
/// top byte, the slot in the next three, the generation below. Unique for
/// the first 256 streams and 2^24 slots of each.
fn key(id: AllocationId) -> u64 {
    (u64::from(id.stream.0 & 0xff) << 56)
        | (u64::from(id.slot & 0xff_ffff) << 32)
        | u64::from(id.generation)
}

impl MemoryObserver for RecordingObserver {
    fn reserved(&mut self, id: AllocationId, size: u64) {
        self.sizes.insert(key(id), size);
        self.recorder
            .record(u64::from(id.stream.0), TraceAction::Alloc, key(id), size);
    }

    fn freed(&mut self, id: AllocationId, size: u64) {
        self.sizes.remove(&key(id));
        self.recorder
            .record(u64::from(id.stream.0), TraceAction::Free, key(id), size);
    }

    fn rebound(&mut self, from: AllocationId, to: AllocationId) {
        // A rebind keeps the memory; the trace renames it as a free and an
        // allocation of the same size at the same moment.
        if let Some(size) = self.sizes.remove(&key(from)) {
            self.freed(from, size);
            self.reserved(to, size);
        }
    }

    fn failed(&mut self, stream: StreamId, size: u64, _error: &MemoryError) {
        self.recorder
            .record(u64::from(stream.0), TraceAction::AllocFailure, 0, size);
    }
}
