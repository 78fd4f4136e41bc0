//! Memory over time, kept for a plot in bounded space: the run is cut into
//! buckets of consecutive events, and each bucket keeps the least and the
//! most bytes seen inside it, so every peak survives however long the run
//! (a plot of samples drops the extremes between them). When the buckets
//! pass a bound, neighbours merge pairwise (min of mins, max of maxes).
//!
//! Failures and relocations are counted per bucket rather than listed, so
//! a run of ten million events keeps a few thousand numbers.

/// The most buckets kept; past it, neighbours merge.
const MAX_BUCKETS: usize = 4096;

/// The least and most of a quantity within a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// The least value seen.
    pub min: u64,
    /// The most value seen.
    pub max: u64,
}

impl Range {
    fn point(value: u64) -> Self {
        Self {
            min: value,
            max: value,
        }
    }

    fn widen(&mut self, value: u64) {
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }

    fn merge(self, other: Self) -> Self {
        Self {
            min: self.min.min(other.min),
            max: self.max.max(other.max),
        }
    }
}

/// Consecutive events, summarised.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    /// Position of its first event.
    pub start: f64,
    /// Position of its last event.
    pub end: f64,
    /// Live bytes, all streams.
    pub live: Range,
    /// Bytes of pages held, all streams.
    pub reserved: Range,
    /// What the recording allocator held (a PyTorch snapshot's segments).
    pub recorded: Option<Range>,
    /// Reserved bytes per stream at the bucket's end.
    pub stream_reserved: Vec<u64>,
    /// Requests that failed inside it.
    pub failures: u64,
    /// Allocations relocated inside it.
    pub relocated: u64,
}

impl Bucket {
    fn merge(self, later: Bucket) -> Bucket {
        Bucket {
            start: self.start,
            end: later.end,
            live: self.live.merge(later.live),
            reserved: self.reserved.merge(later.reserved),
            recorded: match (self.recorded, later.recorded) {
                (Some(a), Some(b)) => Some(a.merge(b)),
                (a, b) => a.or(b),
            },
            stream_reserved: later.stream_reserved,
            failures: self.failures + later.failures,
            relocated: self.relocated + later.relocated,
        }
    }
}

/// Memory over a run, for plotting.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// The stream names, one per series.
    pub streams: Vec<String>,
    /// What the x axis counts.
    pub x_label: String,
    /// The buckets, in order.
    pub buckets: Vec<Bucket>,
    /// The device budget, drawn as a line.
    pub budget: Option<u64>,
    /// What the recorded allocator is called (`"PyTorch"`), when its
    /// reserved bytes are in the buckets.
    pub recorded_name: Option<String>,
    /// Events per bucket now (doubles at each merge).
    width: u64,
    /// Events in the open bucket.
    filled: u64,
}

impl Timeline {
    /// An empty timeline over `streams`.
    pub fn new(streams: Vec<String>, x_label: &str) -> Self {
        Self {
            streams,
            x_label: x_label.into(),
            width: 1,
            ..Self::default()
        }
    }

    /// One sample: a bucket of its own holding these per-stream values.
    pub fn push(&mut self, x: f64, live: Vec<u64>, reserved: Vec<u64>) {
        self.observe(x, live.iter().sum(), reserved.iter().sum(), None);
        self.close(reserved);
    }

    /// An event at `x` with these totals: widens the open bucket (opening
    /// one if none is).
    pub fn observe(&mut self, x: f64, live: u64, reserved: u64, recorded: Option<u64>) {
        match self.open_bucket() {
            Some(bucket) => {
                bucket.end = x;
                bucket.live.widen(live);
                bucket.reserved.widen(reserved);
                match (&mut bucket.recorded, recorded) {
                    (Some(range), Some(value)) => range.widen(value),
                    (slot @ None, Some(value)) => *slot = Some(Range::point(value)),
                    _ => {}
                }
            }
            None => self.buckets.push(Bucket {
                start: x,
                end: x,
                live: Range::point(live),
                reserved: Range::point(reserved),
                recorded: recorded.map(Range::point),
                stream_reserved: Vec::new(),
                failures: 0,
                relocated: 0,
            }),
        }
        self.filled += 1;
    }

    /// The most reserved bytes were at least `peak` within the open bucket
    /// (a peak between two observations, known from an exact meter).
    pub fn peak_reserved(&mut self, peak: u64) {
        if let Some(bucket) = self.open_bucket() {
            bucket.reserved.max = bucket.reserved.max.max(peak);
        }
    }

    /// A request failed (counted in the latest bucket).
    pub fn failed(&mut self) {
        if let Some(bucket) = self.buckets.last_mut() {
            bucket.failures += 1;
        }
    }

    /// `moved` allocations were relocated (counted in the latest bucket).
    pub fn relocated(&mut self, moved: u64) {
        if let Some(bucket) = self.buckets.last_mut() {
            bucket.relocated += moved;
        }
    }

    /// Whether the open bucket holds as many events as a bucket does now
    /// (time to [`close`](Self::close) it).
    pub fn bucket_full(&self) -> bool {
        self.open_bucket_ref().is_some() && self.filled >= self.width.max(1)
    }

    /// Close the open bucket with each stream's reserved bytes at its end.
    pub fn close(&mut self, stream_reserved: Vec<u64>) {
        if let Some(bucket) = self.open_bucket() {
            bucket.stream_reserved = stream_reserved;
        }
        self.filled = 0;
        if self.buckets.len() >= MAX_BUCKETS {
            self.halve();
        }
    }

    /// The largest reserved and live bytes any bucket saw.
    pub fn peaks(&self) -> (u64, u64) {
        self.buckets.iter().fold((0, 0), |(reserved, live), b| {
            (reserved.max(b.reserved.max), live.max(b.live.max))
        })
    }

    fn open_bucket(&mut self) -> Option<&mut Bucket> {
        if self.filled == 0 {
            return None;
        }
        self.buckets.last_mut()
    }

    fn open_bucket_ref(&self) -> Option<&Bucket> {
        if self.filled == 0 {
            return None;
        }
        self.buckets.last()
    }

    /// Merge neighbours pairwise: half as many buckets, twice as wide.
    fn halve(&mut self) {
        let buckets = std::mem::take(&mut self.buckets);
        let mut merged = Vec::with_capacity(buckets.len() / 2 + 1);
        let mut pending: Option<Bucket> = None;
        for bucket in buckets {
            pending = match pending.take() {
                Some(first) => {
                    merged.push(first.merge(bucket));
                    None
                }
                None => Some(bucket),
            };
        }
        merged.extend(pending);
        self.buckets = merged;
        self.width = self.width.max(1) * 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_peak_survives_merging() {
        let mut timeline = Timeline::new(vec!["s".into()], "event");
        let mut peak = (0, 0);
        for i in 0..100_000u64 {
            // A spike every 9973 events, between any two samples.
            let live = if i % 9973 == 5000 {
                1_000_000 + i
            } else {
                i % 100
            };
            peak.1 = peak.1.max(live);
            timeline.observe(i as f64, live, live * 2, None);
            if timeline.bucket_full() {
                timeline.close(vec![live * 2]);
            }
        }
        assert!(timeline.buckets.len() <= MAX_BUCKETS);
        assert_eq!(timeline.peaks(), (peak.1 * 2, peak.1));
        assert_eq!(timeline.buckets.last().unwrap().end, 99_999.0);
    }
}
