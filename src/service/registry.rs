//! The one registry of a device's streams.
//!
//! `DeviceShared::registry` maps each running stream to its entry: a
//! handle (which keeps the actor alive until the stream is removed), the
//! coordinator's control channel to it, and its thread. The supervisor
//! adds and removes entries; the coordinator sends control through them;
//! actors read the others' published counters through them (give-back
//! estimates, out-of-memory breakdowns). `wiring.rs` builds the entries.

use super::error::ServiceError;
use super::handle::StreamHandle;
use super::in_place::SharedActor;
use super::protocol::{Control, ShutdownReport};
use super::shared::StreamShared;
use crate::memory::StreamId;
use crate::sync::channel::Sender;
use crate::sync::thread::JoinHandle;
use crate::sync::{Arc, Mutex};
use std::collections::BTreeMap;

/// One registered stream.
#[derive(Debug)]
pub(crate) struct StreamEntry {
    /// A handle kept so the actor lives until the stream is removed.
    pub(crate) handle: StreamHandle,
    /// The coordinator's control channel to it (unbounded).
    pub(crate) control: Sender<Control>,
    /// Its actor's seat, whose turn another stream's lending job takes
    /// (`lending.rs`) whether or not its clients serve in place.
    pub(crate) seat: Arc<SharedActor>,
    /// The actor's thread, once spawned.
    pub(crate) thread: Option<JoinHandle<()>>,
    /// Whether timer-driven control wakes the actor (see `Wiring`).
    pub(crate) wake_for_timers: bool,
}

impl StreamEntry {
    /// Send control traffic, and wake the actor to look at it (timer
    /// traffic on a manual clock waits for the tick's barrier instead).
    pub(crate) fn send(&self, control: Control) {
        let wake = self.wake_for_timers || !control.is_timer();
        if self.control.send(control).is_ok() && wake {
            self.handle.connection.wake();
        }
    }

    /// What the actor publishes.
    pub(crate) fn shared(&self) -> &StreamShared {
        &self.handle.connection.shared
    }

    /// Shut the stream down and wait for its thread.
    pub(crate) fn stop(mut self) -> Result<ShutdownReport, ServiceError> {
        let report = self.handle.shutdown();
        self.join();
        report
    }

    /// Wait for the actor's thread (one that already left its loop).
    pub(crate) fn join(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The streams of a device, by id (ordered, so every walk over them is
/// the same on every run).
pub(crate) type Registry = Mutex<BTreeMap<StreamId, StreamEntry>>;
