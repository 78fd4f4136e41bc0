//! Replaying a trace through the service: each trace stream gets a stream
//! actor, each allocation a reservation, each free a dropped handle. What
//! comes out is what a device of that size would have needed under this
//! allocator: peak live and peak reserved bytes, failures, time per event.

use crate::memory::StreamId;
use crate::plot::Timeline;
use crate::service::{ServiceError, StreamHandle, Supervisor};
use crate::trace::{TraceAction, TraceEvent};
use serde::Serialize;
use std::collections::HashMap;
use std::time::Instant;

/// What a replay measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    /// Events replayed.
    pub events: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Frees of live allocations.
    pub frees: u64,
    /// Allocations this allocator could not serve (out of memory, too large).
    pub failures: u64,
    /// Failures the trace itself recorded.
    pub trace_failures: u64,
    /// Frees of pointers the trace never allocated (counted, not fatal).
    pub unknown_frees: u64,
    /// Streams in the trace.
    pub streams: usize,
    /// The most bytes live at once, per the trace.
    pub peak_live_bytes: u64,
    /// The most bytes of pages held at once, all streams.
    pub peak_reserved_bytes: u64,
    /// `peak_reserved_bytes / peak_live_bytes`.
    pub reserved_over_live: f64,
    /// Wall time per event, nanoseconds.
    pub ns_per_op: f64,
    /// Allocations moved by relocations.
    pub relocated: u64,
    /// Bytes the trace left live at its end (the load fell to this).
    pub settled_live_bytes: u64,
    /// Bytes of pages held once the streams settled after the trace, with
    /// no explicit cleanup (see [`Settle`](crate::service::Settle)).
    pub settled_reserved_bytes: u64,
    /// `settled_reserved_bytes / settled_live_bytes` (0 when nothing is
    /// left live).
    pub settled_reserved_over_live: f64,
    /// The device budget, if one was set.
    pub budget: Option<u64>,
    /// With a budget: whether every allocation the trace served was served.
    pub fits: Option<bool>,
}

/// Replay `events` through `supervisor`'s streams. `timeline`, if given,
/// gets a sample every `sample_every` events; `progress` is told how many
/// events are done.
pub fn replay(
    events: &[TraceEvent],
    supervisor: &Supervisor,
    mut timeline: Option<&mut Timeline>,
    sample_every: usize,
    mut progress: impl FnMut(u64),
) -> Result<ReplayReport, ServiceError> {
    let mut stream_ids: HashMap<u64, usize> = HashMap::new();
    for event in events {
        let next = stream_ids.len();
        stream_ids.entry(event.stream).or_insert(next);
    }
    // Refused before any actor starts: a trace names its streams freely.
    let limit = supervisor.config().max_streams;
    if stream_ids.len() > limit {
        return Err(ServiceError::TooManyStreams {
            requested: stream_ids.len(),
            limit,
        });
    }
    let handles: Vec<StreamHandle> = (0..stream_ids.len().max(1))
        .map(|i| supervisor.stream(StreamId(i as u32)))
        .collect::<Result<_, _>>()?;
    if let Some(timeline) = timeline.as_deref_mut() {
        *timeline = Timeline::new(
            (0..handles.len()).map(|i| format!("stream {i}")).collect(),
            "event",
        );
    }
    let mut live = HashMap::new();
    // Ids whose allocation failed here: their frees are expected.
    let mut failed_ids = std::collections::HashSet::new();
    let mut live_bytes = vec![0u64; handles.len()];
    let mut report = ReplayReport {
        events: events.len() as u64,
        allocations: 0,
        frees: 0,
        failures: 0,
        trace_failures: 0,
        unknown_frees: 0,
        streams: stream_ids.len(),
        peak_live_bytes: 0,
        peak_reserved_bytes: 0,
        reserved_over_live: 0.0,
        ns_per_op: 0.0,
        relocated: 0,
        settled_live_bytes: 0,
        settled_reserved_bytes: 0,
        settled_reserved_over_live: 0.0,
        budget: supervisor.budget().map(|b| b.limit()),
        fits: None,
    };
    let mut relocated_seen = 0;
    let start = Instant::now();
    for (index, event) in events.iter().enumerate() {
        let stream = stream_ids[&event.stream];
        match event.action {
            TraceAction::Alloc => {
                if let Some((old_stream, old)) = live.remove(&event.id) {
                    // A pointer reused without its free: the old one is gone.
                    live_bytes[old_stream] -= crate::memory::Allocation::size(&old);
                    drop(old);
                }
                if event.size == 0 {
                    continue;
                }
                match handles[stream].reserve(event.size) {
                    Ok(allocation) => {
                        report.allocations += 1;
                        live_bytes[stream] += event.size;
                        live.insert(event.id, (stream, allocation));
                        let total: u64 = live_bytes.iter().sum();
                        report.peak_live_bytes = report.peak_live_bytes.max(total);
                    }
                    Err(ServiceError::Memory(_) | ServiceError::OutOfMemory(_)) => {
                        report.failures += 1;
                        failed_ids.insert(event.id);
                        if let Some(timeline) = timeline.as_deref_mut() {
                            timeline.failures.push(index as f64);
                        }
                    }
                    Err(other) => return Err(other),
                }
            }
            TraceAction::Free => match live.remove(&event.id) {
                Some((stream, allocation)) => {
                    report.frees += 1;
                    live_bytes[stream] -= allocation.size();
                    drop(allocation);
                }
                None if failed_ids.remove(&event.id) => {}
                None => report.unknown_frees += 1,
            },
            TraceAction::AllocFailure => report.trace_failures += 1,
        }
        if index % sample_every.max(1) == 0 || index + 1 == events.len() {
            progress(index as u64 + 1);
            if let Some(timeline) = timeline.as_deref_mut() {
                let stats: Vec<_> = handles.iter().map(StreamHandle::stats).collect();
                let relocated: u64 = stats.iter().map(|s| s.relocated).sum();
                if relocated > relocated_seen {
                    timeline.relocations.push(index as f64);
                    relocated_seen = relocated;
                }
                timeline.push(
                    index as f64,
                    live_bytes.clone(),
                    stats.iter().map(|s| s.bytes_reserved).collect(),
                );
            }
        }
    }
    let elapsed = start.elapsed();
    // Let every stream see the last releases before reading the peaks.
    for handle in &handles {
        handle.report()?;
    }
    report.ns_per_op = elapsed.as_nanos() as f64 / events.len().max(1) as f64;
    report.peak_reserved_bytes = supervisor.device_stats().peak_bytes_reserved;
    report.reserved_over_live = ratio(report.peak_reserved_bytes, report.peak_live_bytes);
    // The load fell (the trace ended), with what it left live still held.
    report.settled_reserved_bytes = supervisor.settled()?.bytes_reserved;
    report.settled_live_bytes = live_bytes.iter().sum();
    report.settled_reserved_over_live =
        ratio(report.settled_reserved_bytes, report.settled_live_bytes);
    report.relocated = supervisor.stats().iter().map(|s| s.relocated).sum();
    if report.budget.is_some() {
        report.fits = Some(report.failures == 0);
    }
    drop(live);
    Ok(report)
}

/// `reserved / live`, 0 when nothing is live.
fn ratio(reserved: u64, live: u64) -> f64 {
    if live == 0 {
        0.0
    } else {
        reserved as f64 / live as f64
    }
}
