//! `Supervisor::shutdown` racing `Supervisor::stream`, on the Supervisor's
//! own wiring: a client thread asks for a stream while the main thread
//! shuts the device down. Either the stream was registered before the
//! registry was drained (and shutdown stopped it), or the request is
//! refused: once `shutdown` returns no stream runs, so a handle the client
//! got answers `StreamStopped`.
//!
//! Fails when `Supervisor::stream` does not check `stopped` again under the
//! registry's lock before it registers the stream it made (a stream made
//! while shutdown drained the registry outlives it), or when `shutdown`
//! sets `stopped` outside that lock.

#![cfg(streamalloc_loom)]

mod common;

use common::run_model_with;
use loom::sync::Arc;
use std::time::Duration;
use streamalloc::memory::StreamId;
use streamalloc::service::{Calls, ServiceConfig, ServiceError, Supervisor};

/// A device whose policies never act on time (time is not modelled).
fn quiet() -> ServiceConfig {
    ServiceConfig {
        idle_tick: None,
        calls: Calls {
            spin: 0,
            inbox_capacity: 2,
            ..Calls::default()
        },
        pin_wait: Duration::ZERO,
        settle: None,
        headroom: None,
        compaction_threshold: None,
        supervise_tick: Duration::from_secs(3600),
        ..ServiceConfig::default()
    }
}

#[test]
fn no_stream_outlives_a_racing_shutdown() {
    // Two preemptions: the stream made between the registry's two locks
    // needs them to meet the drain.
    run_model_with(
        "shutdown racing stream",
        "LOOM_LIFECYCLE_PREEMPTIONS",
        2,
        || {
            let device = Arc::new(Supervisor::virtual_device(quiet()));
            let asking = Arc::clone(&device);
            let client = loom::thread::spawn(move || asking.stream(StreamId(0)).ok());
            device.shutdown();
            let handle = client.join().unwrap();
            assert!(
                device.stats().is_empty(),
                "a stream registered after shutdown"
            );
            if let Some(handle) = handle {
                assert!(
                    matches!(handle.reserve(64), Err(ServiceError::StreamStopped(_))),
                    "a stream serves after shutdown returned"
                );
            }
            assert!(matches!(
                device.stream(StreamId(1)),
                Err(ServiceError::SupervisorStopped)
            ));
        },
    );
}
