//! The concurrent service: one allocator actor thread per device stream,
//! cloneable client handles, and a supervisor that owns the device.
//!
//! ```
//! use streamalloc::memory::StreamId;
//! use streamalloc::service::{ServiceConfig, Supervisor};
//!
//! let device = Supervisor::host(ServiceConfig::default());
//! let stream = device.stream(StreamId(0))?;
//! let tensor = stream.reserve(4096)?;
//! stream.write(&tensor, 0, b"kv-cache block")?;
//! assert_eq!(stream.read(&tensor, 0, 14)?, b"kv-cache block");
//! let pinned = stream.resolve(&tensor)?; // no round trip
//! assert_eq!(pinned.len(), 4096);
//! # drop(pinned);
//! drop(tensor); // released without a round trip
//! device.shutdown();
//! # Ok::<(), streamalloc::service::ServiceError>(())
//! ```
//!
//! The protocols (release, resolve, shutdown) are described in
//! `docs/service.md` and model-checked in `loom-tests/`.

// Sizes come from callers: every sum on them is checked (a debug build's
// overflow panic would take the stream down for every client).
#![warn(clippy::arithmetic_side_effects, clippy::disallowed_methods)]

mod actor;
mod config;
mod coordinator;
mod device;
mod error;
mod events;
mod handle;
mod headroom;
mod hot;
mod in_place;
mod lending;
mod message;
mod operations;
mod protocol;
mod registry;
mod seat;
mod settle;
mod shared;
mod supervisor;
#[cfg(not(streamalloc_loom))]
mod supervisor_async;
mod wiring;

pub use config::{Calls, ServiceConfig, StorageFactory};
pub use device::DeviceStats;
pub use error::{OutOfMemoryReport, ServiceError, StreamUsage};
pub use events::{Events, SupervisorEvent};
pub use handle::{ModeWindow, StreamHandle};
pub use headroom::Headroom;
pub use protocol::ShutdownReport;
pub use settle::Settle;
pub use shared::{StreamState, StreamStats};
pub use supervisor::Supervisor;

#[cfg(streamalloc_loom)]
#[doc(hidden)]
pub mod loom_support;
