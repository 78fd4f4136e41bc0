//! The supervisor's coordinator: one thread per device that runs the
//! protocols crossing streams. It is event-driven (each notice is one
//! step), never blocks on an actor, and talks to actors only on unbounded
//! control channels plus a non-blocking wake.
//!
//! The long form: `docs/modules.md`, "`src/service/coordinator.rs`".

use super::device::{DeviceShared, Notice};
use super::events::SupervisorEvent;
use super::protocol::Control;
use super::registry::{room_of_others, roomiest_first};
use super::seat::Seat;
use super::settle::{Settle, SettleWatch};
use crate::clock::SharedClock;
use crate::memory::StreamId;
use crate::sync::channel::{self, Receiver, RecvError, Sender};
use crate::sync::{Arc, Mutex};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// Compaction is not scheduled for less than this to win back.
const MIN_COMPACTION_GAIN: u64 = 4 << 20;
/// Nor more often than this per stream.
const COMPACTION_INTERVAL: Duration = Duration::from_secs(1);

/// Where events go.
pub(crate) type Subscribers = Arc<Mutex<Vec<Sender<SupervisorEvent>>>>;

/// A stream waiting for its recovery round.
#[derive(Debug)]
struct Asker {
    stream: StreamId,
    /// Past the headroom: the most bytes the device held past it, with
    /// the asker's request grown, as the asker asked while queued.
    lacks: u64,
    /// Short of memory (not only past the headroom): the givers wait for
    /// what they give back to be gone before they answer, since this is
    /// the asker's last try before `OutOfMemory`.
    short: bool,
}

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
    /// When it began (on the service's clock).
    started: Duration,
}

/// What the coordinator remembers of one stream for its idle tick.
#[derive(Debug, Clone, Copy)]
struct IdleWatch {
    /// The stream's request count when last looked at.
    requests: u64,
    /// When that count last changed, or the stream was last told `Idle`.
    since: Duration,
    /// Told `Idle` in this quiet spell, with its clients' returns counted
    /// then (told again only if they gave more back).
    told: Option<u64>,
}

/// The coordinator's timing, all on the service's clock.
#[derive(Debug, Clone)]
pub(crate) struct Timers {
    /// The clock.
    pub(crate) clock: SharedClock,
    /// An episode whose answers do not all come in this long ends anyway
    /// (a safety net: a manual clock does not move while a replay waits,
    /// so there it never fires).
    pub(crate) episode_timeout: Duration,
    /// A stream that served no request this long tidies up (`None`: never).
    pub(crate) idle_tick: Option<Duration>,
}

/// The coordinator's state.
#[derive(Debug)]
pub(crate) struct Coordinator {
    /// The device, whose registry reaches every stream.
    device: Arc<DeviceShared>,
    subscribers: Subscribers,
    /// Streams waiting for an episode, in the order they asked.
    queue: VecDeque<Asker>,
    /// The episode under way.
    active: Option<Episode>,
    next_episode: u64,
    /// Reserved / in-use past which a stream is asked to compact.
    compaction_threshold: Option<f64>,
    /// The clock and the timeouts.
    timers: Timers,
    /// When each stream was last asked to compact.
    last_compaction: HashMap<StreamId, Duration>,
    /// What the idle tick watches of each stream.
    idle_watch: HashMap<StreamId, IdleWatch>,
    /// Settling, if on, and what it watches of each stream.
    settle: Option<Settle>,
    settle_watch: HashMap<StreamId, SettleWatch>,
}

