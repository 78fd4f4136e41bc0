//! # streamalloc
//!
//! A device-memory manager for multi-stream inference servers.
//!
//! The [`memory`] layer is a single-threaded, deterministic manager in the
//! manner of CubeCL's `MemoryManagement`: persistent, dedicated and dynamic
//! pools (a metadata pool, an adaptive arena, exclusive pages), nested
//! allocation windows, periodic and explicit cleanup, generation-checked
//! handles, relocation that compacts any page, page guards, pins, taint
//! ranges and lazy backing. The [`storage`] layer supplies pages: real host
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

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod memory;
#[cfg(not(streamalloc_loom))]
pub mod plot;
#[cfg(not(streamalloc_loom))]
pub mod replay;
pub mod service;
#[cfg(not(streamalloc_loom))]
pub mod simulate;
pub mod storage;
pub(crate) mod sync;
pub mod trace;
