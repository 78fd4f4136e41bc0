//! Replaying a trace through the service: each trace stream gets a stream
//! actor, each allocation a reservation, each free a dropped handle, and
//! each device of the trace its own [`Supervisor`]. What comes out is what
//! a device of that size would have needed under this allocator: peak live
//! and peak reserved bytes, failures, time per event, and where the trace
//! recorded its own allocator's device memory (a PyTorch snapshot's
//! segments), that allocator's peak beside ours.
//!
//! The long form: `docs/modules.md`, "`src/replay/mod.rs`".

use crate::memory::Allocation;
use crate::service::{ServiceError, Supervisor};
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

mod device;
mod report;
mod samples;
mod timeline;

use crate::storage::{DriverCosts, DriverPaths, DriverReport};
use device::{Device, DeviceRun, device_run, let_load_fall};
use report::failure_reason;
pub use report::{ReplayReport, StreamReplay};
pub use samples::{LiveSamples, Sample, SampledAllocation, sample_live};

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
        devices.insert(0, DeviceRun::new(Device::Lent(supervisor), 0));
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
        // What the driver was asked up to the last event, before the load
        // is let fall (the same queue order on every run: a report waits
        // for the stream's earlier requests, and no timer runs meanwhile).
        let mut in_trace = BTreeMap::new();
        for (&device, run) in &self.devices {
            let mut paths = DriverPaths::default();
            for handle in &run.handles {
                paths = paths.combine(handle.report()?.driver_paths);
            }
            in_trace.insert(device, paths);
        }
        let_load_fall(&mut self.devices, self.time)?;
        for (id, run) in &mut self.devices {
            let mut device_paths = DriverPaths::default();
            let mut per_stream = Vec::with_capacity(run.handles.len());
            for (index, handle) in run.handles.iter().enumerate() {
                let memory = handle.report()?;
                device_paths = device_paths.combine(memory.driver_paths);
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
                    lent: stats.lent,
                    borrowed: stats.borrowed,
                    pools: memory
                        .pools()
                        .map(crate::simulate::PoolFigures::from)
                        .collect(),
                    driver: DriverReport::by_path(
                        memory.driver_paths,
                        memory.driver.peak_granules_mapped,
                        tally.events,
                        &self.costs,
                    ),
                });
            }
            let device = run.supervisor.device_stats();
            let report = &mut run.report;
            report.driver = DriverReport::by_path(
                device_paths,
                device.peak_granules_mapped,
                report.events,
                &self.costs,
            );
            report.driver_in_trace = DriverReport::by_path(
                in_trace.remove(id).unwrap_or_default(),
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
