//! The process's allocator: one supervisor per device, made on first use;
//! one streamalloc stream per CUDA stream PyTorch passes; every pointer
//! handed out pinned for life (PyTorch holds raw pointers: its memory
//! never moves). Every call PyTorch can get wrong is a counted refusal,
//! never a crash.

use crate::config::{Config, StorageChoice};
use crate::devices::Devices;
use crate::fork::Process;
use crate::ledger::Ledger;
use crate::live::LiveMap;
use crate::refusal::Refusal;
use crate::streams::Streams;
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use streamalloc::memory::{Allocation, Bytes, Cleanup, Pinned, StreamId};
use streamalloc::service::{ServiceError, StreamHandle, Supervisor};
use streamalloc::trace::{TraceAction, TraceEvent, TraceMeta, write_trace_jsonl};

/// Messages logged per kind of refusal; the rest are counted only.
const LOGGED_PER_KIND: u64 = 8;

/// The most devices the library serves (CUDA ordinals are small).
const MAX_DEVICES: usize = 64;

/// One pointer handed out.
struct Held {
    /// Pinned (its address) and kept alive (its handle) until freed; the
    /// pin goes first (fields drop in order).
    _pinned: Pinned,
    _allocation: Allocation,
    size: u64,
    stream: usize,
    /// Other streams PyTorch said use it (`record_stream`).
    used_on: Vec<usize>,
}

/// One device: its supervisor, its streams by CUDA stream, what is live.
struct Device {
    supervisor: Supervisor,
    /// The CUDA stream each stream being made orders its work on (its
    /// storage borrows it): filled before `Supervisor::stream`.
    cuda_streams: Arc<Mutex<HashMap<u32, usize>>>,
    /// One handle per CUDA stream, shared by every thread that calls on
    /// it (a handle takes concurrent calls; a clone per call was a new
    /// client, its reply cell and hot cache made and dropped each time).
    streams: Streams,
    live: LiveMap<Held>,
    /// The GPU's context, where memory is the GPU's.
    #[cfg(feature = "cuda")]
    context: Option<std::sync::Arc<cudarc::driver::CudaContext>>,
    /// Frees waiting for other streams that used the memory.
    #[cfg(feature = "cuda")]
    waiting: crate::uses::Waiting<Held>,
}

impl Device {
    /// Give back what waited for other streams and no longer needs to.
    fn release_finished(&self) {
        #[cfg(feature = "cuda")]
        if let Some(context) = &self.context {
            self.waiting.release_finished(context);
        }
    }

    /// Free `held`, once every other stream that used it is done with it.
    fn release(&self, held: Held) {
        #[cfg(feature = "cuda")]
        if let Some(context) = &self.context
            && !held.used_on.is_empty()
        {
            match crate::uses::Uses::record(context, &held.used_on) {
                Ok(uses) => self.waiting.push(held.used_on[0], uses, held),
                // No event to wait on: wait for the device instead.
                Err(_) => {
                    let _ = context.synchronize();
                }
            }
            return;
        }
        drop(held);
    }
}

/// The library's state in this process.
pub struct Library {
    /// The process that made it: a child after `fork` is refused.
    process: Process,
    config: Result<Config, String>,
    devices: Devices<Device, MAX_DEVICES>,
    /// Memory fractions PyTorch set, applied at each device's first use.
    fractions: Mutex<HashMap<i32, f64>>,
    shut: AtomicBool,
    refusals: Mutex<HashMap<Refusal, u64>>,
    /// Bytes handed out and not freed, their peak, and the trace
    /// (`ledger.rs`).
    ledger: Ledger,
    started: Instant,
}

impl Library {
    /// The library, configured from `config` (or the reason it is not).
    pub fn new(config: Result<Config, String>, record: bool) -> Self {
        Self {
            process: Process::this(),
            config,
            devices: Devices::default(),
            fractions: Mutex::new(HashMap::new()),
            shut: AtomicBool::new(false),
            refusals: Mutex::new(HashMap::new()),
            ledger: Ledger::new(record),
            started: Instant::now(),
        }
    }

