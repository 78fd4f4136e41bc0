//! Taint: which bytes of an allocation a failure left invalid.
//!
//! A failed kernel or copy can leave part of a buffer unwritten; a later
//! read of those bytes should learn which failure (and, through the
//! [`ErrorGraph`], which root cause) claims them instead of reading garbage.
//! A write clears exactly the bytes it wrote: a partial write says nothing
//! about the rest of the buffer.

use std::fmt;
use std::ops::Range;

/// Names one failure recorded in an [`ErrorGraph`]: the graph's scope in
/// the high 32 bits (each manager's graph has its own, so a failure recorded
/// on one stream is unknown on every other) and its index in the low 32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FailureId(pub u64);

impl FailureId {
    fn new(scope: u32, index: u32) -> Self {
        Self((u64::from(scope) << 32) | u64::from(index))
    }

    /// The graph that recorded it.
    fn scope(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// Its place in that graph.
    fn index(self) -> usize {
        self.0 as u32 as usize
    }
}

impl fmt::Display for FailureId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "failure#{}.{}", self.scope(), self.index())
    }
}

/// One recorded failure.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure {
    /// What went wrong.
    message: String,
    /// The failures that caused it.
    causes: Vec<FailureId>,
}

/// Failures and which caused which: a kernel that read tainted input fails
/// *because of* the failure that tainted it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorGraph {
    /// Which graph this is: the high half of every id it hands out.
    scope: u32,
    /// By index.
    failures: Vec<Failure>,
}

impl ErrorGraph {
    /// An empty graph whose ids carry `scope` (a manager passes its own
    /// identity, so ids from other managers are refused).
    pub(crate) fn scoped(scope: u32) -> Self {
        Self {
            scope,
            failures: Vec::new(),
        }
    }

    fn get(&self, id: FailureId) -> Option<&Failure> {
        if id.scope() != self.scope {
            return None;
        }
        self.failures.get(id.index())
    }

    /// Record a failure caused by `causes` (which must be recorded already;
    /// unknown ones are dropped, so the graph stays acyclic).
    pub fn record(&mut self, message: impl Into<String>, causes: &[FailureId]) -> FailureId {
        let id = FailureId::new(self.scope, self.failures.len() as u32);
        let causes = causes
            .iter()
            .copied()
            .filter(|c| self.contains(*c))
            .collect();
        self.failures.push(Failure {
            message: message.into(),
            causes,
        });
        id
    }

    /// Whether `id` was recorded here.
    pub fn contains(&self, id: FailureId) -> bool {
        self.get(id).is_some()
    }

    /// What went wrong.
    pub fn message(&self, id: FailureId) -> Option<&str> {
        self.get(id).map(|f| f.message.as_str())
    }

    /// The direct causes of `id`.
    pub fn causes(&self, id: FailureId) -> &[FailureId] {
        self.get(id).map_or(&[], |f| f.causes.as_slice())
    }

    /// The failures with no cause that `id` descends from (itself if it has none).
    pub fn roots(&self, id: FailureId) -> Vec<FailureId> {
        let mut roots = Vec::new();
        let mut stack = vec![id];
        let mut seen = std::collections::HashSet::new();
        while let Some(next) = stack.pop() {
            if !seen.insert(next) {
                continue;
            }
            match self.causes(next) {
                [] => roots.push(next),
                causes => stack.extend_from_slice(causes),
            }
        }
        roots.sort();
        roots
    }

    /// Whether `effect` descends from `cause`.
    pub fn caused_by(&self, effect: FailureId, cause: FailureId) -> bool {
        let mut stack = self.causes(effect).to_vec();
        let mut seen = std::collections::HashSet::new();
        while let Some(next) = stack.pop() {
            if next == cause {
                return true;
            }
            if seen.insert(next) {
                stack.extend_from_slice(self.causes(next));
            }
        }
        false
    }

    /// Failures recorded.
    pub fn len(&self) -> usize {
        self.failures.len()
    }

