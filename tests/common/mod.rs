//! What the integration tests share: sizes, and a device whose policies
//! act only when a test turns them on.

#![allow(dead_code)]

use std::time::Duration;
use streamalloc::clock::ManualClock;
use streamalloc::service::{ServiceConfig, SupervisorEvent};

/// A kibibyte.
pub const KIB: u64 = 1 << 10;
/// A mebibyte.
pub const MIB: u64 = 1 << 20;

/// A device whose policies never act on their own while a test runs: no
/// idle tick, no scheduled compaction, no settle, no headroom, and a
/// manual clock (its timers run only at `Supervisor::tick`). A test turns
/// on what it examines (`ServiceConfig { settle, ..quiet() }`).
pub fn quiet() -> ServiceConfig {
    ServiceConfig {
        clock: ManualClock::shared(),
        idle_tick: None,
        compaction_threshold: None,
        settle: None,
        headroom: None,
        ..ServiceConfig::default()
    }
}

/// A seeded pseudo-random sequence (Knuth's MMIX linear congruential
/// generator): the same sizes and picks on every run.
pub struct Lcg(pub u64);

impl Lcg {
    /// The next state; its high bits are the random ones.
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0
    }
}

/// A thread spinning on a core while it lives, as a busy server's other
/// work does: what must not change a replay's answer.
pub struct BusyCore {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BusyCore {
    /// Start spinning.
    pub fn start() -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let spinning = stop.clone();
        let thread = std::thread::spawn(move || {
            while !spinning.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for BusyCore {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Whether an event `want`ed comes. The wait decides nothing: events come
/// in the order they happen, and a minute without any is a hang.
pub fn wait_for(
    events: &streamalloc::service::Events,
    want: impl Fn(&SupervisorEvent) -> bool,
) -> bool {
    while let Some(event) = events.next_timeout(Duration::from_secs(60)) {
        if want(&event) {
            return true;
        }
    }
    false
}