    /// Count a refusal, and log the first few of its kind.
    pub fn refuse(&self, kind: Refusal, message: impl FnOnce() -> String) {
        let count = {
            let mut refusals = self.refusals.lock();
            let count = refusals.entry(kind).or_insert(0);
            *count += 1;
            *count
        };
        if count <= LOGGED_PER_KIND {
            let more = if count == LOGGED_PER_KIND {
                " (further refusals of this kind are counted, not logged)"
            } else {
                ""
            };
            eprintln!(
                "streamalloc-torch: refused ({}): {}{more}",
                kind.name(),
                message()
            );
        }
    }

    /// Whether this call may act at all: not after shutdown, not in a
    /// forked child.
    fn usable(&self) -> bool {
        if !self.process.is_current() {
            self.refuse(Refusal::ForkedChild, || {
                "a call in a child process after fork: the parent's device memory is not the child's".into()
            });
            return false;
        }
        if self.shut.load(Ordering::Acquire) {
            self.refuse(Refusal::AfterShutdown, || "a call after shutdown".into());
            return false;
        }
        true
    }

    fn config(&self) -> Option<&Config> {
        match &self.config {
            Ok(config) => Some(config),
            Err(message) => {
                self.refuse(Refusal::BadConfig, || message.clone());
                None
            }
        }
    }

    /// The device `device`, made on first use.
    fn device(&self, device: i32) -> Option<&Device> {
        let Some(index) = usize::try_from(device).ok().filter(|&i| i < MAX_DEVICES) else {
            self.refuse(Refusal::BadDevice, || {
                format!(
                    "device {device} (this library serves devices 0 to {})",
                    MAX_DEVICES - 1
                )
            });
            return None;
        };
        self.devices.get_or_make(index, || {
            let config = self.config()?;
            self.make_device(device, config)
        })
    }

    /// Device `device`'s supervisor and tables, its budget from the
    /// memory fraction set for it, if any (`None`, refused, where its
    /// storage cannot be had).
    fn make_device(&self, device: i32, config: &Config) -> Option<Device> {
        let budget = match self.fractions.lock().get(&device) {
            Some(fraction) => Some((config.device_bytes as f64 * fraction) as u64),
            None => config.budget,
        };
        let service = config.service(budget);
        let most_streams = service.max_streams;
        let cuda_streams = Arc::new(Mutex::new(HashMap::new()));
        let supervisor = match config.storage {
            StorageChoice::Host => Supervisor::host(service),
            StorageChoice::Virtual => Supervisor::virtual_device(service),
            StorageChoice::Cuda => match cuda_supervisor(device, service, cuda_streams.clone()) {
                Ok(supervisor) => supervisor,
                Err(message) => {
                    self.refuse(Refusal::BadDevice, || message);
                    return None;
                }
            },
        };
        #[cfg(feature = "cuda")]
        let context = match config.storage {
            StorageChoice::Cuda => usize::try_from(device)
                .ok()
                .and_then(|ordinal| streamalloc::storage::CudaStorage::context(ordinal).ok()),
            _ => None,
        };
        Some(Device {
            supervisor,
            cuda_streams,
            streams: Streams::new(most_streams),
            live: LiveMap::default(),
            #[cfg(feature = "cuda")]
            context,
            #[cfg(feature = "cuda")]
            waiting: crate::uses::Waiting::default(),
        })
    }

