//! The awaitable forms of the supervisor's operations, for a server that
//! runs on an async executor (tokio, say): they await the actors' answers
//! instead of blocking a worker. What blocks is brief and bounded: taking
//! a lock, spawning a stream's thread, joining a thread that has already
//! answered its shutdown.
//!
//! Waits that poll (for streams to settle, for a removal under way) await
//! a [`Ticker`]: one helper thread that ticks until the wait ends, so no
//! executor is tied to a timer of its own and no task spins.

use super::device::DeviceStats;
use super::error::ServiceError;
use super::handle::StreamHandle;
use super::protocol::ShutdownReport;
use super::registry::StreamEntry;
use super::supervisor::Supervisor;
use crate::memory::StreamId;
use crate::sync::async_channel::{self, Receiver};
use crate::sync::atomic::Ordering;
use std::time::Duration;

/// Ticks every `period` on a helper thread until dropped.
struct Ticker(Receiver<()>);

impl Ticker {
    fn every(period: Duration) -> Self {
        let (tx, rx) = async_channel::bounded(1);
        // The thread ends when the ticker is gone (its send fails).
        let _ = std::thread::Builder::new()
            .name("streamalloc-ticker".into())
            .spawn(move || {
                while tx.send(()).is_ok() {
                    std::thread::sleep(period);
                }
            });
        Self(rx)
    }

    async fn tick(&self) {
        let _ = self.0.recv_async().await;
    }
}

/// Streams still to be stopped by an awaitable shutdown or removal; if the
/// future is dropped first, they are told to shut down without waiting,
/// so no stream outlives the call it was removed by.
struct Stopping<'a> {
    entries: Vec<StreamEntry>,
    /// The removal counted in `Supervisor::removing`, if this is one.
    removal: Option<&'a Supervisor>,
}

impl Drop for Stopping<'_> {
    fn drop(&mut self) {
        for entry in &self.entries {
            entry.handle.shutdown_detached();
        }
        if let Some(supervisor) = self.removal {
            supervisor.removing.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Stopping<'_> {
    /// Stop each stream in turn, awaiting its answer.
    async fn stop_all(&mut self) -> Vec<Result<ShutdownReport, ServiceError>> {
        let mut reports = Vec::with_capacity(self.entries.len());
        // Each entry stays in `entries` until it answered, so a future
        // dropped mid-wait still tells it to shut down.
        while let Some(entry) = self.entries.last() {
            let report = entry.handle.shutdown_async().await;
            let mut entry = self.entries.pop().expect("the last entry");
            // It answered: its thread is only handing over and leaving.
            entry.join();
            reports.push(report);
        }
        reports.reverse();
        reports
    }
}

impl Supervisor {
    /// [`stream`](Self::stream), awaitable. It waits on no actor (a lock, a
    /// thread spawned for a new stream), so it never holds an executor up.
    pub async fn stream_async(&self, id: StreamId) -> Result<StreamHandle, ServiceError> {
        self.stream(id)
    }

    /// [`remove_stream`](Self::remove_stream), awaited. Cancel-safe: a
    /// future dropped before the stream answered still shuts it down.
    pub async fn remove_stream_async(&self, id: StreamId) -> Result<ShutdownReport, ServiceError> {
        let entry = {
            let mut streams = self.device.registry.lock();
            let entry = streams.remove(&id);
            if entry.is_some() {
                // Counted under the registry's lock, so a shutdown that
                // drains it after this waits for this removal.
                self.removing.fetch_add(1, Ordering::SeqCst);
            }
            entry
        };
        let Some(entry) = entry else {
            return Err(ServiceError::StreamStopped(id));
        };
        let mut stopping = Stopping {
            entries: vec![entry],
            removal: Some(self),
        };
        stopping
            .stop_all()
            .await
            .pop()
            .unwrap_or(Err(ServiceError::StreamStopped(id)))
    }

    /// [`shutdown`](Self::shutdown), awaited: each stream's answer is
    /// awaited in turn. Cancel-safe: streams not stopped yet when the
    /// future is dropped are told to shut down.
    pub async fn shutdown_async(&self) -> Vec<Result<ShutdownReport, ServiceError>> {
        let entries = {
            let mut streams = self.device.registry.lock();
            self.stopped.store(true, Ordering::Release);
            std::mem::take(&mut *streams)
        };
        let mut stopping = Stopping {
            entries: entries.into_values().rev().collect(),
            removal: None,
        };
        let reports = stopping.stop_all().await;
        // A blocking removal under way holds `lifecycle` until its stream
        // stopped; an awaitable one is counted.
        drop(self.lifecycle.lock());
        if self.removing.load(Ordering::SeqCst) > 0 {
            let ticker = Ticker::every(Duration::from_millis(1));
            while self.removing.load(Ordering::SeqCst) > 0 {
                ticker.tick().await;
            }
        }
        self.stop_coordinator();
        reports
    }

    /// [`settled`](Self::settled), awaited: the streams' reports are
    /// awaited, and so is the wait for them to settle.
    pub async fn settled_async(&self) -> Result<DeviceStats, ServiceError> {
        let handles = self.serving_handles();
        for handle in &handles {
            handle.report_async().await?;
        }
        if let Some(settling) = self.settling() {
            let ticker = Ticker::every(self.config.supervise_tick);
            while !settling.over(&handles) {
                ticker.tick().await;
            }
            for handle in &handles {
                handle.report_async().await?;
            }
        }
        Ok(self.device_stats())
    }
}
