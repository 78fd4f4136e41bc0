//! Replaying a trace through the service: each trace stream gets a stream
//! actor, each allocation a reservation, each free a dropped handle, and
//! each device of the trace its own [`Supervisor`]. What comes out is what
//! a device of that size would have needed under this allocator: peak live
//! and peak reserved bytes, failures, time per event, and where the trace
//! recorded its own allocator's device memory (a PyTorch snapshot's
//! segments), that allocator's peak beside ours.
//!
//! Events are taken one at a time ([`Replayer::event`]), so a trace read as
//! a stream replays in memory proportional to what it holds live, not to
//! its length.
//!
//! Time is the trace's: on a supervisor whose clock is a
//! [`ManualClock`](crate::clock::ManualClock) (the CLI's), the replay moves
//! the clock to each event's timestamp (one microsecond per event where the
//! trace has none) and runs the supervisor's timers as each
//! `supervise_tick` of trace time passes; at the end it moves the clock on
//! past the settle window (and the idle tick) before it reads what the
//! device holds "after the load fell". Every decision then reads exact
//! counts at a moment fixed by the trace, so one trace gives one report,
//! on any machine, under any load (the timings aside: `ns_per_op`).

use crate::memory::{Allocation, StreamId};
use crate::service::{ServiceError, StreamHandle, Supervisor};
use crate::timeline::Timeline;
use crate::trace::{TraceAction, TraceEvent};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// How far the trace's clock moves for an event without a timestamp.
pub const EVENT_STEP: Duration = Duration::from_micros(1);

/// The most devices one replay runs: each is a supervisor with a thread of
/// its own and one per stream, so a trace that names a device per line
/// (3,000 lines, 3,000 supervisors) is refused with a typed error when the
/// first device past the limit appears, before its supervisor starts. The
/// streams of all devices together are bounded too
/// ([`MAX_REPLAY_STREAMS`]).
pub const MAX_REPLAY_DEVICES: usize = 64;

/// The most streams one replay runs across all its devices (each device
/// also keeps its own `ServiceConfig::max_streams`).
pub const MAX_REPLAY_STREAMS: usize = 1024;

mod report;
mod samples;

use crate::storage::{DriverCosts, DriverOps, DriverReport};
use report::failure_reason;
pub use report::{ReplayReport, StreamReplay};
pub use samples::{LiveSamples, Sample, SampledAllocation, sample_live};

/// A device's supervisor: made for the replay, or lent by the caller.
enum Device<'s> {
    Owned(Box<Supervisor>),
    Lent(&'s Supervisor),
}

impl std::ops::Deref for Device<'_> {
    type Target = Supervisor;

    fn deref(&self) -> &Supervisor {
        match self {
            Device::Owned(supervisor) => supervisor,
            Device::Lent(supervisor) => supervisor,
        }
    }
}

/// One device being replayed.
struct DeviceRun<'s> {
    supervisor: Device<'s>,
    /// Stream index by (trace device, trace stream).
    streams: HashMap<(u32, u64), usize>,
    handles: Vec<StreamHandle>,
    /// Live bytes per stream.
    live_bytes: Vec<u64>,
    /// Each stream's own figures, by stream index (driver figures filled
    /// at the end).
    per_stream: Vec<StreamTally>,
    /// Live bytes, all streams.
    live: u64,
    /// Bytes the trace has live, allocations this allocator refused
    /// included: what `peak_live_bytes` follows (the trace's, whatever
    /// the budget).
    trace_live: u64,
    /// The recording allocator's reserved bytes now (`None` until the
    /// trace says).
    recorded: Option<i128>,
    /// When the supervisor's timers run next (trace time).
    next_tick: Duration,
    report: ReplayReport,
}

/// What a replay counts of one stream as it goes.
#[derive(Debug, Default)]
struct StreamTally {
    trace_stream: u64,
    events: u64,
    allocations: u64,
    failures: u64,
    /// Bytes the trace has live on this stream (refused ones included).
    trace_live: u64,
    peak_live: u64,
    frees: u64,
    bytes_allocated: u64,
    bytes_freed: u64,
}

impl DeviceRun<'_> {
    /// The trace allocated `size` bytes on `stream` (served or not), at
    /// event `event`.
    fn trace_allocated(&mut self, stream: usize, size: u64, event: u64) {
        self.trace_live += size;
        if self.trace_live > self.report.peak_live_bytes {
            self.report.peak_live_bytes = self.trace_live;
            self.report.peak_live_event = event;
        }
        let tally = &mut self.per_stream[stream];
        tally.trace_live += size;
        tally.peak_live = tally.peak_live.max(tally.trace_live);
    }

    /// The trace freed `size` bytes on `stream`.
    fn trace_freed(&mut self, stream: usize, size: u64) {
        self.trace_live -= size;
        self.per_stream[stream].trace_live -= size;
    }
}

