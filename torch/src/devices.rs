//! The library's devices by CUDA ordinal, each made on its first use and
//! then read without a lock: every call looks its device up, and one lock
//! for all of them was a line of memory that every thread calling at once
//! wrote (the lock) and bounced between their cores.

use parking_lot::Mutex;
use std::sync::OnceLock;

/// Devices `0..N`.
pub(crate) struct Devices<D, const N: usize> {
    made: [OnceLock<D>; N],
    /// Held while a device is made, and while what its making reads is
    /// set (`unless_made`).
    making: Mutex<()>,
}

impl<D, const N: usize> Default for Devices<D, N> {
    fn default() -> Self {
        Self {
            made: std::array::from_fn(|_| OnceLock::new()),
            making: Mutex::new(()),
        }
    }
}

impl<D, const N: usize> Devices<D, N> {
    /// Device `index`, if made.
    pub(crate) fn get(&self, index: usize) -> Option<&D> {
        self.made.get(index)?.get()
    }

    /// Device `index`, made by `make` if it is not yet (`None` where
    /// `make` cannot; it is asked again at the next call).
    pub(crate) fn get_or_make(&self, index: usize, make: impl FnOnce() -> Option<D>) -> Option<&D> {
        let slot = self.made.get(index)?;
        if let Some(device) = slot.get() {
            return Some(device);
        }
        let _making = self.making.lock();
        if slot.get().is_none() {
            let _ = slot.set(make()?);
        }
        slot.get()
    }

    /// Run `change` unless device `index` is made (nor made meanwhile):
    /// whether it ran.
    pub(crate) fn unless_made(&self, index: usize, change: impl FnOnce()) -> bool {
        let _making = self.making.lock();
        let made = self.made.get(index).is_none_or(|slot| slot.get().is_some());
        if !made {
            change();
        }
        !made
    }

    /// Every device made, by index.
    pub(crate) fn made(&self) -> impl Iterator<Item = (usize, &D)> {
        (self.made.iter().enumerate()).filter_map(|(index, slot)| Some((index, slot.get()?)))
    }
}
