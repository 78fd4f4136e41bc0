//! Allocation windows: a client's reserves in a mode until the window drops.

use super::StreamHandle;
use crate::memory::AllocationMode;
use crate::sync::atomic::Ordering;

/// An open allocation window: reserves through its handle use its mode
/// until it drops. Windows nest; the innermost open one decides.
#[derive(Debug)]
pub struct ModeWindow<'a> {
    /// The handle it belongs to.
    handle: &'a StreamHandle,
    /// Its token on the handle's stack.
    token: u64,
}

impl Drop for ModeWindow<'_> {
    fn drop(&mut self) {
        let mut windows = self.handle.windows.lock();
        windows.retain(|(token, _)| *token != self.token);
        self.handle
            .open_windows
            .store(windows.len() as u64, Ordering::Release);
    }
}

impl StreamHandle {
    /// Open an allocation window on this client (see [`ModeWindow`]).
    pub fn window(&self, mode: AllocationMode) -> ModeWindow<'_> {
        let token = self.next_window.fetch_add(1, Ordering::Relaxed);
        let mut windows = self.windows.lock();
        windows.push((token, mode));
        self.open_windows
            .store(windows.len() as u64, Ordering::Release);
        drop(windows);
        ModeWindow {
            handle: self,
            token,
        }
    }

    /// The mode this client's innermost window puts in force.
    pub fn mode(&self) -> AllocationMode {
        if self.open_windows.load(Ordering::Acquire) == 0 {
            return AllocationMode::Auto;
        }
        self.windows
            .lock()
            .last()
            .map_or(AllocationMode::Auto, |(_, mode)| *mode)
    }
}
