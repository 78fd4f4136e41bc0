//! Memory over time, as a replay goes: one bucket of the timeline widened
//! by each event, closed with each stream's reserved bytes.

use super::device::DeviceRun;
use super::{EVENT_STEP, Replayer};
use crate::timeline::Timeline;

impl Replayer<'_> {
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

    /// Widen the timeline's open bucket by the state after this event.
    pub(super) fn sample(&mut self, failed: bool) {
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
}
