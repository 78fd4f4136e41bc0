//! The allocations live at chosen moments of a trace, largest first: what
//! the HTML report shows at the peak and at up to 2,000 points along the
//! trace. A second pass over the trace, with no allocator: the moments are
//! chosen once the replay has counted the events and found the peak.

use crate::trace::{TraceAction, TraceEvent};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// One allocation that some sample shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SampledAllocation {
    /// Bytes.
    pub size: u64,
    /// The device.
    pub device: u32,
    /// The stream, as the trace names it.
    pub stream: u64,
    /// The event that made it (counted from 1).
    pub event: u64,
    /// When, on the trace's clock (nanoseconds).
    pub time_ns: u64,
    /// The stack that made it (an index from 1 into the trace's stacks; 0:
    /// none recorded).
    pub stack: u32,
}

/// The trace at one moment: after event `event`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// The event (from 1) after which it was taken.
    pub event: u64,
    /// Its time on the trace's clock (nanoseconds; an untimed trace moves
    /// a microsecond an event, as the replay does).
    pub time_ns: u64,
    /// Bytes live, all devices.
    pub live_bytes: u64,
    /// Allocations live.
    pub live_allocations: u64,
    /// The largest of them, largest first: indices into
    /// [`LiveSamples::allocations`].
    pub largest: Vec<u32>,
    /// Whether this is the moment the trace's live bytes peaked.
    pub at_peak: bool,
}

/// Samples along a trace, and every allocation they show, each once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LiveSamples {
    /// The allocations the samples name.
    pub allocations: Vec<SampledAllocation>,
    /// The samples, in trace order.
    pub samples: Vec<Sample>,
}

/// What is live while the trace is walked.
#[derive(Default)]
struct Live {
    /// By (device, id).
    by_id: HashMap<(u32, u64), SampledAllocation>,
    /// (size, allocation event, device, id): ordered by size.
    by_size: BTreeSet<(u64, u64, u32, u64)>,
    bytes: u64,
}

impl Live {
    fn free(&mut self, key: (u32, u64)) {
        if let Some(gone) = self.by_id.remove(&key) {
            self.by_size.remove(&(gone.size, gone.event, key.0, key.1));
            self.bytes -= gone.size;
        }
    }
}

/// Walk `events` (a trace of `total` events, as counted by the replay) and
/// take a sample after each of `points` events spread evenly over it, with
/// the `top` largest allocations live, and after `peak_event`, with the
/// `top_at_peak` largest (a churning trace shows other allocations at
/// every point: fewer each keep a page of 10M events at a few MB).
///
/// # Errors
/// The first error the events carry.
pub fn sample_live<E>(
    events: impl IntoIterator<Item = Result<TraceEvent, E>>,
    total: u64,
    peak_event: u64,
    points: u64,
    top: usize,
    top_at_peak: usize,
) -> Result<LiveSamples, E> {
    let points = points.clamp(1, total.max(1));
    let mut due: BTreeSet<u64> = (1..=points)
        .map(|i| (u128::from(i) * u128::from(total) / u128::from(points)) as u64)
        .filter(|&event| event > 0)
        .collect();
    if peak_event > 0 {
        due.insert(peak_event);
    }
    let mut out = LiveSamples::default();
    let mut index: HashMap<u64, u32> = HashMap::new();
    let mut live = Live::default();
    let (mut count, mut time) = (0u64, Duration::ZERO);
    let step = super::EVENT_STEP;
    for event in events {
        let event = event?;
        count += 1;
        time = if event.time_ns > 0 {
            time.max(Duration::from_nanos(event.time_ns))
        } else {
            time.saturating_add(step)
        };
        let key = (event.device, event.id);
        match event.action {
            TraceAction::Alloc => {
                live.free(key);
                if event.size > 0 {
                    let now = u64::try_from(time.as_nanos()).unwrap_or(u64::MAX);
                    live.by_id.insert(
                        key,
                        SampledAllocation {
                            size: event.size,
                            device: event.device,
                            stream: event.stream,
                            event: count,
                            time_ns: now,
                            stack: event.stack,
                        },
                    );
                    live.by_size.insert((event.size, count, key.0, key.1));
                    live.bytes += event.size;
                }
            }
            TraceAction::Free => live.free(key),
            _ => {}
        }
        if !due.remove(&count) {
            continue;
        }
        let at_peak = count == peak_event;
        let top = if at_peak { top_at_peak } else { top };
        let mut largest = Vec::with_capacity(top.min(live.by_size.len()));
        for &(_, made, device, id) in live.by_size.iter().rev().take(top) {
            let next = out.allocations.len();
            let at = *index.entry(made).or_insert_with(|| {
                out.allocations.push(live.by_id[&(device, id)].clone());
                u32::try_from(next).unwrap_or(u32::MAX)
            });
            largest.push(at);
        }
        out.samples.push(Sample {
            event: count,
            time_ns: u64::try_from(time.as_nanos()).unwrap_or(u64::MAX),
            live_bytes: live.bytes,
            live_allocations: live.by_id.len() as u64,
            largest,
            at_peak,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_show_the_largest_live_allocations_each_once() {
        let events: Vec<Result<TraceEvent, ()>> = vec![
            Ok(TraceEvent::new(1_000, 0, TraceAction::Alloc, 1, 100)),
            Ok(TraceEvent::new(2_000, 1, TraceAction::Alloc, 2, 300)),
            Ok(TraceEvent::new(3_000, 0, TraceAction::Alloc, 3, 200)),
            Ok(TraceEvent::new(4_000, 1, TraceAction::Free, 2, 300)),
        ];
        let samples = sample_live(events, 4, 3, 2, 1, 2).unwrap();
        let shown: Vec<(u64, bool, Vec<u64>)> = samples
            .samples
            .iter()
            .map(|s| {
                let sizes = s
                    .largest
                    .iter()
                    .map(|&i| samples.allocations[i as usize].size)
                    .collect();
                (s.event, s.at_peak, sizes)
            })
            .collect();
        assert_eq!(
            shown,
            vec![
                (2, false, vec![300]),
                (3, true, vec![300, 200]),
                (4, false, vec![200]),
            ]
        );
        assert_eq!(samples.samples[1].live_bytes, 600);
        assert_eq!(samples.samples[1].time_ns, 3_000);
        // Each allocation once, however many samples show it.
        assert_eq!(samples.allocations.len(), 2);
    }
}