    /// Whether none was recorded.
    pub fn is_empty(&self) -> bool {
        self.failures.is_empty()
    }
}

/// The tainted ranges of one allocation: sorted, disjoint, each naming the
/// failure that claims it. Usually empty, so it costs one empty `Vec`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TaintRanges {
    ranges: Vec<(Range<u64>, FailureId)>,
}

impl TaintRanges {
    /// Point `range` at `failure` (a later claim wins over an earlier one
    /// for the bytes they share).
    pub(crate) fn taint(&mut self, range: Range<u64>, failure: FailureId) {
        if range.is_empty() {
            return;
        }
        self.written(range.clone());
        let at = self.ranges.partition_point(|(r, _)| r.start < range.start);
        self.ranges.insert(at, (range, failure));
    }

    /// `range` was written: no failure claims those bytes any more.
    pub(crate) fn written(&mut self, range: Range<u64>) {
        if range.is_empty() || self.ranges.is_empty() {
            return;
        }
        let mut kept = Vec::with_capacity(self.ranges.len() + 1);
        for (r, failure) in self.ranges.drain(..) {
            if r.end <= range.start || r.start >= range.end {
                kept.push((r, failure));
                continue;
            }
            if r.start < range.start {
                kept.push((r.start..range.start, failure));
            }
            if r.end > range.end {
                kept.push((range.end..r.end, failure));
            }
        }
        self.ranges = kept;
    }

    /// Bytes `0..len` were overwritten by a copy of an allocation whose
    /// taint is `source`: they carry its claims now.
    pub(crate) fn replace_prefix(&mut self, len: u64, source: &TaintRanges) {
        self.written(0..len);
        for (range, failure) in &source.ranges {
            let end = range.end.min(len);
            if range.start < end {
                self.taint(range.start..end, *failure);
            }
        }
    }

    /// The failure claiming the lowest tainted byte of `range`, if any (an
    /// empty range holds no byte, so none claims it).
    pub(crate) fn failure(&self, range: &Range<u64>) -> Option<FailureId> {
        if range.is_empty() {
            return None;
        }
        self.ranges
            .iter()
            .find(|(r, _)| r.start < range.end && range.start < r.end)
            .map(|(_, failure)| *failure)
    }

    /// The tainted ranges, in order.
    #[cfg(test)]
    pub(crate) fn ranges(&self) -> &[(Range<u64>, FailureId)] {
        &self.ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_clears_exactly_what_it_wrote() {
        let (a, b) = (FailureId::new(0, 0), FailureId::new(0, 1));
        let mut taint = TaintRanges::default();
        taint.taint(0..100, a);
        taint.taint(50..150, b);
        assert_eq!(taint.ranges(), &[(0..50, a), (50..150, b)]);
        taint.written(20..60);
        assert_eq!(taint.ranges(), &[(0..20, a), (60..150, b)]);
        assert_eq!(taint.failure(&(20..60)), None);
        assert_eq!(taint.failure(&(10..70)), Some(a));
        assert_eq!(taint.failure(&(59..61)), Some(b));
        assert_eq!(
            taint.failure(&(70..70)),
            None,
            "an empty range holds no byte"
        );
        taint.written(0..1000);
        assert!(taint.ranges().is_empty());
    }

    #[test]
    fn the_graph_knows_root_causes() {
        let mut graph = ErrorGraph::default();
        let oom = graph.record("copy failed", &[]);
        let kernel = graph.record("kernel read tainted input", &[oom]);
        let bogus = graph.record("unrelated", &[FailureId(99)]);
        let foreign = ErrorGraph::scoped(7).record("elsewhere", &[]);
        assert!(!graph.contains(foreign));
        assert_eq!(graph.message(foreign), None);
        assert_eq!(graph.roots(kernel), vec![oom]);
        assert!(graph.caused_by(kernel, oom));
        assert!(!graph.caused_by(oom, kernel));
        assert!(graph.causes(bogus).is_empty());
        assert_eq!(graph.message(kernel), Some("kernel read tainted input"));
    }
}
