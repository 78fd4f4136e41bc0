//! `Supervisor`: owns a device — the registry of its streams and their
//! lifecycles — and spawns one `StreamActor` per stream.

use super::actor::ActorTiming;
use super::config::{ServiceConfig, StorageFactory};
use super::coordinator::{Coordinator, CoordinatorSeat, Subscribers, Timers};
use super::device::{DeviceShared, DeviceStats, Notice};
use super::error::ServiceError;
use super::events::{Events, SupervisorEvent};
use super::handle::StreamHandle;
use super::protocol::ShutdownReport;
use super::registry::StreamEntry;
use super::settle::Settle;
use super::shared::StreamStats;
use super::wiring::{Wiring, wire};
use crate::clock::SharedClock;
use crate::memory::StreamId;
use crate::storage::{DeviceBudget, HostStorage, VirtualStorage};
use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::sync::channel;
use crate::sync::thread::{self, JoinHandle};
use crate::sync::{Arc, Mutex};
use std::time::Duration;

/// Owns a device's streams.
pub struct Supervisor {
    /// Shared settings.
    pub(crate) config: ServiceConfig,
    /// Storage per new stream.
    factory: StorageFactory,
    /// Set once shut down, under the registry's lock (so a stream is
    /// either registered before shutdown drains the registry, or refused).
    pub(crate) stopped: AtomicBool,
    /// Held while a stream is made, so the storage factory (a CUDA context,
    /// say) runs outside the registry's lock, one stream at a time.
    creating: Mutex<()>,
    /// Held by a removal for its whole course and by shutdown before it
    /// starts, so `shutdown` returns only after every removal under way
    /// has stopped its stream.
    pub(crate) lifecycle: Mutex<()>,
    /// Awaitable removals under way (`remove_stream_async`, which cannot
    /// hold `lifecycle` across its awaits): `shutdown` waits for none left.
    pub(crate) removing: AtomicUsize,
    /// What the streams share: budget, the registry of streams
    /// (`registry.rs`), the coordinator's channel.
    pub(crate) device: Arc<DeviceShared>,
    /// Event subscribers.
    subscribers: Subscribers,
    /// The coordinator's thread.
    coordinator: Mutex<Option<JoinHandle<()>>>,
    /// The coordinator itself, for ticks run in place.
    seat: Arc<CoordinatorSeat>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("config", &self.config)
            .field("streams", &self.device.registry.lock().len())
            .finish_non_exhaustive()
    }
}

impl Supervisor {
    /// A supervisor whose streams get their storage from `factory`.
    pub fn new(config: ServiceConfig, factory: StorageFactory) -> Self {
        let (notices_tx, notices_rx) = channel::unbounded();
        let subscribers: Subscribers = Arc::new(Mutex::new(Vec::new()));
        let budget = config
            .budget
            .map(|limit| Arc::new(DeviceBudget::new(limit)));
        let device_with = |notices| {
            Arc::new(
                DeviceShared::new(budget.clone(), notices, config.cross_stream_cleanup)
                    .with_headroom(config.headroom)
                    .with_handle_shares(config.handle_share, config.shared_handle_share)
                    .with_lending(config.lend_across_streams)
                    .with_clock(config.clock.clone()),
            )
        };
        let mut device = device_with(Some(notices_tx));
        let coordinator = Coordinator::new(
            device.clone(),
            subscribers.clone(),
            config.compaction_threshold,
            Timers {
                clock: config.clock.clone(),
                episode_timeout: config.recovery_timeout,
                idle_tick: config.idle_tick,
            },
            config.settle,
        );
        let tick = config.supervise_tick;
        let seat = Arc::new(CoordinatorSeat::new(coordinator));
        let theirs = seat.clone();
        let thread = thread::spawn("streamalloc-supervisor".into(), move || {
            super::coordinator::run(theirs, notices_rx, tick)
        })
        .ok();
        if thread.is_none() {
            // No coordinator (the thread could not start, and its share of
            // the device went with it): streams manage on their own.
            device = device_with(None);
        }
        Self {
            config,
            factory,
            stopped: AtomicBool::new(false),
            creating: Mutex::new(()),
            lifecycle: Mutex::new(()),
            removing: AtomicUsize::new(0),
            device,
            subscribers,
            coordinator: Mutex::new(thread),
            seat,
        }
    }

    /// How the service runs.
    pub fn config(&self) -> &ServiceConfig {
        &self.config
    }

