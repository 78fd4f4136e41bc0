//! The supervisor's coordinator: one thread per device that runs the
//! protocols crossing streams. It is event-driven (each notice is one
//! step), never blocks on an actor, and talks to actors only on unbounded
//! control channels plus a non-blocking wake.
//!
//! - Running short (or growing past the headroom): a `Short` notice queues
//!   a recovery *episode*; one runs at a time. The coordinator sends
//!   `GiveBack` to every other running stream that may give back (it held
//!   pages beyond its use when it last published, or releases wait that it
//!   has not seen), counts their `GaveBack` answers (or gives up after a
//!   timeout), then sends `Retry` to the short stream.
//! - Compaction: on each tick, a stream whose reserved / in-use passed the
//!   threshold is sent `Compact` (at most once a second per stream).
//! - Events: passed on to every subscriber.

use super::device::{DeviceShared, Notice};
use super::events::SupervisorEvent;
use super::message::Control;
use super::settle::{Settle, SettleWatch};
use crate::memory::StreamId;
use crate::sync::channel::{Receiver, RecvError, Sender};
use crate::sync::{Arc, Mutex};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Compaction is not scheduled for less than this to win back.
const MIN_COMPACTION_GAIN: u64 = 4 << 20;
/// Nor more often than this per stream.
const COMPACTION_INTERVAL: Duration = Duration::from_secs(1);

/// Where events go.
pub(crate) type Subscribers = Arc<Mutex<Vec<Sender<SupervisorEvent>>>>;

/// One recovery round for a short stream.
#[derive(Debug)]
struct Episode {
    /// Its number (answers name it).
    id: u64,
    /// The short stream.
    stream: StreamId,
    /// Streams that have not answered yet.
    waiting: Vec<StreamId>,
    /// Bytes the others returned so far.
    freed: u64,
    /// When it began.
    started: Instant,
}

/// The coordinator's state.
#[derive(Debug)]
pub(crate) struct Coordinator {
    /// The device, whose registry reaches every stream.
    device: Arc<DeviceShared>,
    subscribers: Subscribers,
    /// Short streams waiting for an episode (stream, bytes asked).
    queue: VecDeque<(StreamId, u64)>,
    /// The episode under way.
    active: Option<Episode>,
    next_episode: u64,
    /// Reserved / in-use past which a stream is asked to compact.
    compaction_threshold: Option<f64>,
    /// An episode whose answers do not all come in this long ends anyway.
    episode_timeout: Duration,
    /// When each stream was last asked to compact.
    last_compaction: HashMap<StreamId, Instant>,
    /// Settling, if on, and what it watches of each stream.
    settle: Option<Settle>,
    settle_watch: HashMap<StreamId, SettleWatch>,
}

impl Coordinator {
    pub(crate) fn new(
        device: Arc<DeviceShared>,
        subscribers: Subscribers,
        compaction_threshold: Option<f64>,
        episode_timeout: Duration,
        settle: Option<Settle>,
    ) -> Self {
        Self {
            device,
            subscribers,
            queue: VecDeque::new(),
            active: None,
            next_episode: 1,
            compaction_threshold,
            episode_timeout,
            last_compaction: HashMap::new(),
            settle,
            settle_watch: HashMap::new(),
        }
    }

    /// One notice; `false` once told to stop.
    pub(crate) fn handle(&mut self, notice: Notice) -> bool {
        match notice {
            Notice::Short {
                stream,
                requested,
                headroom,
            } => {
                self.emit(if headroom {
                    SupervisorEvent::HeadroomReached { stream, requested }
                } else {
                    SupervisorEvent::RanShort { stream, requested }
                });
                let known = self.active.as_ref().is_some_and(|e| e.stream == stream)
                    || self.queue.iter().any(|(s, _)| *s == stream);
                if !known {
                    self.queue.push_back((stream, requested));
                }
                self.start_next();
            }
            Notice::GaveBack {
                stream,
                episode,
                freed,
            } => {
                if let Some(active) = self.active.as_mut().filter(|e| e.id == episode) {
                    active.waiting.retain(|s| *s != stream);
                    active.freed = active.freed.saturating_add(freed);
                    if active.waiting.is_empty() {
                        self.finish();
                    }
                }
            }
            Notice::Event(event) => self.emit(event),
            Notice::Stop => return false,
        }
        true
    }

