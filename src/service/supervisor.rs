//! `Supervisor`: owns a device — the registry of its streams and their
//! lifecycles — and spawns one `StreamActor` per stream.

use super::actor::{ActorTiming, StreamActor};
use super::error::ServiceError;
use super::handle::{Connection, StreamHandle};
use super::message::ShutdownReport;
use super::shared::{StreamShared, StreamStats};
use crate::memory::{MemoryConfig, MemoryManager, StreamId};
use crate::storage::{DeviceStorage, HostStorage, StorageError, VirtualStorage};
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::channel;
use crate::sync::thread::{self, JoinHandle};
use crate::sync::{Arc, Mutex};
use std::collections::HashMap;
use std::time::Duration;

/// Makes the storage of each new stream.
pub type StorageFactory =
    Box<dyn Fn(StreamId) -> Result<Box<dyn DeviceStorage>, StorageError> + Send + Sync>;

/// How the service runs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Each stream's manager.
    pub memory: MemoryConfig,
    /// Requests a stream's inbox holds before senders wait.
    pub inbox_capacity: usize,
    /// A stream with no request for this long runs an idle cleanup
    /// (`None`: never).
    pub idle_tick: Option<Duration>,
    /// How long a shutdown waits for pinned allocations to be unpinned.
    pub pin_wait: Duration,
    /// Receive attempts before a thread parks (actor and callers).
    pub spin: u32,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            memory: MemoryConfig::default(),
            inbox_capacity: 1024,
            idle_tick: Some(Duration::from_millis(100)),
            pin_wait: Duration::from_millis(200),
            spin: 200,
        }
    }
}

/// One registered stream.
struct StreamEntry {
    /// A handle kept so the actor lives until removed.
    handle: StreamHandle,
    /// The actor's thread.
    thread: Option<JoinHandle<()>>,
}

/// Owns a device's streams.
pub struct Supervisor {
    /// Shared settings.
    config: ServiceConfig,
    /// Storage per new stream.
    factory: StorageFactory,
    /// The registry.
    streams: Mutex<HashMap<StreamId, StreamEntry>>,
    /// Set once shut down.
    stopped: AtomicBool,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("config", &self.config)
            .field("streams", &self.streams.lock().len())
            .finish_non_exhaustive()
    }
}

impl Supervisor {
    /// A supervisor whose streams get their storage from `factory`.
    pub fn new(config: ServiceConfig, factory: StorageFactory) -> Self {
        Self {
            config,
            factory,
            streams: Mutex::new(HashMap::new()),
            stopped: AtomicBool::new(false),
        }
    }

    /// Streams on host memory.
    pub fn host(config: ServiceConfig) -> Self {
        Self::new(config, Box::new(|_| Ok(Box::new(HostStorage::new()))))
    }

    /// Streams on a [`VirtualStorage`] (counts bytes, holds none).
    pub fn virtual_device(config: ServiceConfig) -> Self {
        Self::new(config, Box::new(|_| Ok(Box::new(VirtualStorage::new()))))
    }

    /// The handle of stream `id`, spawning its actor if it has none (or
    /// replacing one that stopped or failed).
    pub fn stream(&self, id: StreamId) -> Result<StreamHandle, ServiceError> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(ServiceError::SupervisorStopped);
        }
        let mut streams = self.streams.lock();
        if let Some(entry) = streams.get(&id) {
            if entry.handle.connection.shared.is_running() {
                return Ok(entry.handle.clone());
            }
            if let Some(mut old) = streams.remove(&id) {
                if let Some(thread) = old.thread.take() {
                    let _ = thread.join();
                }
            }
        }
        let entry = self.spawn(id)?;
        let handle = entry.handle.clone();
        streams.insert(id, entry);
        Ok(handle)
    }

    fn spawn(&self, id: StreamId) -> Result<StreamEntry, ServiceError> {
        let storage = (self.factory)(id).map_err(|err| ServiceError::StorageUnavailable {
            stream: id,
            message: err.to_string(),
        })?;
        let memory = MemoryManager::for_stream(storage, self.config.memory.clone(), id);
        let shared = Arc::new(StreamShared::new(id));
        let (inbox_tx, inbox_rx) = channel::bounded(self.config.inbox_capacity.max(1));
        let connection = Arc::new(Connection {
            inbox: inbox_tx,
            shared: shared.clone(),
            owner: memory.owner_id(),
            spin: self.config.spin,
        });
        let timing = ActorTiming {
            spin: self.config.spin,
            idle_tick: self.config.idle_tick,
            pin_wait: self.config.pin_wait,
        };
        let actor = StreamActor::new(memory, shared, timing);
        let thread = thread::spawn(format!("streamalloc-{}", id.0), move || actor.run(inbox_rx))
            .map_err(|err| ServiceError::StorageUnavailable {
                stream: id,
                message: format!("cannot spawn the stream's thread: {err}"),
            })?;
        Ok(StreamEntry {
            handle: StreamHandle::new(connection),
            thread: Some(thread),
        })
    }

    /// Shut stream `id` down and forget it.
    pub fn remove_stream(&self, id: StreamId) -> Result<ShutdownReport, ServiceError> {
        let entry = self.streams.lock().remove(&id);
        let Some(mut entry) = entry else {
            return Err(ServiceError::StreamStopped(id));
        };
        let report = entry.handle.shutdown();
        if let Some(thread) = entry.thread.take() {
            let _ = thread.join();
        }
        report
    }

    /// Counters of every stream.
    pub fn stats(&self) -> Vec<StreamStats> {
        let mut stats: Vec<_> = self
            .streams
            .lock()
            .values()
            .map(|entry| entry.handle.stats())
            .collect();
        stats.sort_by_key(|s| s.stream);
        stats
    }

    /// Stop every stream (each drains, waits for pins, returns every page)
    /// and join their threads. Handles that outlive it answer
    /// `StreamStopped`. Idempotent.
    pub fn shutdown(&self) -> Vec<Result<ShutdownReport, ServiceError>> {
        self.stopped.store(true, Ordering::Release);
        let entries: Vec<_> = self.streams.lock().drain().collect();
        let mut reports = Vec::new();
        for (_, mut entry) in entries {
            reports.push(entry.handle.shutdown());
            if let Some(thread) = entry.thread.take() {
                let _ = thread.join();
            }
        }
        reports
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.shutdown();
    }
}