    /// Run the timers now, at the clock's time (settle, compaction, idle
    /// cleanups, a recovery round's safety net), and return once every
    /// stream has done what they told it. This is how time passes for a
    /// service on a [`ManualClock`](crate::clock::ManualClock): move the
    /// clock, then tick. On the wall clock the supervisor also ticks by
    /// itself every [`supervise_tick`](ServiceConfig::supervise_tick).
    ///
    /// # Errors
    /// A stream that stopped or failed on the way (one stopped before the
    /// call, by its own `shutdown` or a failure, is left out).
    pub fn tick(&self) -> Result<(), ServiceError> {
        // On this thread when no notice waits for the coordinator's
        // (`coordinator.rs`, "Ticking in place"), else behind them.
        if self.coordinator.lock().is_some() {
            self.seat.tick();
        }
        // Control is served before any request behind it: a barrier on
        // each stream (served in place when nothing is queued there, its
        // turn draining the control) and everything it was told is done.
        for handle in self.serving_handles() {
            handle.barrier()?;
        }
        Ok(())
    }

    /// Wait until every stream holds no more than the settle policy lets
    /// it keep (or two settle windows passed on the service's clock), then
    /// every stream's releases are processed and the device's totals
    /// returned: what the device holds once the load has fallen, with no
    /// explicit cleanup. Without a settle policy, the totals at once.
    ///
    /// On a manual clock nothing passes while this waits: it looks once.
    /// Move the clock past the window and [`tick`](Self::tick) first (a
    /// replay does, `replay.rs`).
    ///
    /// # Errors
    /// A stream that stopped or failed on the way (one stopped before the
    /// call, by its own `shutdown` or a failure, is left out: it holds
    /// nothing to settle).
    pub fn settled(&self) -> Result<DeviceStats, ServiceError> {
        let handles = self.serving_handles();
        for handle in &handles {
            handle.report()?;
        }
        if let Some(settling) = self.settling() {
            while !settling.over(&handles) {
                crate::sync::thread::sleep(self.config.supervise_tick);
            }
            for handle in &handles {
                handle.report()?;
            }
        }
        Ok(self.device_stats())
    }

    /// A handle of every registered stream still serving: what a
    /// device-wide call waits on. A stream its own `shutdown` stopped stays
    /// registered (its id is not reused), and a call that waited on it
    /// would fail on every call after.
    pub(crate) fn serving_handles(&self) -> Vec<StreamHandle> {
        self.device
            .registry
            .lock()
            .values()
            .map(|entry| entry.handle.clone())
            .filter(StreamHandle::is_running)
            .collect()
    }

    /// The wait of `settled`, from now, if a settle policy is on and time
    /// passes while it waits (not on a manual clock: nothing would move it).
    pub(crate) fn settling(&self) -> Option<Settling> {
        let settle = self.config.settle?;
        if self.config.clock.as_manual().is_some() {
            return None;
        }
        // Two of the longest window any stream has now (`settle.rs`).
        let wait = (settle.window.max(self.device.settle_window()))
            .saturating_mul(2)
            .saturating_add(self.config.supervise_tick.saturating_mul(4));
        let clock = self.config.clock.clone();
        Some(Settling {
            settle,
            deadline: crate::clock::deadline(clock.now(), wait),
            clock,
        })
    }

    /// The device budget, if one is set.
    pub fn budget(&self) -> Option<&Arc<DeviceBudget>> {
        self.device.budget.as_ref()
    }

    /// The device's totals across streams, with their peaks.
    pub fn device_stats(&self) -> DeviceStats {
        self.device.stats()
    }

