//! # streamalloc
//!
//! A device-memory manager for multi-stream inference servers.
//!
//! The [`memory`] layer is a single-threaded, deterministic manager in the
//! manner of CubeCL's `MemoryManagement`: persistent, dedicated and dynamic
//! pools (by default an expandable arena: address space mapped a granule at
//! a time, compacted before it grows; or CubeCL's metadata pool, adaptive
//! arena and exclusive pages), nested
//! allocation windows, periodic and explicit cleanup, generation-checked
//! handles, relocation that compacts any page, page guards, pins, taint
//! ranges and lazy backing. The [`storage`] layer supplies pages and virtual
//! memory (reserved ranges, granules mapped on demand): real host
//! memory by default, a byte-counting virtual storage for replays, and a
//! capped, fault-injecting wrapper for tests.
//!
//! ```
//! use streamalloc::memory::{MemoryConfig, MemoryManager, PageUpdate};
//! use streamalloc::storage::HostStorage;
//!
//! let mut memory = MemoryManager::new(HostStorage::new(), MemoryConfig::default());
//! let tensor = memory.reserve(1024, PageUpdate::Allow)?;
//! memory.write(&tensor, 0, b"hello")?;
//! assert_eq!(memory.read(&tensor, 0, 5)?, b"hello");
//! drop(tensor); // the bytes go back to their pool
//! # Ok::<(), streamalloc::memory::MemoryError>(())
//! ```
//!
//! The [`service`] layer runs one manager per device stream in an actor
//! behind cloneable [`StreamHandle`](service::StreamHandle)s (the actor has
//! a thread of its own; a blocking call finding nothing queued is served on
//! the caller's thread in the actor's turn, at the cost of a lock), with a
//! [`Supervisor`](service::Supervisor) that owns the device: its streams,
//! an optional budget, cross-stream give-back when a stream runs short, and
//! two policies that keep every stream's page cache from costing memory —
//! [`Headroom`](service::Headroom) (growth past the device's peak live bytes
//! first wins cached pages back) and [`Settle`](service::Settle) (a stream
//! whose load fell gives the excess back):
//!
//! ```
//! use streamalloc::memory::StreamId;
//! use streamalloc::service::{Headroom, ServiceConfig, Settle, Supervisor};
//!
//! let device = Supervisor::host(ServiceConfig {
//!     headroom: Some(Headroom { fraction: 0.05, ..Headroom::default() }),
//!     settle: Some(Settle::default()),
//!     ..ServiceConfig::default()
//! });
//! let stream = device.stream(StreamId(0))?;
//! let kv_block = stream.reserve(2 << 20)?;
//! drop(kv_block); // released without a round trip
//! let held = device.settled()?; // what the device holds once the load fell
//! assert!(held.bytes_reserved <= 2 << 20);
//! device.shutdown();
//! # Ok::<(), streamalloc::service::ServiceError>(())
//! ```

//! Every stream operation has an awaitable form (`reserve_async`,
//! `read_async`, ... `try_bind_async`), and so do the supervisor's
//! (`stream_async`, `settled_async`, `remove_stream_async`,
//! `shutdown_async`): none blocks an executor's worker while an actor
//! works. From tokio, `stream.reserve_async(n).await` inside any task. The futures are cancel-safe (an allocation served after
//! its future was dropped is released):
//!
//! ```
//! use streamalloc::memory::StreamId;
//! use streamalloc::service::{ServiceConfig, Supervisor};
//!
//! async fn decode_step(stream: &streamalloc::service::StreamHandle) -> Result<(), streamalloc::service::ServiceError> {
//!     let logits = stream.reserve_async(32_000 * 2).await?;
//!     stream.write_async(&logits, 0, &[0; 16]).await?;
//!     Ok(())
//! }
//!
//! let device = Supervisor::host(ServiceConfig::default());
//! let stream = device.stream(StreamId(0))?;
//! pollster::block_on(decode_step(&stream))?; // or a tokio runtime's block_on
//! # Ok::<(), streamalloc::service::ServiceError>(())
//! ```
//!
//! Time-driven policies (idle cleanups, settle windows, compaction intervals,
//! `reserve_timeout` deadlines) read one [`clock`]: the wall clock by default,
//! a [`ManualClock`](clock::ManualClock) that only moves when told in a replay
//! or a test, where [`Supervisor::tick`](service::Supervisor::tick) runs the
//! timers. Replays on a manual clock give the same report on every run:
//!
//! ```
//! use std::time::Duration;
//! use streamalloc::clock::ManualClock;
//! use streamalloc::memory::StreamId;
//! use streamalloc::service::{ServiceConfig, Supervisor};
//!
//! let clock = ManualClock::shared();
//! let device = Supervisor::virtual_device(ServiceConfig {
//!     clock: clock.clone(),
//!     idle_tick: Some(Duration::from_millis(100)),
//!     ..ServiceConfig::default()
//! });
//! let stream = device.stream(StreamId(0))?;
//! drop(stream.reserve_many(&[1 << 20; 8])?);
//! device.tick()?; // the stream is watched from now
//! clock.advance(Duration::from_millis(100));
//! device.tick()?; // quiet for an idle tick: it gave its pages back
//! assert_eq!(stream.stats().bytes_reserved, 0);
//! # Ok::<(), streamalloc::service::ServiceError>(())
//! ```
//!
//! Memory that another stream's work reads (PyTorch's `record_stream`) is
//! recorded as used there: once released it stays put, unreused and
//! mapped, until that stream's work queued by then is done (asked at each
//! reservation and cleanup point, never waited for on those paths):
//!
//! ```
//! use streamalloc::memory::{Cleanup, StreamId};
//! use streamalloc::service::{ServiceConfig, Supervisor};
//!
//! let device = Supervisor::host(ServiceConfig::default());
//! let (main, side) = (device.stream(StreamId(0))?, device.stream(StreamId(1))?);
//! let tensor = main.reserve(1 << 20)?;
//! main.record_use(&tensor, side.user_stream()?)?; // a kernel on `side` reads it
//! drop(tensor); // its memory waits for `side`'s work before reuse
//! main.cleanup(Cleanup::Explicit)?; // waits for it, and gives it back
//! assert_eq!(main.stats().bytes_reserved, 0);
//! device.shutdown();
//! # Ok::<(), streamalloc::service::ServiceError>(())
//! ```
//!
//! Features: `cli` (default) builds the `streamalloc` command and
//! `streamalloc::plot` (clap, indicatif, plotters); a server embedding the
//! library sets `default-features = false`. `cuda` adds
//! `storage::CudaStorage`, pages from an NVIDIA GPU through the driver API,
//! loaded at run time (it builds without a CUDA toolkit and answers a typed
//! error where no driver or device exists).

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod clock;
#[cfg(not(streamalloc_loom))]
pub mod html;
pub mod memory;
#[cfg(all(feature = "cli", not(streamalloc_loom)))]
pub mod plot;
#[cfg(not(streamalloc_loom))]
pub mod replay;
pub(crate) mod saturating;
pub mod service;
#[cfg(not(streamalloc_loom))]
pub mod simulate;
pub mod storage;
pub(crate) mod sync;
#[cfg(not(streamalloc_loom))]
pub mod timeline;
pub mod trace;
