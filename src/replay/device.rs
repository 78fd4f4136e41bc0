//! One device of a replay: its supervisor, its streams and what the replay
//! counts of them, and the trace time its manual clock follows.

use super::report::ReplayReport;
use crate::memory::StreamId;
use crate::service::{ServiceError, StreamHandle, Supervisor};
use crate::timeline::Timeline;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// A device's supervisor: made for the replay, or lent by the caller.
pub(super) enum Device<'s> {
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
pub(super) struct DeviceRun<'s> {
    pub(super) supervisor: Device<'s>,
    /// Stream index by (trace device, trace stream).
    pub(super) streams: HashMap<(u32, u64), usize>,
    pub(super) handles: Vec<StreamHandle>,
    /// Live bytes per stream.
    pub(super) live_bytes: Vec<u64>,
    /// Each stream's own figures, by stream index (driver figures filled
    /// at the end).
    pub(super) per_stream: Vec<StreamTally>,
    /// Live bytes, all streams.
    pub(super) live: u64,
    /// Bytes the trace has live, allocations this allocator refused
    /// included: what `peak_live_bytes` follows (the trace's, whatever
    /// the budget).
    pub(super) trace_live: u64,
    /// The recording allocator's reserved bytes now (`None` until the
    /// trace says).
    pub(super) recorded: Option<i128>,
    /// When the supervisor's timers run next (trace time).
    pub(super) next_tick: Duration,
    pub(super) report: ReplayReport,
}

/// What a replay counts of one stream as it goes.
#[derive(Debug, Default)]
pub(super) struct StreamTally {
    pub(super) trace_stream: u64,
    pub(super) events: u64,
    pub(super) allocations: u64,
    pub(super) failures: u64,
    /// Bytes the trace has live on this stream (refused ones included).
    pub(super) trace_live: u64,
    pub(super) peak_live: u64,
    pub(super) frees: u64,
    pub(super) bytes_allocated: u64,
    pub(super) bytes_freed: u64,
}

impl DeviceRun<'_> {
    /// The trace allocated `size` bytes on `stream` (served or not), at
    /// event `event`.
    pub(super) fn trace_allocated(&mut self, stream: usize, size: u64, event: u64) {
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
    pub(super) fn trace_freed(&mut self, stream: usize, size: u64) {
        self.trace_live -= size;
        self.per_stream[stream].trace_live -= size;
    }
}

impl DeviceRun<'_> {
    pub(super) fn stream(&mut self, device: u32, stream: u64) -> Result<usize, ServiceError> {
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

    pub(super) fn reserved(&self) -> u64 {
        self.supervisor.device_stats().bytes_reserved
    }

    /// Move a manual clock to `time`, and run the timers if a tick of
    /// trace time passed (one tick however far the clock jumped: the
    /// timers look at the time, not at how often they ran).
    pub(super) fn keep_time(&mut self, time: Duration) -> Result<(), ServiceError> {
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
        // The longest a stream's settle window can have grown to.
        let window = config.settle.map_or(Duration::ZERO, |s| s.longest_window());
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
pub(super) fn let_load_fall(
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

impl<'s> DeviceRun<'s> {
    /// A device's run, before its first event.
    pub(super) fn new(supervisor: Device<'s>, device: u32) -> Self {
        let budget = supervisor.budget().map(|b| b.limit());
        Self {
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
}

/// The run of `device`, its supervisor made on first sight.
pub(super) fn device_run<'a, 's>(
    devices: &'a mut BTreeMap<u32, DeviceRun<'s>>,
    make: &mut Option<Box<dyn FnMut(u32) -> Supervisor + 's>>,
    timeline: &mut Option<Timeline>,
    device: u32,
) -> &'a mut DeviceRun<'s> {
    let key = if make.is_some() { device } else { 0 };
    devices.entry(key).or_insert_with(|| {
        let make = make.as_mut().expect("only made devices are missing");
        let run = DeviceRun::new(Device::Owned(Box::new(make(device))), device);
        if let Some(timeline) = timeline
            && timeline.budget.is_none()
        {
            timeline.budget = run.report.budget;
        }
        run
    })
}