impl DeviceRun<'_> {
    fn stream(&mut self, device: u32, stream: u64) -> Result<usize, ServiceError> {
        if let Some(index) = self.streams.get(&(device, stream)) {
            return Ok(*index);
        }
        let index = self.handles.len();
        let id = u32::try_from(index).map_err(|_| ServiceError::TooManyStreams {
            requested: index + 1,
            limit: u32::MAX as usize,
        })?;
        self.handles.push(self.supervisor.stream(StreamId(id))?);
        self.live_bytes.push(0);
        self.per_stream.push(StreamTally {
            trace_stream: stream,
            ..StreamTally::default()
        });
        self.streams.insert((device, stream), index);
        Ok(index)
    }

    fn reserved(&self) -> u64 {
        self.supervisor.device_stats().bytes_reserved
    }

    /// Move a manual clock to `time`, and run the timers if a tick of
    /// trace time passed (one tick however far the clock jumped: the
    /// timers look at the time, not at how often they ran).
    fn keep_time(&mut self, time: Duration) -> Result<(), ServiceError> {
        let Some(clock) = self.supervisor.config().clock.as_manual() else {
            return Ok(());
        };
        clock.advance_to(time);
        if time >= self.next_tick {
            self.supervisor.tick()?;
            self.next_tick = next_tick(time, self.supervisor.config().supervise_tick);
        }
        Ok(())
    }

    /// When the load has fallen for this device once the trace ended at
    /// `time`: the settle window (and the idle tick) past, and two ticks
    /// more. `None` off a manual clock (nothing to move).
    fn load_fallen_at(&self, time: Duration) -> Option<(Duration, Duration)> {
        let config = self.supervisor.config();
        config.clock.as_manual()?;
        let tick = config.supervise_tick.max(Duration::from_millis(1));
        let window = config.settle.map_or(Duration::ZERO, |s| s.window);
        let idle = config.idle_tick.unwrap_or(Duration::ZERO);
        let end = time
            .saturating_add(window.max(idle))
            .saturating_add(tick.saturating_mul(2));
        Some((end, tick))
    }

    /// Move a manual clock to `now` and run the timers there.
    fn tick_at(&mut self, now: Duration) -> Result<(), ServiceError> {
        if let Some(clock) = self.supervisor.config().clock.as_manual() {
            clock.advance_to(now);
            self.supervisor.tick()?;
        }
        Ok(())
    }
}

/// The trace ended at `time`: let time pass on the devices' manual clocks,
/// all of them in step, until every settle window (and idle tick) lies
/// wholly after the last event, so "after the load fell" means the same on
/// every run. In step, because devices may share one clock: a device whose
/// time was let pass on its own would leave the next one's clock already
/// at the end, and its timers (which compare two ticks' times) would never
/// see time pass.
fn let_load_fall(
    runs: &mut BTreeMap<u32, DeviceRun<'_>>,
    time: Duration,
) -> Result<(), ServiceError> {
    // The latest end, in the shortest tick.
    let due = runs
        .values()
        .filter_map(|run| run.load_fallen_at(time))
        .reduce(|(end, tick), (other_end, other_tick)| (end.max(other_end), tick.min(other_tick)));
    let Some((end, step)) = due else {
        return Ok(());
    };
    let mut now = time;
    while now < end {
        now = now.saturating_add(step);
        for run in runs.values_mut() {
            run.tick_at(now)?;
        }
    }
    Ok(())
}

/// The first multiple of `tick` after `time`.
fn next_tick(time: Duration, tick: Duration) -> Duration {
    let tick_ns = tick.as_nanos().max(1);
    let ticks = time.as_nanos() / tick_ns + 1;
    Duration::from_nanos(u64::try_from(ticks.saturating_mul(tick_ns)).unwrap_or(u64::MAX))
}

