//! What the integration tests share: sizes, and a device whose policies
//! act only when a test turns them on.

#![allow(dead_code)]

use streamalloc::clock::ManualClock;
use streamalloc::service::ServiceConfig;

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
