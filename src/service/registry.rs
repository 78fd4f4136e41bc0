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
use super::message::{Lender, Lends};
use super::protocol::{Control, LendAsk, ShutdownReport};
use super::shared::StreamShared;
use crate::memory::StreamId;
use crate::sync::Mutex;
use crate::sync::channel::Sender;
use crate::sync::thread::JoinHandle;
use std::collections::BTreeMap;

/// One registered stream.
#[derive(Debug)]
pub(crate) struct StreamEntry {
    /// A handle kept so the actor lives until the stream is removed.
    pub(crate) handle: StreamHandle,
    /// The coordinator's control channel to it (unbounded).
    pub(crate) control: Sender<Control>,
    /// Its actor, as another stream's lending job takes its turn
    /// (`lending.rs`), whether or not its clients serve in place.
    pub(crate) lender: Box<dyn Lends>,
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

/// A request past the headroom asks at most this many streams, the
/// roomiest first, to serve it from their room before a round asks any to
/// give back: past the second, a stream's room rarely holds a block the
/// first two lacked, and each ask is a turn of its own.
pub(crate) const MAX_LENDERS: usize = 2;

/// The streams that may serve `ask` for `asker`, in order: those whose
/// room their clients do not use holds the request, the roomiest first
/// (ties by stream, so every run asks the same), at most [`MAX_LENDERS`].
/// Room is not a block: a lender whose free room is in pieces refuses,
/// and the next is asked.
pub(crate) fn lenders(
    streams: &BTreeMap<StreamId, StreamEntry>,
    asker: StreamId,
    ask: &LendAsk,
) -> Vec<Lender> {
    let requested = super::message::requested(&ask.sizes);
    let mut room = room_of_others(streams, asker, requested);
    roomiest_first(&mut room);
    room.into_iter()
        .take(MAX_LENDERS)
        .map(|(_, stream)| Lender {
            stream,
            seat: streams[&stream].lender.cloned(),
        })
        .collect()
}

/// The other running streams of `asker`'s device that hold at least
/// `least` bytes beyond their clients', with those bytes, in stream order.
pub(crate) fn room_of_others(
    streams: &BTreeMap<StreamId, StreamEntry>,
    asker: StreamId,
    least: u64,
) -> Vec<(u64, StreamId)> {
    (streams.iter())
        .filter(|(other, entry)| **other != asker && entry.handle.is_running())
        .map(|(other, entry)| (entry.shared().unused_at_most(), *other))
        .filter(|&(unused, _)| unused >= least)
        .collect()
}

/// The roomiest first; ties by stream, so every run asks the same.
pub(crate) fn roomiest_first(room: &mut [(u64, StreamId)]) {
    room.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
}