    /// The streamalloc stream of CUDA stream `stream` on `device`, made
    /// on its first call.
    fn stream<'a>(&self, device: &'a Device, stream: usize) -> Option<&'a StreamHandle> {
        let made = device.streams.get_or_make(stream, |id| {
            // Its storage orders on this CUDA stream: known before it is made.
            device.cuda_streams.lock().insert(id, stream);
            (device.supervisor.stream(StreamId(id))).map_err(|err| err.to_string())
        });
        match made {
            Ok(handle) => Some(handle),
            Err(message) => {
                self.refuse(Refusal::TooManyStreams, || {
                    format!("CUDA stream {stream:#x}: {message}")
                });
                None
            }
        }
    }

    /// Count an allocation or a free (and trace it, when recording).
    fn count(&self, device: i32, stream: usize, action: TraceAction, ptr: usize, size: u64) {
        self.ledger.count(action, size, || {
            let time = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let mut event = TraceEvent::new(time, stream as u64, action, ptr as u64, size);
            event.device = u32::try_from(device).unwrap_or(0);
            event
        });
    }

    /// PyTorch's allocate: a pointer to `size` bytes on `device`, ordered
    /// on `stream`; null when it cannot be served (every recovery step
    /// having run inside the service first) or a size of 0.
    pub fn allocate(&self, size: usize, device: i32, stream: usize) -> usize {
        if size == 0 || !self.usable() {
            return 0;
        }
        let Some(dev) = self.device(device) else {
            return 0;
        };
        dev.release_finished();
        let Some(handle) = self.stream(dev, stream) else {
            return 0;
        };
        let size = size as u64;
        let allocation = match handle.reserve(size) {
            Ok(allocation) => allocation,
            Err(err) => {
                self.refuse(Refusal::OutOfMemory, || {
                    format!("{} on device {device}: {}", Bytes(size), short(&err))
                });
                return 0;
            }
        };
        let pinned = match handle.resolve(&allocation) {
            Ok(pinned) => pinned,
            Err(err) => {
                self.refuse(Refusal::OutOfMemory, || format!("no address: {err}"));
                return 0;
            }
        };
        let ptr = pinned.resource().addr as usize;
        // Counted before the pointer can be freed (by a wrong guess on
        // another thread): the ledger never counts a free before its
        // allocation.
        self.count(device, stream, TraceAction::Alloc, ptr, size);
        dev.live.insert(
            ptr,
            Held {
                _pinned: pinned,
                _allocation: allocation,
                size,
                stream,
                used_on: Vec::new(),
            },
        );
        ptr
    }

    /// PyTorch's free.
    pub fn free(&self, ptr: usize, size: usize, device: i32, stream: usize) {
        if ptr == 0 || !self.usable() {
            return;
        }
        let dev = usize::try_from(device)
            .ok()
            .and_then(|index| self.devices.get(index));
        let held = dev.as_ref().and_then(|dev| dev.live.remove(ptr));
        let (Some(dev), Some(held)) = (dev, held) else {
            self.refuse(Refusal::UnknownFree, || {
                format!("free of {ptr:#x} on device {device}: not handed out by this library, or freed already")
            });
            return;
        };
        if held.size != size as u64 {
            self.refuse(Refusal::SizeMismatch, || {
                format!(
                    "free of {ptr:#x} with size {size}: it was allocated with {}",
                    held.size
                )
            });
        }
        let _ = stream;
        self.count(device, held.stream, TraceAction::Free, ptr, held.size);
        // The pin goes, then the handle: the memory goes back to its
        // stream (once other streams that used it are done).
        dev.release(held);
        dev.release_finished();
    }

    /// PyTorch's `record_stream`: `stream` uses `ptr` from now on, so its
    /// free waits for that stream's work (on a GPU; host memory has
    /// nothing to order).
    pub fn record_stream(&self, ptr: usize, stream: usize) {
        if !self.usable() {
            return;
        }
        let known = self.devices.made().any(|(_, dev)| {
            let recorded = dev.live.with_mut(ptr, |held| {
                if held.stream != stream && !held.used_on.contains(&stream) {
                    held.used_on.push(stream);
                }
            });
            recorded.is_some()
        });
        if !known {
            self.refuse(Refusal::UnknownRecord, || {
                format!("record_stream of {ptr:#x} on stream {stream:#x}: not handed out by this library")
            });
        }
    }

    /// PyTorch's `empty_cache`: every stream gives back what no allocation
    /// holds.
    pub fn empty_cache(&self) {
        if !self.usable() {
            return;
        }
        for (_, dev) in self.devices.made() {
            for stream in dev.streams.iter() {
                let _ = stream.cleanup(Cleanup::Explicit);
            }
        }
    }

    /// PyTorch's `set_per_process_memory_fraction`: applies to a device not
    /// yet used (its budget is fixed when it is made).
    pub fn set_memory_fraction(&self, fraction: f64, device: i32) {
        if !self.usable() {
            return;
        }
        let unused = usize::try_from(device).is_ok_and(|index| {
            fraction > 0.0
                && fraction <= 1.0
                && self.devices.unless_made(index, || {
                    self.fractions.lock().insert(device, fraction);
                })
        });
        if !unused {
            self.refuse(Refusal::BadFraction, || {
                format!(
                    "memory fraction {fraction} on device {device}: a fraction in (0, 1], set before the device's first allocation"
                )
            });
        }
    }

    /// Start or stop recording the process's trace.
    pub fn set_recording(&self, on: bool) {
        self.ledger.set_recording(on);
    }

    /// Write the trace recorded so far as JSON Lines (`streamalloc replay`
    /// and `--plot` read it).
    pub fn dump_trace(&self, path: &std::path::Path) -> Result<u64, String> {
        let events = self
            .ledger
            .trace()
            .ok_or("no trace is being recorded (STREAMALLOC_TORCH_RECORD=1, or streamalloc_set_recording(1))")?;
        let meta = TraceMeta {
            source: "streamalloc-torch".into(),
            ..TraceMeta::default()
        };
        let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut out = std::io::BufWriter::new(file);
        write_trace_jsonl(&meta, &events, &mut out)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        use std::io::Write;
        out.flush()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(events.len() as u64)
    }

    /// Every device's figures, as JSON (in a forked child, the counts
    /// alone: the devices' threads stayed in the parent).
    pub fn stats(&self) -> Value {
        let forked = !self.process.is_current();
        // A forked child's devices are its parent's; a shut library's are
        // shut.
        let devices: Vec<(usize, &Device)> = if forked || self.shut.load(Ordering::Acquire) {
            Vec::new()
        } else {
            self.devices.made().collect()
        };
        let per_device: Vec<Value> = devices
            .iter()
            .map(|(id, dev)| {
                let stats = dev.supervisor.device_stats();
                let streams: Vec<Value> = dev
                    .supervisor
                    .stats()
                    .iter()
                    .map(|s| {
                        json!({
                            "stream": s.stream.0,
                            "bytes_in_use": s.bytes_in_use,
                            "bytes_reserved": s.bytes_reserved,
                            "peak_bytes_reserved": s.peak_bytes_reserved,
                            "reservations": s.reservations,
                        })
                    })
                    .collect();
                let reports: Vec<_> = (dev.streams.iter())
                    .filter_map(|handle| handle.report().ok())
                    .collect();
                let driver = (reports.iter())
                    .fold(streamalloc::storage::DriverOps::default(), |ops, r| {
                        ops.combine(r.driver)
                    });
                // What each path (growth, round, settle...) asked, priced
                // as an H200 would charge it (`docs/trace.md`, "The driver,
                // by path").
                let by_path: serde_json::Map<String, Value> = (reports.iter())
                    .fold(streamalloc::storage::DriverPaths::default(), |paths, r| {
                        paths.combine(r.driver_paths)
                    })
                    .priced(1, &streamalloc::storage::DriverCosts::H200)
                    .into_iter()
                    .map(|cost| {
                        let figures = json!({
                            "calls": cost.calls,
                            "modeled_ns": cost.modeled_ns,
                            "granules_mapped": cost.granules_mapped,
                        });
                        (cost.path.to_string(), figures)
                    })
                    .collect();
                json!({
                    "device": id,
                    "live_allocations": dev.live.len(),
                    "bytes_in_use": stats.bytes_in_use,
                    "peak_bytes_in_use": stats.peak_bytes_in_use,
                    "bytes_reserved": stats.bytes_reserved,
                    "peak_bytes_reserved": stats.peak_bytes_reserved,
                    "budget": dev.supervisor.budget().map(|b| b.limit()),
                    "streams": streams,
                    "driver": driver,
                    "driver_by_path": by_path,
                })
            })
            .collect();
        let refusals: serde_json::Map<String, Value> = {
            let counted = self.refusals.lock();
            Refusal::ALL
                .iter()
                .map(|kind| {
                    (
                        kind.name().to_string(),
                        json!(counted.get(kind).copied().unwrap_or(0)),
                    )
                })
                .collect()
        };
        let (allocations, frees) = self.ledger.calls();
        json!({
            "allocations": allocations,
            "frees": frees,
            "live_bytes": self.ledger.live(),
            "peak_live_bytes": self.ledger.peak(),
            "refusals": refusals,
            "recording": self.ledger.recording(),
            "devices": per_device,
        })
    }

    /// Give every device's memory back; later calls are refused.
    pub fn shutdown(&self) {
        if self.shut.swap(true, Ordering::AcqRel) {
            return;
        }
        for (_, dev) in self.devices.made() {
            #[cfg(feature = "cuda")]
            if let Some(context) = &dev.context {
                // What waits for other streams: they finish first.
                let _ = context.synchronize();
                dev.waiting.clear();
            }
            dev.live.clear();
            // Its handles stay, answering `StreamStopped` (no call gets
            // past `usable` from now on).
            dev.supervisor.shutdown();
        }
    }
}

