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

    /// The holes' buffer, for the next plan.
    pub(super) fn into_buffer(self) -> Vec<Hole> {
        self.0
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

    /// The hole tagged `tag` (a linear search: a plan lists few).
    pub(super) fn by_tag(&self, tag: usize) -> Option<Hole> {
        self.0.iter().find(|hole| hole.3 == tag).copied()
    }

    /// Keep only the holes `keep` accepts.
    pub(super) fn retain(&mut self, keep: impl Fn(&Hole) -> bool) {
        self.0.retain(|hole| keep(hole));
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

    /// Whether a hole that `allowed` accepts holds `size` bytes: where
    /// [`place_all`](Self::place_all) puts its largest allocation, asked
    /// without planning the rest.
    pub(super) fn holds(&self, size: u64, allowed: impl Fn(&Hole, u64) -> bool) -> bool {
        let at = self.0.partition_point(|hole| hole.0 < size);
        self.0[at..].iter().any(|hole| allowed(hole, size))
    }

    /// Place `allocations` ((size, address order key, slot)) on paper,
    /// largest first (ties in address order), each in the best-fitting
    /// hole that `allowed` accepts for its size, what is left of a hole
    /// staying for the next one. The (slot, tag of the hole it lands in)
    /// of each if all fit; the holes are as they were when this returns.
    pub(super) fn place_all(
        &mut self,
        mut allocations: Vec<(u64, u64, u32)>,
        allowed: impl Fn(&Hole, u64) -> bool,
    ) -> Option<Vec<(u32, usize)>> {
        allocations.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut placed = Vec::with_capacity(allocations.len());
        let (mut taken_out, mut added): (Vec<Hole>, Vec<Hole>) = (Vec::new(), Vec::new());
        let mut fits = true;
        for &(size, _, slot) in &allocations {
            let at = self.0.partition_point(|hole| hole.0 < size);
            let Some(&hole) = self.0[at..].iter().find(|hole| allowed(hole, size)) else {
                fits = false;
                break;
            };
            self.remove(&hole);
            // A rest this plan made goes with it; a hole that was there
            // before comes back afterwards.
            match added.iter().position(|&rest| rest == hole) {
                Some(at) => {
                    added.swap_remove(at);
                }
                None => taken_out.push(hole),
            }
            let (hole_size, range, offset, tag) = hole;
            if hole_size > size {
                let rest = (hole_size - size, range, offset + size, tag);
                self.insert(rest);
                added.push(rest);
            }
            placed.push((slot, tag));
        }
        for hole in added {
            self.remove(&hole);
        }
        for hole in taken_out {
            self.insert(hole);
        }
        fits.then_some(placed)
    }
}

#[cfg(test)]
mod tests {
    use super::{Hole, Holes};
    use proptest::prelude::*;

    fn holes() -> impl Strategy<Value = Vec<Hole>> {
        prop::collection::vec((1u64..64, 0u32..3, 0u64..1_000), 0..24).prop_map(|holes| {
            holes
                .into_iter()
                .enumerate()
                .map(|(tag, (size, range, offset))| (size, range, offset, tag))
                .collect()
        })
    }

    proptest! {
        /// `holds` says no exactly where `place_all` fails at its first
        /// (largest) allocation: a group it refuses is one the placement
        /// would have refused, so asking it first changes no plan.
        #[test]
        fn holds_answers_as_the_placement_of_the_largest(
            listed in holes(),
            sizes in prop::collection::vec(1u64..64, 1..6),
            limit in (0u32..3, 0u64..1_100),
        ) {
            let mut holes = Holes::sorted(listed.clone());
            let below = |hole: &Hole, size: u64| {
                hole.0 >= size && (hole.1 < limit.0 || (hole.1 == limit.0 && hole.2 + size <= limit.1))
            };
            let largest = *sizes.iter().max().expect("one size at least");
            let holds = holes.holds(largest, below);
            let alone = holes.place_all(vec![(largest, 0, 0)], below);
            prop_assert_eq!(holds, alone.is_some());
            let allocations = sizes
                .iter()
                .enumerate()
                .map(|(at, &size)| (size, at as u64, at as u32))
                .collect();
            let placed = holes.place_all(allocations, below);
            if !holds {
                prop_assert!(placed.is_none());
            }
            // The holes are as they were, whatever was asked.
            prop_assert_eq!(holes.into_buffer(), Holes::sorted(listed).into_buffer());
        }
    }
}
