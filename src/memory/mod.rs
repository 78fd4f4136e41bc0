//! The single-threaded memory manager: pools, routing, modes, cleanup,
//! relocation, guards, pins, taint and reports. Nothing here starts a
//! thread; the `service` layer wraps one manager per stream actor.

mod bytes;
mod config;
mod error;
mod handle;
mod keeper;
mod live;
mod manager;
mod observer;
mod policy;
mod pool;
mod release;
mod relocation;
mod report;
mod slot;
mod taint;

pub use bytes::Bytes;
pub(crate) use config::{ADAPTIVE_MIN_PAGE_SIZE, DEFAULT_COMPACTION_THRESHOLD};
pub use config::{
    AllocationMode, ConfigError, DeviceProperties, ENV_MEMORY_LOG, ENV_PERSISTENT_MEMORY,
    MemoryConfig, MemoryConfiguration, MemoryLogLevel, PersistentMemory, PoolConfig, PoolKind,
};
pub use error::{HandedBack, MemoryError};
pub(crate) use handle::AllocationCell;
pub use handle::{Allocation, AllocationId, Binding, StreamId};
pub(crate) use live::{LiveBytes, LiveMeter};
pub use manager::access::ManagedResource;
pub use manager::guard::{PageGuard, Pinned, PinnedRef};
pub use manager::{MAX_USER_STREAMS, MemoryManager};
pub use observer::MemoryObserver;
pub use policy::{Cleanup, PageUpdate};
pub use relocation::{RelocationError, RelocationNeed, RelocationReason, RelocationReport};
pub use report::{MemoryReport, MemoryUsage, PoolReport};
pub use taint::{ErrorGraph, FailureId};
