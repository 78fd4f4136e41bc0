//! Spare handles: a map's plan (spares moved, spares released, handles
//! created) and its record, and the spares' release. `docs/memory.md`,
//! "Spare handles".

// Indices are granules of the range, checked against its size first.
#![allow(clippy::arithmetic_side_effects)]

use super::{GivenBack, GranuleMap, granules_in};
use crate::storage::{StorageError, StorageHandle};
use std::collections::BTreeSet;
use std::ops::Range;

/// A spare physical handle moved by a map: unmapped from the granules
/// `from` and mapped at `to` (as many), with no handle created or
/// released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HandleMove {
    /// Where it was mapped.
    pub(crate) from: Range<u64>,
    /// Where it is mapped now.
    pub(crate) to: Range<u64>,
}

/// What a map of fresh granules asks of the driver: spare handles moved
/// to some, new handles created for the rest, and (only where it creates
/// any) the spares it does not move released first, so that a storage
/// never holds spares and new memory at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Mapping {
    /// Spare handles moved to fresh granules, in order.
    pub(crate) moved: Vec<HandleMove>,
    /// Spare handles released before any is created.
    pub(crate) released: Vec<Range<u64>>,
    /// Physical handles created, in order.
    pub(crate) created: Vec<Range<u64>>,
}

impl Mapping {
    /// Granules the map puts new memory behind.
    pub(crate) fn created_granules(&self) -> u64 {
        granules_in(&self.created)
    }

    /// Granules of the spares it releases.
    pub(crate) fn released_granules(&self) -> u64 {
        granules_in(&self.released)
    }

    /// The bytes a storage that held `held` holds after the map, granules
    /// of `granule` bytes: the spares released go, the handles created
    /// come (a moved spare's bytes were held already).
    pub(crate) fn held_after(&self, held: u64, granule: u64) -> u64 {
        held.saturating_sub(self.released_granules().saturating_mul(granule))
            .saturating_add(self.created_granules().saturating_mul(granule))
    }

    /// Granules of the spares it moves.
    pub(crate) fn moved_granules(&self) -> u64 {
        self.moved
            .iter()
            .fold(0, |sum, moved| sum + (moved.to.end - moved.to.start))
    }
}

impl GranuleMap {
    /// What a [`map`](Self::map) of `handle` asks of the driver. Its
    /// granules given back and not yet gone are revived where they are,
    /// except a spare handle's that reaches outside it (released, and its
    /// granules inside mapped fresh). The fresh granules are cut into
    /// handles as [`handles_for`](Self::handles_for) cuts them, so a map
    /// gives the same handles whatever it moves, and each takes a spare
    /// of its size where one is kept (none inside `handle`), or is
    /// created. Where any is created, the spares not moved are released
    /// first. Refused where `handle` is not whole granules of the range
    /// or any of them is live.
    pub(crate) fn plan(&self, handle: &StorageHandle) -> Result<Mapping, StorageError> {
        let inside = self.granules(handle).unwrap_or(0..0);
        let mut mapping = Mapping::default();
        let mut free = BTreeSet::new();
        for &(len, start) in &self.spares {
            let spare = start..start + len;
            if spare.end <= inside.start || spare.start >= inside.end {
                free.insert((len, start));
            } else if spare.start < inside.start || spare.end > inside.end {
                mapping.released.push(spare);
            }
        }
        let runs = self.fresh_runs(handle, &mapping.released)?;
        for piece in self.handles_for(&runs) {
            let len = piece.end - piece.start;
            let spare = free.range((len, 0)..=(len, u64::MAX)).next().copied();
            match spare {
                Some((_, start)) => {
                    free.remove(&(len, start));
                    mapping.moved.push(HandleMove {
                        from: start..start + len,
                        to: piece,
                    });
                }
                None => mapping.created.push(piece),
            }
        }
        if !mapping.created.is_empty() {
            (mapping.released).extend(free.iter().map(|&(len, start)| start..start + len));
        }
        Ok(mapping)
    }

    /// Mark `handle`'s granules mapped: none of them may be live. The
    /// driver's part is what [`plan`](Self::plan) says, which is returned.
    pub(crate) fn map(&mut self, handle: &StorageHandle) -> Result<Mapping, StorageError> {
        let mapping = self.plan(handle)?;
        self.apply(handle, &mapping);
        Ok(mapping)
    }

    /// Record `mapping`, the [`plan`](Self::plan) of a map of `handle`
    /// that the driver carried out.
    pub(crate) fn apply(&mut self, handle: &StorageHandle, mapping: &Mapping) {
        for spare in &mapping.released {
            self.forget_spare(spare);
        }
        for moved in &mapping.moved {
            self.forget_spare(&moved.from);
        }
        for index in self.granules(handle).unwrap_or(0..0) {
            match self.doomed.remove(&index) {
                Some(GivenBack::Waiting(_)) => self.waiting -= 1,
                Some(GivenBack::Stranded) => {
                    // A spare inside the map, revived whole: no spare now.
                    let physical = self.handle_of(index);
                    self.spares
                        .remove(&(physical.end - physical.start, physical.start));
                }
                None => {
                    self.set(index, true);
                    self.count += 1;
                }
            }
        }
        for moved in &mapping.moved {
            self.handles.insert(moved.to.start, moved.to.end);
        }
        (self.handles).extend(mapping.created.iter().map(|run| (run.start, run.end)));
    }

    /// The spare handles `spares` went (a map failed after giving them
    /// back): their granules are unmapped.
    pub(crate) fn forget_spares(&mut self, spares: &[Range<u64>]) {
        for spare in spares {
            self.forget_spare(spare);
        }
    }

    /// The spare handle `spare` leaves these granules: they are unmapped.
    fn forget_spare(&mut self, spare: &Range<u64>) {
        self.spares.remove(&(spare.end - spare.start, spare.start));
        self.handles.remove(&spare.start);
        for at in spare.clone() {
            self.doomed.remove(&at);
            self.set(at, false);
            self.count -= 1;
        }
    }

    /// Bytes of the spare handles kept.
    pub(crate) fn spare_bytes(&self) -> u64 {
        let granules = self.spares.iter().fold(0, |sum, (len, _)| sum + len);
        granules * self.granule
    }

    /// Release every spare handle (the handles the driver unmaps and
    /// releases, in order).
    pub(crate) fn release_spares(&mut self) -> Vec<Range<u64>> {
        let spares: Vec<Range<u64>> = (self.spares.iter())
            .map(|&(len, start)| start..start + len)
            .collect();
        for spare in &spares {
            self.forget_spare(spare);
        }
        spares
    }
}
