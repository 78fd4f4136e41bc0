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

/// What a map of fresh granules asks of the driver: handles another
/// stream's storage handed over (*adopted*, `DeviceStorage::adopt_handles`)
/// mapped at some, spare handles moved to others, new handles created for
/// the rest, and (only where it creates any) the spares and adopted
/// handles it does not use released first, so that a storage never holds
/// spares and new memory at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Mapping {
    /// Spare handles moved to fresh granules, in order.
    pub(crate) moved: Vec<HandleMove>,
    /// Spare handles released before any is created.
    pub(crate) released: Vec<Range<u64>>,
    /// Adopted handles mapped at fresh granules, in order: each as long
    /// as the run says.
    pub(crate) adopted: Vec<Range<u64>>,
    /// Adopted handles released before any is created, and their
    /// granules: every one not mapped.
    pub(crate) loose_released: (u64, u64),
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

    /// Granules of the adopted handles it maps.
    pub(crate) fn adopted_granules(&self) -> u64 {
        granules_in(&self.adopted)
    }

    /// The bytes a storage that held `held` holds after the map, granules
    /// of `granule` bytes: the spares and adopted handles released go, the
    /// handles created come (a moved spare's bytes, and an adopted
    /// handle's, were held already).
    pub(crate) fn held_after(&self, held: u64, granule: u64) -> u64 {
        let gone = self.released_granules() + self.loose_released.1;
        held.saturating_sub(gone.saturating_mul(granule))
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
    /// What a [`map`](Self::map) of `handle` asks of the driver, where the
    /// storage holds adopted handles of the lengths `loose` (granules). Its
    /// granules given back and not yet gone are revived where they are,
    /// except a spare handle's that reaches outside it (released, and its
    /// granules inside mapped fresh). The fresh granules are cut into
    /// handles at multiples of [`most_per_handle`](Self::most_per_handle),
    /// so a map gives the same handles whatever it uses for them, and each
    /// takes an adopted handle of its length where one is held (mapping it
    /// costs no creation), else a spare of its length where one is kept
    /// (none inside `handle`), or is created. Handles are never cut to fit:
    /// a storage whose handles got shorter would pay per handle for every
    /// later cycle (filling a piece with shorter adopted handles cost the
    /// `serving_contig` traces 13-40 % more driver time). Where any is
    /// created, the spares not moved and the adopted handles not mapped
    /// are released first. Refused where `handle` is not whole granules of
    /// the range or any of them is live.
    pub(crate) fn plan(
        &self,
        handle: &StorageHandle,
        loose: &[u64],
    ) -> Result<Mapping, StorageError> {
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
        let most = self.most_per_handle(&runs);
        let mut pieces = Vec::new();
        for run in runs {
            Self::cut(run, most, &mut pieces);
        }
        let mut unmapped = Loose::of(loose);
        for piece in pieces {
            let len = piece.end - piece.start;
            if unmapped.take(len) {
                mapping.adopted.push(piece);
                continue;
            }
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
            mapping.loose_released = unmapped.left();
        }
        Ok(mapping)
    }

    /// Mark `handle`'s granules mapped: none of them may be live. The
    /// driver's part is what [`plan`](Self::plan) says, which is returned.
    pub(crate) fn map(
        &mut self,
        handle: &StorageHandle,
        loose: &[u64],
    ) -> Result<Mapping, StorageError> {
        let mapping = self.plan(handle, loose)?;
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
            match self.doomed.remove(index) {
                Some(GivenBack::Waiting(_)) => {}
                Some(GivenBack::Stranded) => {
                    // A spare inside the map, revived whole: no spare now.
                    let physical = self.handle_of(index);
                    self.spares
                        .remove(&(physical.end - physical.start, physical.start));
                }
                None => {
                    self.set(index, true);
                    self.count += 1;
                    self.most_held = self.most_held.max(self.count);
                }
            }
        }
        for moved in &mapping.moved {
            self.handles.insert(moved.to.start, moved.to.end);
        }
        (self.handles).extend(mapping.adopted.iter().map(|run| (run.start, run.end)));
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
            self.doomed.remove(at);
            self.set(at, false);
            self.count -= 1;
        }
    }

    /// Bytes of the spare handles kept.
    pub(crate) fn spare_bytes(&self) -> u64 {
        let granules = self.spares.iter().fold(0, |sum, (len, _)| sum + len);
        granules * self.granule
    }

    /// Give up every spare handle: unmapped here, for the storage to hand
    /// over whole to another of its device (the handles, in order).
    pub(crate) fn hand_over_spares(&mut self) -> Vec<Range<u64>> {
        self.release_spares()
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

/// The lengths of the adopted handles a plan may map.
struct Loose(std::collections::BTreeMap<u64, u64>);

impl Loose {
    fn of(lengths: &[u64]) -> Self {
        let mut counts = std::collections::BTreeMap::new();
        for &len in lengths.iter().filter(|&&len| len > 0) {
            *counts.entry(len).or_insert(0) += 1;
        }
        Self(counts)
    }

    /// Whether a handle of `len` granules is left, taken.
    fn take(&mut self, len: u64) -> bool {
        let Some(count) = self.0.get_mut(&len) else {
            return false;
        };
        *count -= 1;
        if *count == 0 {
            self.0.remove(&len);
        }
        true
    }

    /// The handles left, and their granules.
    fn left(&self) -> (u64, u64) {
        self.0
            .iter()
            .fold((0, 0), |(handles, granules), (&len, &count)| {
                (handles + count, granules + len * count)
            })
    }
}
