//! Pages that went idle, in the order they did: what a periodic cleanup
//! returns once they stayed idle for the pool's deallocation period. An
//! entry names the page's epoch when it went idle; a page used again since
//! has moved to a new epoch, and its old entry is passed over.

use super::page::Sweep;
use crate::storage::DeviceStorage;
use std::collections::VecDeque;

/// The idle queue of a pool of pages.
#[derive(Debug, Default)]
pub(crate) struct IdlePages(VecDeque<(u32, u32, u64)>);

impl IdlePages {
    /// `page`, in `epoch`, went idle at reservation `serial`.
    #[inline]
    pub(crate) fn push(&mut self, page: u32, epoch: u32, serial: u64) {
        self.0.push_back((page, epoch, serial));
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    /// Whether the page that went idle first has been idle `period`
    /// reservations at `serial` (it may be in use again since: then
    /// [`pop_due`](Self::pop_due) passes it over).
    #[inline]
    pub(crate) fn any_due(&self, serial: u64, period: u64) -> bool {
        self.0
            .front()
            .is_some_and(|&(_, _, since)| serial.saturating_sub(since) >= period)
    }

    /// The next page idle for `period` reservations at `serial` and still
    /// in the epoch it went idle in (`epoch_of` says the page's epoch now).
    #[inline]
    pub(crate) fn pop_due(
        &mut self,
        serial: u64,
        period: u64,
        epoch_of: impl Fn(u32) -> u32,
    ) -> Option<u32> {
        while let Some(&(page, epoch, since)) = self.0.front() {
            if serial.saturating_sub(since) < period {
                return None;
            }
            self.0.pop_front();
            if epoch_of(page) == epoch {
                return Some(page);
            }
        }
        None
    }
}

/// A pool of pages with an idle queue: its cleanup, written once.
pub(crate) trait IdleSweep {
    /// Its idle queue.
    fn idle_pages(&mut self) -> &mut IdlePages;

    /// Its idle queue, to look at.
    fn idle_queue(&self) -> &IdlePages;

    /// Reservations a page stays idle before a periodic cleanup returns
    /// it; `None`: never.
    fn idle_period(&self) -> Option<u64>;

    /// Pages, held or not, by index.
    fn page_count(&self) -> u32;

    /// The next idle page due at `serial` after `period` (`pop_due`, with
    /// the pool's epochs).
    fn next_due(&mut self, serial: u64, period: u64) -> Option<u32>;

    /// Return `page` to the device if nothing holds it; whether it went.
    fn release_page(&mut self, storage: &mut dyn DeviceStorage, page: u32) -> bool;

    /// Whether `sweep` would return nothing: a periodic cleanup before any
    /// page has been idle its period, answered without a call (it runs
    /// before every reservation).
    #[inline]
    fn nothing_due(&self, sweep: Sweep) -> bool {
        match sweep {
            Sweep::All => false,
            Sweep::Idle { serial, .. } => self
                .idle_period()
                .is_none_or(|period| !self.idle_queue().any_due(serial, period)),
        }
    }

    /// Return the pages `sweep` says; whether any went.
    fn sweep_pages(&mut self, storage: &mut dyn DeviceStorage, sweep: Sweep) -> bool {
        let mut released = false;
        match sweep {
            Sweep::All => {
                self.idle_pages().clear();
                for page in 0..self.page_count() {
                    released |= self.release_page(storage, page);
                }
            }
            Sweep::Idle { serial, .. } => {
                let Some(period) = self.idle_period() else {
                    return false;
                };
                while let Some(page) = self.next_due(serial, period) {
                    released |= self.release_page(storage, page);
                }
            }
        }
        released
    }
}

/// [`IdleSweep`] for a pool whose `pages` have an `epoch`, whose queue is
/// `idle` and whose period is `dealloc_period`, releasing with `release`.
macro_rules! idle_sweep_by_fields {
    ($pool:ty) => {
        impl IdleSweep for $pool {
            fn idle_pages(&mut self) -> &mut IdlePages {
                &mut self.idle
            }

            fn idle_queue(&self) -> &IdlePages {
                &self.idle
            }

            fn idle_period(&self) -> Option<u64> {
                self.dealloc_period
            }

            fn page_count(&self) -> u32 {
                self.pages.len() as u32
            }

            fn next_due(&mut self, serial: u64, period: u64) -> Option<u32> {
                let pages = &self.pages;
                self.idle
                    .pop_due(serial, period, |page| pages[page as usize].epoch)
            }

            fn release_page(&mut self, storage: &mut dyn DeviceStorage, page: u32) -> bool {
                self.release(storage, page)
            }
        }
    };
}
pub(crate) use idle_sweep_by_fields;