    /// Subscribe to the supervisor's events (from now on).
    pub fn events(&self) -> Events {
        let (tx, events) = Events::channel();
        self.subscribers.lock().push(tx);
        self.device.watched.store(true, Ordering::Release);
        events
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
    ///
    /// # Errors
    /// [`ServiceError::SupervisorStopped`] once shut down,
    /// [`ServiceError::TooManyStreams`] past [`ServiceConfig::max_streams`],
    /// [`ServiceError::StorageUnavailable`] when the storage factory fails.
    pub fn stream(&self, id: StreamId) -> Result<StreamHandle, ServiceError> {
        let _creating = self.creating.lock();
        let replaced = {
            let mut streams = self.device.registry.lock();
            // Checked under the registry's lock, where `shutdown` sets it.
            if self.stopped.load(Ordering::Acquire) {
                return Err(ServiceError::SupervisorStopped);
            }
            match streams.get(&id) {
                Some(entry) if entry.shared().is_running() => return Ok(entry.handle.clone()),
                Some(_) => streams.remove(&id),
                None if streams.len() >= self.config.max_streams => {
                    return Err(ServiceError::TooManyStreams {
                        requested: streams.len().saturating_add(1),
                        limit: self.config.max_streams,
                    });
                }
                None => None,
            }
        };
        // A stream that stopped or failed: its thread has left its loop.
        if let Some(mut old) = replaced {
            old.join();
        }
        let entry = self.spawn(id)?;
        let handle = entry.handle.clone();
        let mut streams = self.device.registry.lock();
        if self.stopped.load(Ordering::Acquire) {
            // Shut down while this one was made: it never served.
            drop(streams);
            let _ = entry.stop();
            return Err(ServiceError::SupervisorStopped);
        }
        streams.insert(id, entry);
        drop(streams);
        self.device
            .notify(Notice::Event(SupervisorEvent::StreamStarted(id)));
        Ok(handle)
    }

    /// Make stream `id` (`registry::wire`) and start its actor's thread.
    fn spawn(&self, id: StreamId) -> Result<StreamEntry, ServiceError> {
        let storage = (self.factory)(id).map_err(|err| ServiceError::StorageUnavailable {
            stream: id,
            message: err.to_string(),
        })?;
        let wiring = Wiring {
            timing: ActorTiming {
                spin: self.config.calls.spin,
                pin_wait: self.config.pin_wait,
            },
            inbox_capacity: self.config.calls.inbox_capacity,
            hot_cache: self.config.calls.hot_cache,
            serve_in_place: self.config.calls.serve_in_place,
            refill_ahead: self.config.clock.as_manual().is_none(),
            wake_for_timers: self.config.clock.as_manual().is_none(),
        };
        let (seat, inbox, mut entry) = wire(
            &self.device,
            id,
            storage,
            self.config.memory.clone(),
            self.config.recorder.as_ref(),
            wiring,
        );
        let thread = thread::spawn(format!("streamalloc-{}", id.0), move || {
            super::in_place::run(seat, inbox)
        })
        .map_err(|err| ServiceError::StorageUnavailable {
            stream: id,
            message: format!("cannot spawn the stream's thread: {err}"),
        })?;
        entry.thread = Some(thread);
        Ok(entry)
    }

    /// Shut stream `id` down and forget it.
    pub fn remove_stream(&self, id: StreamId) -> Result<ShutdownReport, ServiceError> {
        let _removal = self.lifecycle.lock();
        let entry = self.device.registry.lock().remove(&id);
        match entry {
            Some(entry) => entry.stop(),
            None => Err(ServiceError::StreamStopped(id)),
        }
    }

    /// Counters of every stream.
    pub fn stats(&self) -> Vec<StreamStats> {
        // In stream order: the registry is ordered.
        self.device
            .registry
            .lock()
            .values()
            .map(|entry| entry.handle.stats())
            .collect()
    }

    /// Stop every stream (each drains, waits for pins, returns every page)
    /// and join their threads. Handles that outlive it answer
    /// `StreamStopped`. Idempotent.
    pub fn shutdown(&self) -> Vec<Result<ShutdownReport, ServiceError>> {
        // Waits for a removal under way: its stream stops before we return.
        let _lifecycle = self.lifecycle.lock();
        let entries = {
            let mut streams = self.device.registry.lock();
            self.stopped.store(true, Ordering::Release);
            std::mem::take(&mut *streams)
        };
        let reports = entries.into_values().map(StreamEntry::stop).collect();
        while self.removing.load(Ordering::SeqCst) > 0 {
            // An awaitable removal under way: its stream stops first.
            std::thread::sleep(Duration::from_millis(1));
        }
        self.stop_coordinator();
        reports
    }

    /// Tell the coordinator to return, and wait for it.
    pub(crate) fn stop_coordinator(&self) {
        if let Some(thread) = self.coordinator.lock().take() {
            self.device.notify(Notice::Stop);
            let _ = thread.join();
        }
    }
}

/// How long `settled` waits, and for what.
pub(crate) struct Settling {
    settle: Settle,
    deadline: Duration,
    clock: SharedClock,
}

impl Settling {
    /// Whether the wait is over: every stream within what the policy lets
    /// it keep, or two settle windows passed.
    pub(crate) fn over(&self, handles: &[StreamHandle]) -> bool {
        self.clock.now() >= self.deadline
            || handles.iter().all(|handle| {
                let stats = handle.stats();
                stats.bytes_reserved <= self.settle.keep(stats.bytes_in_use)
            })
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.shutdown();
    }
}