/// A supervisor whose streams take memory from GPU `device`, in its
/// primary context (the one PyTorch uses).
///
/// Each streamalloc stream orders its work on the CUDA stream PyTorch
/// passed for it (`cuda_streams`, by stream id), borrowed: memory goes
/// back once that stream is done with it, and frees that other streams
/// used wait for them first (`uses.rs`). PyTorch's default stream is the
/// legacy null stream: its storage orders on it the same way
/// (`CudaStorage::on_default_stream`), an event there passing only after
/// the earlier work of every blocking stream too.
#[cfg(feature = "cuda")]
fn cuda_supervisor(
    device: i32,
    service: streamalloc::service::ServiceConfig,
    cuda_streams: Arc<Mutex<HashMap<u32, usize>>>,
) -> Result<Supervisor, String> {
    use streamalloc::storage::{CudaStorage, DeviceStorage};
    let ordinal = usize::try_from(device).map_err(|_| format!("device {device}"))?;
    let context = CudaStorage::context(ordinal).map_err(|e| e.to_string())?;
    Ok(Supervisor::new(
        service,
        Box::new(move |id| {
            let stream = cuda_streams.lock().get(&id.0).copied().unwrap_or(0);
            let storage = if stream == 0 {
                CudaStorage::on_default_stream(context.clone())
            } else {
                // SAFETY: PyTorch passed this stream for allocations it
                // orders on it, and keeps its streams for the life of the
                // process (its stream pools never destroy them).
                unsafe { CudaStorage::on_borrowed_stream(context.clone(), stream as _) }
            };
            storage.map(|storage| Box::new(storage) as Box<dyn DeviceStorage>)
        }),
    ))
}

#[cfg(not(feature = "cuda"))]
fn cuda_supervisor(
    device: i32,
    _service: streamalloc::service::ServiceConfig,
    _cuda_streams: Arc<Mutex<HashMap<u32, usize>>>,
) -> Result<Supervisor, String> {
    Err(format!(
        "device {device}: this build has no CUDA support (build with --features cuda)"
    ))
}

/// The first line of an error, short enough for a log.
fn short(err: &ServiceError) -> String {
    let text = err.to_string();
    match text.char_indices().nth(300) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}
