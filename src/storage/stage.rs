//! A move of overlapping bytes through a free block apart from them: what
//! [`DeviceStorage::stage`] does by default, on a device whose copies may
//! not overlap their source.

use super::{DeviceStorage, StorageError, StorageHandle, check_slide};

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
    check_slide(&moving.source, &moving.target)?;
    if moving.staging.size == 0 {
        // Nothing to stage through: the slide's own way.
        return storage.slide(&moving.source, &moving.target);
    }
    let mut at = 0;
    while at < moving.source.size {
        let (from, through, to) = moving.piece(at);
        if let Err(error) = storage.copy(&from, &through) {
            moving.undo(storage, at)?;
            return Err(error);
        }
        if let Err(error) = storage.copy(&through, &to) {
            // The piece's target overlaps its source: put it back first.
            storage.copy(&through, &from)?;
            moving.undo(storage, at)?;
            return Err(error);
        }
        at = at.saturating_add(moving.staging.size);
    }
    Ok(())
}

impl StagedMove {
    /// The piece at `at` bytes in, as long as the staging block at most:
    /// where it comes from, the staging block's part it goes through, and
    /// where it goes.
    fn piece(&self, at: u64) -> (StorageHandle, StorageHandle, StorageHandle) {
        let size = self.staging.size.min(self.source.size.saturating_sub(at));
        let part = |of: &StorageHandle| StorageHandle {
            id: of.id,
            offset: of.offset.saturating_add(at),
            size,
        };
        let through = StorageHandle {
            size,
            ..self.staging
        };
        (part(&self.source), through, part(&self.target))
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
            let (from, through, to) = self.piece(at);
            storage.copy(&to, &through)?;
            storage.copy(&through, &from)?;
        }
        Ok(())
    }
}