    fn start_next(&mut self) {
        while self.active.is_none() {
            let Some((stream, _)) = self.queue.pop_front() else {
                return;
            };
            let streams = self.device.registry.lock();
            if !streams.contains_key(&stream) {
                continue;
            }
            let id = self.next_episode;
            self.next_episode = self.next_episode.wrapping_add(1);
            // Only streams that hold pages beyond their use can give back
            // (or have releases waiting that may free some): the others
            // are not woken.
            let others: Vec<StreamId> = streams
                .iter()
                .filter(|(other, link)| {
                    **other != stream && link.handle.is_running() && link.handle.may_give_back()
                })
                .map(|(other, _)| *other)
                .collect();
            for other in &others {
                streams[other].send(Control::GiveBack { episode: id });
            }
            drop(streams);
            self.active = Some(Episode {
                id,
                stream,
                waiting: others,
                freed: 0,
                started: Instant::now(),
            });
            if self.active.as_ref().is_some_and(|e| e.waiting.is_empty()) {
                self.finish();
            }
        }
    }

    /// End the active episode: tell the short stream to retry.
    fn finish(&mut self) {
        let Some(episode) = self.active.take() else {
            return;
        };
        self.emit(SupervisorEvent::GaveBack {
            stream: episode.stream,
            freed: episode.freed,
        });
        if let Some(link) = self.device.registry.lock().get(&episode.stream) {
            link.send(Control::Retry);
        }
        self.start_next();
    }

    /// Periodic work: end an episode that waited too long, schedule
    /// compactions.
    pub(crate) fn tick(&mut self) {
        if self
            .active
            .as_ref()
            .is_some_and(|e| e.started.elapsed() > self.episode_timeout)
        {
            self.finish();
        }
        self.schedule_settles();
        let Some(threshold) = self.compaction_threshold else {
            return;
        };
        let mut scheduled = Vec::new();
        for (stream, link) in self.device.registry.lock().iter() {
            let stats = link.handle.stats();
            let gain = stats.bytes_reserved.saturating_sub(stats.bytes_in_use);
            let recently = self
                .last_compaction
                .get(stream)
                .is_some_and(|at| at.elapsed() < COMPACTION_INTERVAL);
            if link.handle.is_running()
                && !recently
                && gain >= MIN_COMPACTION_GAIN
                && stats.bytes_reserved as f64 > stats.bytes_in_use as f64 * threshold
            {
                link.send(Control::Compact);
                scheduled.push(*stream);
            }
        }
        for stream in scheduled {
            self.last_compaction.insert(stream, Instant::now());
            self.emit(SupervisorEvent::CompactionScheduled(stream));
        }
    }

    /// Tell each stream that holds more than it needed within the settle
    /// window to settle (see `settle.rs`).
    fn schedule_settles(&mut self) {
        let Some(settle) = self.settle else {
            return;
        };
        let now = Instant::now();
        let mut scheduled = Vec::new();
        {
            let streams = self.device.registry.lock();
            self.settle_watch
                .retain(|stream, _| streams.contains_key(stream));
            for (stream, link) in streams.iter() {
                if !link.handle.is_running() {
                    continue;
                }
                let watch = self.settle_watch.entry(*stream).or_default();
                if let Some((reserved, keep)) = watch.observe(&settle, &link.handle, now) {
                    link.send(Control::Settle { keep });
                    scheduled.push(SupervisorEvent::SettleScheduled {
                        stream: *stream,
                        reserved,
                        keep,
                    });
                }
            }
        }
        for event in scheduled {
            self.emit(event);
        }
    }

    fn emit(&self, event: SupervisorEvent) {
        let mut subscribers = self.subscribers.lock();
        subscribers.retain(|subscriber| subscriber.send(event.clone()).is_ok());
    }

    /// The coordinator's loop.
    pub(crate) fn run(mut self, notices: Receiver<Notice>, tick: Duration) {
        let mut last_tick = Instant::now();
        loop {
            match notices.recv_timeout(tick) {
                Ok(notice) => {
                    if !self.handle(notice) {
                        return;
                    }
                }
                Err(RecvError::Disconnected) => return,
                Err(RecvError::Empty) => {}
            }
            if last_tick.elapsed() >= tick {
                last_tick = Instant::now();
                self.tick();
            }
        }
    }
}