/// Drives trace events through one supervisor per device, one event at a
/// time, then reports ([`finish`](Self::finish)).
pub struct Replayer<'s> {
    /// Makes a device's supervisor (`None`: every device shares one lent
    /// supervisor, and `devices` holds only key 0).
    make: Option<Box<dyn FnMut(u32) -> Supervisor + 's>>,
    devices: BTreeMap<u32, DeviceRun<'s>>,
    /// Live allocations by (device, id): (stream index, handle).
    live: HashMap<(u32, u64), (usize, Allocation)>,
    /// Ids whose allocation failed here, with (stream index, size): their
    /// frees are expected, and they count as live in the trace until then.
    failed: HashMap<(u32, u64), (usize, u64)>,
    timeline: Option<Timeline>,
    /// Relocations already marked on the timeline.
    relocated_seen: u64,
    /// Meter peaks already marked on the timeline, per device.
    peaks_seen: BTreeMap<u32, u64>,
    events: u64,
    /// Trace time of the last event.
    time: Duration,
    started: Instant,
    /// What the driver's operations are priced at.
    costs: DriverCosts,
    /// Streams made so far, all devices.
    streams_running: usize,
    /// Whether any event had a time of its own.
    timed: bool,
    /// Bytes the trace has live, all devices (refused ones included).
    trace_live: u64,
    /// The most of those at once...
    peak_trace_live: u64,
    /// ... after this event.
    peak_live_event: u64,
}

impl std::fmt::Debug for Replayer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replayer")
            .field("devices", &self.devices.len())
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

impl<'s> Replayer<'s> {
    /// A replay whose devices each get the supervisor `make` builds.
    pub fn new(make: impl FnMut(u32) -> Supervisor + 's) -> Self {
        Self::with(Some(Box::new(make)), BTreeMap::new())
    }

    /// A replay of every device of the trace on one `supervisor` (ids and
    /// streams kept apart per device).
    pub fn on(supervisor: &'s Supervisor) -> Self {
        let mut devices = BTreeMap::new();
        devices.insert(0, Self::run(Device::Lent(supervisor), 0));
        Self::with(None, devices)
    }

    fn with(
        make: Option<Box<dyn FnMut(u32) -> Supervisor + 's>>,
        devices: BTreeMap<u32, DeviceRun<'s>>,
    ) -> Self {
        Self {
            make,
            devices,
            live: HashMap::new(),
            failed: HashMap::new(),
            timeline: None,
            relocated_seen: 0,
            peaks_seen: BTreeMap::new(),
            events: 0,
            time: Duration::ZERO,
            started: Instant::now(),
            costs: DriverCosts::default(),
            streams_running: 0,
            timed: false,
            trace_live: 0,
            peak_trace_live: 0,
            peak_live_event: 0,
        }
    }

    /// Price the devices' driver operations with `costs` (by default an
    /// NVIDIA H200's, [`DriverCosts::H200`]).
    pub fn price_with(&mut self, costs: DriverCosts) {
        self.costs = costs;
    }

    fn run(supervisor: Device<'s>, device: u32) -> DeviceRun<'s> {
        let budget = supervisor.budget().map(|b| b.limit());
        DeviceRun {
            supervisor,
            streams: HashMap::new(),
            handles: Vec::new(),
            live_bytes: Vec::new(),
            per_stream: Vec::new(),
            live: 0,
            trace_live: 0,
            recorded: None,
            next_tick: Duration::ZERO,
            report: ReplayReport::empty(Some(device), budget),
        }
    }

    /// Keep memory over time for a plot ([`timeline`](Self::timeline)).
    pub fn record_timeline(&mut self) {
        let mut timeline = Timeline::new(Vec::new(), "trace time (s)");
        timeline.budget = self
            .devices
            .values()
            .next()
            .and_then(|run| run.report.budget);
        self.timeline = Some(timeline);
    }

    /// The timeline kept so far.
    pub fn timeline(&self) -> Option<&Timeline> {
        self.timeline.as_ref()
    }

    /// Events replayed so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    fn device(&mut self, device: u32) -> &mut DeviceRun<'s> {
        device_run(
            &mut self.devices,
            &mut self.make,
            &mut self.timeline,
            device,
        )
    }

