//! `Supervisor::shutdown` racing `Supervisor::stream`, on the Supervisor's
//! own wiring: a client thread asks for a stream while the main thread
//! shuts the device down. Either the stream was registered before the
//! registry was drained (and shutdown stopped it), or the request is
//! refused: once `shutdown` returns no stream runs, so a handle the client
//! got answers `StreamStopped`.
//!
//! Fails when `Supervisor::stream` checks `stopped` before taking the
//! registry's lock (a stream spawned after the drain outlives shutdown and
//! serves the reserve below), or when `shutdown` sets `stopped` outside it.

#![cfg(streamalloc_loom)]

mod common;

use common::run_wide_model;
use loom::sync::Arc;
use std::time::Duration;
use streamalloc::memory::StreamId;
use streamalloc::service::{ServiceConfig, ServiceError, Supervisor};

/// A device whose policies never act on time (time is not modelled).
fn quiet() -> ServiceConfig {
    ServiceConfig {
        idle_tick: None,
        spin: 0,
        pin_wait: Duration::ZERO,
        settle: None,
        headroom: None,
        compaction_threshold: None,
        supervise_tick: Duration::from_secs(3600),
        inbox_capacity: 2,
        ..ServiceConfig::default()
    }
}

#[test]
fn no_stream_outlives_a_racing_shutdown() {
    run_wide_model(
        "shutdown racing stream",
        "LOOM_LIFECYCLE_PREEMPTIONS",
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