impl Coordinator {
    pub(crate) fn new(
        device: Arc<DeviceShared>,
        subscribers: Subscribers,
        compaction_threshold: Option<f64>,
        timers: Timers,
        settle: Option<Settle>,
    ) -> Self {
        Self {
            device,
            subscribers,
            queue: VecDeque::new(),
            active: None,
            next_episode: 1,
            compaction_threshold,
            timers,
            last_compaction: HashMap::new(),
            idle_watch: HashMap::new(),
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
                lacks,
            } => {
                let headroom = lacks.is_some();
                let lacks = lacks.unwrap_or(0);
                self.emit(if headroom {
                    SupervisorEvent::HeadroomReached { stream, requested }
                } else {
                    SupervisorEvent::RanShort { stream, requested }
                });
                let active = self.active.as_ref().is_some_and(|e| e.stream == stream);
                match self.queue.iter_mut().find(|asker| asker.stream == stream) {
                    // One episode per stream: a short one if either was.
                    Some(queued) => {
                        queued.short |= !headroom;
                        queued.lacks = queued.lacks.max(lacks);
                    }
                    None if !active => self.queue.push_back(Asker {
                        stream,
                        lacks,
                        short: !headroom,
                    }),
                    None => {}
                }
                self.start_next();
            }
            Notice::GaveBack {
                stream,
                episode,
                freed,
            } => {
                if self.active.as_ref().is_some_and(|e| e.id == episode) {
                    self.answered(stream, freed);
                }
            }
            Notice::Event(event) => {
                // A stream that ended answers no more: it gave back all.
                if let SupervisorEvent::StreamStopped(stream)
                | SupervisorEvent::StreamFailed { stream, .. } = &event
                {
                    self.answered(*stream, 0);
                }
                self.emit(event)
            }
            Notice::Tick { done } => {
                self.tick();
                // The asker waits for this; gone, it waits no more.
                let _ = done.send(());
            }
            Notice::Stop => return false,
        }
        true
    }

    /// `stream` answered the active episode (or ended), returning `freed`
    /// bytes; the last answer ends it.
    fn answered(&mut self, stream: StreamId, freed: u64) {
        let Some(active) = self.active.as_mut() else {
            return;
        };
        let before = active.waiting.len();
        active.waiting.retain(|s| *s != stream);
        if active.waiting.len() == before {
            return;
        }
        active.freed = active.freed.saturating_add(freed);
        if active.waiting.is_empty() {
            self.finish();
        }
    }

    fn start_next(&mut self) {
        while self.active.is_none() {
            let Some(Asker {
                stream,
                lacks,
                short,
            }) = self.queue.pop_front()
            else {
                return;
            };
            let streams = self.device.registry.lock();
            if !streams.contains_key(&stream) {
                continue;
            }
            let id = self.next_episode;
            self.next_episode = self.next_episode.wrapping_add(1);
            let waiting = ask_givers(&streams, id, stream, short, lacks);
            drop(streams);
            let none_asked = waiting.is_empty();
            self.active = Some(Episode {
                id,
                stream,
                waiting,
                freed: 0,
                started: self.timers.clock.now(),
            });
            if none_asked {
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

    /// Periodic work, at the clock's time now: end an episode past its
    /// safety deadline, settle, schedule compactions, tell quiet streams
    /// they are idle.
    pub(crate) fn tick(&mut self) {
        let now = self.timers.clock.now();
        if self
            .active
            .as_ref()
            .is_some_and(|e| now.saturating_sub(e.started) > self.timers.episode_timeout)
        {
            self.finish();
        }
        self.schedule_settles(now);
        self.schedule_compactions(now);
        self.schedule_idle(now);
    }

    /// Tell each stream that served nothing for `idle_tick` to tidy up:
    /// once per quiet spell, again only if its clients released more since.
    fn schedule_idle(&mut self, now: Duration) {
        let Some(idle) = self.timers.idle_tick else {
            return;
        };
        let streams = self.device.registry.lock();
        self.idle_watch
            .retain(|stream, _| streams.contains_key(stream));
        for (stream, link) in streams.iter() {
            let shared = link.shared();
            let requests = shared.requests.load(crate::sync::atomic::Ordering::Relaxed);
            let released = shared.returns();
            let watch = self.idle_watch.entry(*stream).or_insert(IdleWatch {
                requests,
                since: now,
                told: None,
            });
            if watch.requests != requests {
                *watch = IdleWatch {
                    requests,
                    since: now,
                    told: None,
                };
                continue;
            }
            let quiet = now.saturating_sub(watch.since) >= idle;
            // New releases to tidy, or memory it gave back still behind
            // fences: a quiet stream polls them only when told.
            let news = watch.told.is_none_or(|seen| released != seen)
                || shared
                    .bytes_in_reclaim
                    .load(crate::sync::atomic::Ordering::Relaxed)
                    > 0;
            if quiet && news && link.handle.is_running() {
                link.send(Control::Idle);
                watch.told = Some(released);
                watch.since = now;
            }
        }
    }

    /// Ask each stream whose reserved / in-use passed the threshold (and
    /// that would win back enough) to compact.
    fn schedule_compactions(&mut self, now: Duration) {
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
                .is_some_and(|at| now.saturating_sub(*at) < COMPACTION_INTERVAL);
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
            self.last_compaction.insert(stream, now);
            self.emit(SupervisorEvent::CompactionScheduled(stream));
        }
    }

    /// Tell each stream that holds more than it needed within the settle
    /// window to settle (see `settle.rs`).
    fn schedule_settles(&mut self, now: Duration) {
        let Some(settle) = self.settle else {
            return;
        };
        let mut scheduled = Vec::new();
        let mut longest = settle.window;
        {
            let streams = self.device.registry.lock();
            self.settle_watch
                .retain(|stream, _| streams.contains_key(stream));
            for (stream, link) in streams.iter() {
                if !link.handle.is_running() {
                    continue;
                }
                let watch = self.settle_watch.entry(*stream).or_default();
                if let Some((reserved, keep)) = watch.observe(&settle, link.shared(), now) {
                    link.send(Control::Settle { keep });
                    scheduled.push(SupervisorEvent::SettleScheduled {
                        stream: *stream,
                        reserved,
                        keep,
                    });
                }
                longest = longest.max(watch.window(&settle));
            }
        }
        self.device.set_settle_window(longest);
        for event in scheduled {
            self.emit(event);
        }
    }

    fn emit(&self, event: SupervisorEvent) {
        let mut subscribers = self.subscribers.lock();
        subscribers.retain(|subscriber| subscriber.send(event.clone()).is_ok());
    }
}

/// The coordinator behind the lock its turns are taken under: by its
/// thread ([`run`]) and by a tick in place ([`tick`](Seat::tick)).
pub(crate) type CoordinatorSeat = Seat<Coordinator>;

impl Seat<Coordinator> {
    /// Run the timers once, after every notice sent before: on this
    /// thread, as the coordinator's thread would at a `Notice::Tick`, when
    /// none waits for it; else as a `Notice::Tick` behind them, waiting for
    /// the coordinator's thread to get to it.
    pub(crate) fn tick(&self) {
        // In one turn: a notice counted here is not handled yet.
        let idle = |coordinator: &Coordinator| !coordinator.device.notices_waiting();
        if (self.serve_in_turn((), idle, |coordinator, ()| coordinator.tick())).is_ok() {
            return;
        }
        let device = self.turn().device.clone();
        let (done, told) = channel::bounded(1);
        device.notify(Notice::Tick { done });
        // Dropped unanswered only if the coordinator is gone.
        let _ = told.recv();
    }
}

/// The coordinator's loop: each notice in a turn of its own. On the wall
/// clock it wakes itself every `tick` to run the timers; on a manual clock
/// it only serves notices (the timers run at `Notice::Tick`, or in place).
pub(crate) fn run(seat: Arc<CoordinatorSeat>, notices: Receiver<Notice>, tick: Duration) {
    let clock = seat.turn().timers.clock.clone();
    let ticks_itself = clock.as_manual().is_none();
    let mut last_tick = clock.now();
    loop {
        let received = if ticks_itself {
            notices.recv_timeout(tick)
        } else {
            notices.recv()
        };
        match received {
            Ok(notice) => {
                let mut coordinator = seat.turn();
                let goes_on = coordinator.handle(notice);
                coordinator.device.notice_handled();
                if !goes_on {
                    return;
                }
            }
            Err(RecvError::Disconnected) => return,
            Err(RecvError::Empty) => {}
        }
        if ticks_itself && clock.now().saturating_sub(last_tick) >= tick {
            last_tick = clock.now();
            seat.turn().tick();
        }
    }
}

/// Send each giver of a round for `asker` its `GiveBack` (see [`givers`]),
/// and say which were asked.
fn ask_givers(
    streams: &std::collections::BTreeMap<StreamId, super::registry::StreamEntry>,
    episode: u64,
    asker: StreamId,
    short: bool,
    lacks: u64,
) -> Vec<StreamId> {
    let givers = givers(streams, asker, short, lacks);
    for &(other, wanted) in &givers {
        streams[&other].send(Control::GiveBack {
            episode,
            short,
            wanted,
        });
    }
    givers.into_iter().map(|(other, _)| other).collect()
}

/// The streams a round for `asker` wakes, each with what it is asked for.
/// Only streams that hold pages beyond their clients' bytes can give back:
/// the others are not woken. A stream short of memory asks every one of
/// them for everything. Past the headroom, what the asker `lacks` comes
/// from the streams that hold the most room they do not use, as many as
/// it takes, each asked for its part of it (the rest stay asleep and keep
/// their room): woken all at once, each giving back twice what the asker
/// lacked, eight streams gave back up to fourteen times that, and mapped
/// it again for their own next reservations (`docs/service.md`,
/// "Headroom", step 3).
fn givers(
    streams: &std::collections::BTreeMap<StreamId, super::registry::StreamEntry>,
    asker: StreamId,
    short: bool,
    lacks: u64,
) -> Vec<(StreamId, u64)> {
    let mut room = room_of_others(streams, asker, 1);
    if short || lacks == 0 {
        return room.into_iter().map(|(_, other)| (other, lacks)).collect();
    }
    roomiest_first(&mut room);
    let mut left = lacks;
    let mut givers = Vec::new();
    for (unused, other) in room {
        if left == 0 {
            break;
        }
        givers.push((other, unused.min(left)));
        left = left.saturating_sub(unused);
    }
    givers
}
