//! The free blocks of an expandable pool as its planners see them: sorted
//! by size, then address, for best fit.

/// A free block as a plan sees it: (size, range, offset, a tag of the
/// planner's), ordered by size, then address, so the first at least as
/// large as a request is its best fit.
pub(super) type Hole = (u64, u32, u64, usize);

/// The free blocks a plan may use, sorted. A sorted `Vec` rather than a
/// tree: a few hundred entries, built once per planning and changed a few
/// times per window, so contiguous memory wins (the tree took three times
/// as long on the fragmentation family).
#[derive(Debug, Default)]
pub(super) struct Holes(Vec<Hole>);

impl Holes {
    pub(super) fn sorted(mut holes: Vec<Hole>) -> Self {
        holes.sort_unstable();
        Self(holes)
    }

    /// The smallest hole of at least `size` bytes (ties: lowest address).
    pub(super) fn best_fit(&self, size: u64) -> Option<Hole> {
        let at = self.0.partition_point(|hole| hole.0 < size);
        self.0.get(at).copied()
    }

    /// The hole of exactly this size at this place, if listed.
    pub(super) fn find(&self, size: u64, range: u32, offset: u64) -> Option<Hole> {
        let at = self
            .0
            .partition_point(|hole| (hole.0, hole.1, hole.2) < (size, range, offset));
        self.0
            .get(at)
            .copied()
            .filter(|hole| (hole.0, hole.1, hole.2) == (size, range, offset))
    }

    /// The smallest hole of at least `size` bytes whose first `size` bytes
    /// end at or before `limit` of range `range`, or lie in a range before
    /// it (ties: lowest address).
    pub(super) fn best_fit_below(&self, size: u64, range: u32, limit: u64) -> Option<Hole> {
        let at = self.0.partition_point(|hole| hole.0 < size);
        self.0[at..]
            .iter()
            .find(|hole| hole.1 < range || (hole.1 == range && hole.2 + size <= limit))
            .copied()
    }

    pub(super) fn insert(&mut self, hole: Hole) {
        let at = self.0.partition_point(|listed| *listed < hole);
        self.0.insert(at, hole);
    }

    pub(super) fn remove(&mut self, hole: &Hole) {
        let at = self.0.partition_point(|listed| listed < hole);
        if self.0.get(at) == Some(hole) {
            self.0.remove(at);
        }
    }
}
