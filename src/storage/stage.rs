//! A move of overlapping bytes through a free block apart from them: what
//! [`DeviceStorage::stage`] does by default, on a device whose copies may
//! not overlap their source.

use super::{DeviceStorage, StorageError, StorageHandle};

/// An overlapping move down through a free block apart from it: what
/// [`DeviceStorage::stage`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedMove {
    /// Where the bytes are.
    pub source: StorageHandle,
    /// A free block apart from both ends, no longer than they are.
    pub staging: StorageHandle,
    /// Where they go: below the source, the same length, overlapping it.
    pub target: StorageHandle,
}

/// Move `source`'s bytes down to `target`, which overlaps it, through the
/// free `staging` block: a piece of its size at a time, lowest first, two
/// copies each (a piece's target never reaches the source of the pieces
/// after it, which lie higher). If a copy fails, the pieces moved go back,
/// last first, through the staging block again, so a failure leaves the
/// bytes where they were, as a failed slide does.
pub(super) fn through<S: DeviceStorage + ?Sized>(
    storage: &mut S,
    moving: &StagedMove,
) -> Result<(), StorageError> {
    let (source, staging, target) = (&moving.source, &moving.staging, &moving.target);
    super::check_slide(source, target)?;
    if staging.size == 0 {
        // Nothing to stage through: the slide's own way.
        return storage.slide(source, target);
    }
    let pieces = Pieces {
        source,
        staging,
        target,
    };
    let mut at = 0;
    while at < source.size {
        let (from, through, to) = pieces.at(at);
        if let Err(error) = storage.copy(&from, &through) {
            pieces.undo(storage, at)?;
            return Err(error);
        }
        if let Err(error) = storage.copy(&through, &to) {
            // The piece's target overlaps its source: put it back first.
            storage.copy(&through, &from)?;
            pieces.undo(storage, at)?;
            return Err(error);
        }
        at = at.saturating_add(staging.size);
    }
    Ok(())
}

/// A staged move cut into pieces of the staging block's size.
struct Pieces<'a> {
    source: &'a StorageHandle,
    staging: &'a StorageHandle,
    target: &'a StorageHandle,
}

impl Pieces<'_> {
    /// The piece at `at` bytes in: where it comes from, the staging block's
    /// part it goes through, and where it goes.
    fn at(&self, at: u64) -> (StorageHandle, StorageHandle, StorageHandle) {
        let size = self.staging.size.min(self.source.size.saturating_sub(at));
        let part = |of: &StorageHandle| StorageHandle {
            id: of.id,
            offset: of.offset.saturating_add(at),
            size,
        };
        let through = StorageHandle {
            size,
            ..*self.staging
        };
        (part(self.source), through, part(self.target))
    }

    /// Move the pieces before `done` bytes back to the source, last first:
    /// restoring one never reaches the targets of those before it, which
    /// lie lower.
    fn undo<S: DeviceStorage + ?Sized>(
        &self,
        storage: &mut S,
        done: u64,
    ) -> Result<(), StorageError> {
        let mut at = done;
        while at > 0 {
            at = at.saturating_sub(self.staging.size);
            let (from, through, to) = self.at(at);
            storage.copy(&to, &through)?;
            storage.copy(&through, &from)?;
        }
        Ok(())
    }
}