    /// Replay one event.
    ///
    /// # Errors
    /// A stream that stopped or failed, or more streams than a device runs
    /// ([`ServiceError::TooManyStreams`]). Allocations this allocator cannot
    /// serve are not errors: they are counted as failures.
    pub fn event(&mut self, event: &TraceEvent) -> Result<(), ServiceError> {
        self.events += 1;
        self.timed |= event.time_ns > 0;
        self.time = if event.time_ns > 0 {
            self.time.max(Duration::from_nanos(event.time_ns))
        } else {
            self.time.saturating_add(EVENT_STEP)
        };
        // The event's device made first if new (within the limit), then
        // every device's clock.
        let time = self.time;
        if self.make.is_some()
            && !self.devices.contains_key(&event.device)
            && self.devices.len() >= MAX_REPLAY_DEVICES
        {
            return Err(ServiceError::TooManyDevices {
                device: event.device,
                limit: MAX_REPLAY_DEVICES,
            });
        }
        self.device(event.device);
        for run in self.devices.values_mut() {
            run.keep_time(time)?;
        }
        let key = (event.device, event.id);
        // Only this event's device changes what the trace holds live.
        let run_key = if self.make.is_some() { event.device } else { 0 };
        let live_before = self.devices.get(&run_key).map_or(0, |run| run.trace_live);
        let mut failed_now = false;
        match event.action {
            TraceAction::Alloc => {
                let reused = self.live.remove(&key);
                let refused_before = self.failed.remove(&key);
                let run = device_run(
                    &mut self.devices,
                    &mut self.make,
                    &mut self.timeline,
                    event.device,
                );
                run.report.events += 1;
                if let Some((stream, old)) = reused {
                    // A pointer reused without its free: the old one is gone.
                    run.report.implicit_frees += 1;
                    run.live_bytes[stream] -= old.size();
                    run.live -= old.size();
                    run.trace_freed(stream, old.size());
                }
                if let Some((stream, size)) = refused_before {
                    run.trace_freed(stream, size);
                }
                if event.size > 0 {
                    let stream = match run.streams.get(&(event.device, event.stream)) {
                        Some(&stream) => stream,
                        None => {
                            let running = self.streams_running;
                            if running >= MAX_REPLAY_STREAMS {
                                return Err(ServiceError::TooManyStreams {
                                    requested: running + 1,
                                    limit: MAX_REPLAY_STREAMS,
                                });
                            }
                            self.streams_running += 1;
                            run.stream(event.device, event.stream)?
                        }
                    };
                    run.per_stream[stream].events += 1;
                    run.trace_allocated(stream, event.size, self.events);
                    match run.handles[stream].reserve(event.size) {
                        Ok(allocation) => {
                            run.report.allocations += 1;
                            run.per_stream[stream].allocations += 1;
                            run.per_stream[stream].bytes_allocated += event.size;
                            run.live_bytes[stream] += event.size;
                            run.live += event.size;
                            self.live.insert(key, (stream, allocation));
                        }
                        Err(err @ (ServiceError::Memory(_) | ServiceError::OutOfMemory(_))) => {
                            run.report.failures += 1;
                            run.per_stream[stream].failures += 1;
                            *run.report
                                .failure_reasons
                                .entry(failure_reason(&err).into())
                                .or_default() += 1;
                            if run.report.first_failure.is_none() {
                                run.report.first_failure = Some(format!(
                                    "event {}: {} bytes: {err}",
                                    self.events, event.size
                                ));
                            }
                            failed_now = true;
                            self.failed.insert(key, (stream, event.size));
                        }
                        Err(other) => return Err(other),
                    }
                }
            }
            TraceAction::Free => {
                let freed = self.live.remove(&key);
                let refused = match freed {
                    Some(_) => None,
                    None => self.failed.remove(&key),
                };
                let run = self.device(event.device);
                run.report.events += 1;
                match (freed, refused) {
                    (Some((stream, allocation)), _) => {
                        run.report.frees += 1;
                        let tally = &mut run.per_stream[stream];
                        tally.events += 1;
                        tally.frees += 1;
                        tally.bytes_freed += allocation.size();
                        run.live_bytes[stream] -= allocation.size();
                        run.live -= allocation.size();
                        run.trace_freed(stream, allocation.size());
                    }
                    (None, Some((stream, size))) => {
                        run.per_stream[stream].events += 1;
                        run.trace_freed(stream, size);
                    }
                    (None, None) => run.report.unknown_frees += 1,
                }
            }
            TraceAction::AllocFailure => {
                let run = self.device(event.device);
                run.report.events += 1;
                run.report.trace_failures += 1;
            }
            TraceAction::SegmentAlloc | TraceAction::SegmentFree => {
                let run = self.device(event.device);
                run.report.events += 1;
                let change = i128::from(event.size);
                let now = run.recorded.unwrap_or(0)
                    + if event.action == TraceAction::SegmentAlloc {
                        change
                    } else {
                        -change
                    };
                run.recorded = Some(now);
                let peak = u64::try_from(now.max(0)).unwrap_or(u64::MAX);
                let recorded = &mut run.report.recorded_peak_reserved_bytes;
                *recorded = Some(recorded.unwrap_or(0).max(peak));
            }
        }
        // The trace's live bytes over all devices, and when they peaked.
        let live_after = self.devices.get(&run_key).map_or(0, |run| run.trace_live);
        self.trace_live = self.trace_live + live_after - live_before;
        if self.trace_live > self.peak_trace_live {
            self.peak_trace_live = self.trace_live;
            self.peak_live_event = self.events;
        }
        if self.timeline.is_some() {
            self.sample(failed_now);
        }
        Ok(())
    }

