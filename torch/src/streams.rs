//! A device's streams by the CUDA stream PyTorch passes, each made on its
//! first call and then looked up without a lock: every allocation looks
//! its stream up, and one lock for all of a device's streams was a line
//! of memory that every thread allocating at once wrote. A program runs a
//! few streams, so a lookup is a short scan.

use parking_lot::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use streamalloc::service::StreamHandle;

pub(crate) struct Streams {
    /// (CUDA stream, its handle), in the order they were made: the index
    /// is the streamalloc stream's id.
    made: Box<[OnceLock<(usize, StreamHandle)>]>,
    /// How many of `made` are set (published after the slot is).
    count: AtomicUsize,
    /// Held while one is made.
    making: Mutex<()>,
}

impl Streams {
    /// Room for `most` streams (the service's `max_streams`).
    pub(crate) fn new(most: usize) -> Self {
        Self {
            made: (0..most).map(|_| OnceLock::new()).collect(),
            count: AtomicUsize::new(0),
            making: Mutex::new(()),
        }
    }

    /// The handle of CUDA stream `cuda`, if made.
    pub(crate) fn get(&self, cuda: usize) -> Option<&StreamHandle> {
        self.iter_made()
            .find(|(stream, _)| *stream == cuda)
            .map(|(_, handle)| handle)
    }

    /// The handle of CUDA stream `cuda`, made by `make` (given the new
    /// stream's id) if it is not yet; the reason where it cannot be.
    pub(crate) fn get_or_make(
        &self,
        cuda: usize,
        make: impl FnOnce(u32) -> Result<StreamHandle, String>,
    ) -> Result<&StreamHandle, String> {
        if let Some(found) = self.get(cuda) {
            return Ok(found);
        }
        let _making = self.making.lock();
        if let Some(found) = self.get(cuda) {
            return Ok(found);
        }
        let index = self.count.load(Ordering::Acquire);
        let slot = (self.made.get(index))
            .ok_or_else(|| format!("more than the {} streams a device runs", self.made.len()))?;
        let id = u32::try_from(index).map_err(|_| "a stream id past u32".to_string())?;
        let _ = slot.set((cuda, make(id)?));
        self.count.store(index + 1, Ordering::Release);
        Ok(&slot.get().expect("set just above").1)
    }

    /// Every handle made.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &StreamHandle> {
        self.iter_made().map(|(_, handle)| handle)
    }

    fn iter_made(&self) -> impl Iterator<Item = &(usize, StreamHandle)> {
        let count = self.count.load(Ordering::Acquire);
        self.made[..count].iter().filter_map(OnceLock::get)
    }
}