    /// Widen the timeline's open bucket by the state after this event.
    fn sample(&mut self, failed: bool) {
        let live: u64 = self.devices.values().map(|run| run.live).sum();
        let reserved: u64 = self.devices.values().map(DeviceRun::reserved).sum();
        let recorded = self
            .devices
            .values()
            .filter_map(|run| run.recorded)
            .reduce(|a, b| a + b)
            .map(|r| u64::try_from(r.max(0)).unwrap_or(u64::MAX));
        // A peak inside a request (a page added before another went) is
        // not visible between events: the meter's exact peak, where it rose
        // during this bucket, widens the bucket to it.
        let mut rise = 0u64;
        for (device, run) in &self.devices {
            let stats = run.supervisor.device_stats();
            let seen = self.peaks_seen.entry(*device).or_insert(0);
            if stats.peak_bytes_reserved > *seen {
                rise += stats.peak_bytes_reserved - stats.bytes_reserved;
                *seen = stats.peak_bytes_reserved;
            }
        }
        let timeline = self.timeline.as_mut().expect("checked by the caller");
        // The trace's own time (an untimed trace's moves a microsecond an
        // event: `take_timeline` turns it back into event numbers).
        let x = self.time.as_secs_f64();
        timeline.observe(x, live, reserved, recorded);
        if rise > 0 {
            timeline.peak_reserved(reserved + rise);
        }
        if failed {
            timeline.failed();
        }
        if timeline.bucket_full() {
            self.close_bucket();
        }
    }

    /// Close the timeline's open bucket with each stream's reserved bytes.
    fn close_bucket(&mut self) {
        let Some(timeline) = self.timeline.as_mut() else {
            return;
        };
        let mut names = Vec::new();
        let mut per_stream = Vec::new();
        let mut relocated = 0;
        let several = self.make.is_some() && self.devices.len() > 1;
        for (device, run) in &self.devices {
            for (index, handle) in run.handles.iter().enumerate() {
                let stats = handle.stats();
                relocated += stats.relocated;
                per_stream.push(stats.bytes_reserved);
                names.push(if several {
                    format!("device {device} stream {index}")
                } else {
                    format!("stream {index}")
                });
            }
        }
        if relocated > self.relocated_seen {
            timeline.relocated(relocated - self.relocated_seen);
            self.relocated_seen = relocated;
        }
        if names.len() > timeline.streams.len() {
            timeline.streams = names;
        }
        timeline.close(per_stream);
    }

    /// The timeline kept, its open bucket closed (taken: later events are
    /// not recorded). Its x axis is the trace's time in seconds, or the
    /// event number where no event had a time.
    pub fn take_timeline(&mut self) -> Option<Timeline> {
        self.close_bucket();
        let mut timeline = self.timeline.take()?;
        if !self.timed {
            let per_event = EVENT_STEP.as_secs_f64();
            for bucket in &mut timeline.buckets {
                bucket.start = (bucket.start / per_event).round();
                bucket.end = (bucket.end / per_event).round();
            }
            timeline.x_label = "event".into();
        }
        Some(timeline)
    }

    /// Let every stream see the last releases, wait for the streams to
    /// settle, and report (per device, and their total when there are
    /// several).
    ///
    /// # Errors
    /// A stream that stopped or failed on the way.
    pub fn finish(mut self) -> Result<ReplayReport, ServiceError> {
        let elapsed = self.started.elapsed();
        let ns_per_op = elapsed.as_nanos() as f64 / self.events.max(1) as f64;
        let mut reports = Vec::new();
        let_load_fall(&mut self.devices, self.time)?;
        for run in self.devices.values_mut() {
            let mut device_ops = DriverOps::default();
            let mut per_stream = Vec::with_capacity(run.handles.len());
            for (index, handle) in run.handles.iter().enumerate() {
                let memory = handle.report()?;
                let ops = memory.driver;
                device_ops = device_ops.combine(ops);
                let tally = &run.per_stream[index];
                let stats = handle.stats();
                per_stream.push(StreamReplay {
                    stream: handle.stream().0,
                    trace_stream: tally.trace_stream,
                    events: tally.events,
                    allocations: tally.allocations,
                    failures: tally.failures,
                    frees: tally.frees,
                    bytes_allocated: tally.bytes_allocated,
                    bytes_freed: tally.bytes_freed,
                    live_bytes: tally.trace_live,
                    reserved_bytes: stats.bytes_reserved,
                    peak_live_bytes: tally.peak_live,
                    peak_reserved_bytes: stats.peak_bytes_reserved,
                    pools: memory
                        .pools()
                        .map(crate::simulate::PoolFigures::from)
                        .collect(),
                    driver: DriverReport::new(
                        ops,
                        ops.peak_granules_mapped,
                        tally.events,
                        &self.costs,
                    ),
                });
            }
            let device = run.supervisor.device_stats();
            let report = &mut run.report;
            report.driver = DriverReport::new(
                device_ops,
                device.peak_granules_mapped,
                report.events,
                &self.costs,
            );
            report.per_stream = per_stream;
            report.ns_per_op = ns_per_op;
            report.streams = run.handles.len();
            report.peak_reserved_bytes = run.supervisor.device_stats().peak_bytes_reserved;
            // The load fell (the trace ended), with what it left live held.
            report.settled_reserved_bytes = run.supervisor.settled()?.bytes_reserved;
            report.settled_live_bytes = run.live;
            report.relocated = run.supervisor.stats().iter().map(|s| s.relocated).sum();
            report.derive();
            reports.push(report.clone());
        }
        // Handles go before their supervisors.
        self.live.clear();
        if self.make.is_none() {
            let mut report = reports
                .pop()
                .unwrap_or_else(|| ReplayReport::empty(None, None));
            report.device = None;
            return Ok(report);
        }
        Ok(match reports.len() {
            0 => ReplayReport::empty(None, None),
            1 => reports.pop().expect("one"),
            _ => {
                let mut total = ReplayReport::total(reports, &self.costs);
                total.peak_live_event = self.peak_live_event;
                total
            }
        })
    }
}

/// The run of `device`, its supervisor made on first sight.
fn device_run<'a, 's>(
    devices: &'a mut BTreeMap<u32, DeviceRun<'s>>,
    make: &mut Option<Box<dyn FnMut(u32) -> Supervisor + 's>>,
    timeline: &mut Option<Timeline>,
    device: u32,
) -> &'a mut DeviceRun<'s> {
    let key = if make.is_some() { device } else { 0 };
    devices.entry(key).or_insert_with(|| {
        let make = make.as_mut().expect("only made devices are missing");
        let run = Replayer::run(Device::Owned(Box::new(make(device))), device);
        if let Some(timeline) = timeline
            && timeline.budget.is_none()
        {
            timeline.budget = run.report.budget;
        }
        run
    })
}

/// Replay `events` through `supervisor`'s streams (every device of the
/// trace on this one supervisor). `timeline`, if given, gets memory over
/// time; `progress` is told how many events are done every
/// `sample_every` events.
///
/// # Errors
/// As [`Replayer::event`]; a trace with more streams than
/// [`ServiceConfig::max_streams`](crate::service::ServiceConfig::max_streams)
/// is refused before any actor starts.
pub fn replay(
    events: &[TraceEvent],
    supervisor: &Supervisor,
    timeline: Option<&mut Timeline>,
    sample_every: usize,
    mut progress: impl FnMut(u64),
) -> Result<ReplayReport, ServiceError> {
    // Refused before any actor starts: a trace names its streams freely.
    let streams: HashSet<(u32, u64)> = events.iter().map(|e| (e.device, e.stream)).collect();
    let limit = supervisor.config().max_streams;
    if streams.len() > limit {
        return Err(ServiceError::TooManyStreams {
            requested: streams.len(),
            limit,
        });
    }
    let mut replayer = Replayer::on(supervisor);
    let want_timeline = timeline.is_some();
    if want_timeline {
        replayer.record_timeline();
    }
    for (index, event) in events.iter().enumerate() {
        replayer.event(event)?;
        if index % sample_every.max(1) == 0 || index + 1 == events.len() {
            progress(index as u64 + 1);
        }
    }
    let kept = replayer.take_timeline();
    let report = replayer.finish()?;
    if let (Some(out), Some(kept)) = (timeline, kept) {
        *out = kept;
    }
    Ok(report)
}
