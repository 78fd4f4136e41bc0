//! Shared by the loom models: tiny page configurations and a storage that
//! watches its copies.

#![allow(dead_code)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering};
use streamalloc::memory::{MemoryConfig, MemoryConfiguration, PoolConfig, PoolKind};
use streamalloc::service::Headroom;
use streamalloc::service::StreamHandle;
use streamalloc::service::loom_support::{
    ActorUnderTest, CoordinatorUnderTest, DeviceUnderTest, StopSignal,
};
use streamalloc::storage::{
    DeviceStorage, Resource, StorageError, StorageHandle, StorageId, VirtualStorage,
};

/// Pages of 4 KiB, carved for allocations up to 4 KiB; idle pages go back
/// on the next periodic cleanup.
pub fn tiny_pages() -> MemoryConfig {
    MemoryConfig {
        pools: MemoryConfiguration::Custom(vec![PoolConfig {
            kind: PoolKind::Sliced { page_size: 4096 },
            max_alloc_size: 4096,
            dealloc_period: Some(0),
        }]),
        device: streamalloc::memory::DeviceProperties::new(1 << 20, 256),
        compaction_threshold: None,
        ..MemoryConfig::default()
    }
}

/// One expandable arena of 4 KiB granules, for allocations up to 16 KiB.
pub fn tiny_arena() -> MemoryConfig {
    MemoryConfig {
        pools: MemoryConfiguration::Custom(vec![PoolConfig {
            kind: PoolKind::Expandable {
                range_size: 64 * 1024,
            },
            max_alloc_size: 16 * 1024,
            dealloc_period: Some(0),
        }]),
        device: streamalloc::memory::DeviceProperties::new(1 << 20, 256),
        compaction_threshold: None,
        ..MemoryConfig::default()
    }
}

/// Pages of `page` bytes that keep what empties (no periodic cleanup), for
/// allocations up to a page: what a stream's cache looks like.
pub fn caching_pages(page: u64) -> MemoryConfig {
    MemoryConfig {
        pools: MemoryConfiguration::Custom(vec![PoolConfig {
            kind: PoolKind::Sliced { page_size: page },
            max_alloc_size: page,
            dealloc_period: None,
        }]),
        device: streamalloc::memory::DeviceProperties::new(1 << 30, 256),
        compaction_threshold: None,
        ..MemoryConfig::default()
    }
}

/// Run a model of several threads with channels, whose preemption bound
/// (default 1, to stay inside CI's time) `env` can raise for a deeper run.
pub fn run_wide_model(name: &str, env: &str, f: impl Fn() + Sync + Send + 'static) {
    run_model_with(name, env, 1, f)
}

/// [`run_wide_model`] with a default bound of `bound` preemptions.
pub fn run_model_with(name: &str, env: &str, bound: usize, f: impl Fn() + Sync + Send + 'static) {
    eprintln!("loom model: {name}");
    let mut builder = loom::model::Builder::new();
    // A round of give-back is a long execution (two actors, the
    // coordinator, every count they keep): more than loom's default of a
    // thousand branches, none of them a spin.
    builder.max_branches = 20_000;
    builder.preemption_bound = Some(
        std::env::var(env)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(bound),
    );
    builder.check(f);
}

/// Run a model with the project's loom settings (preemption bound from
/// `LOOM_MAX_PREEMPTIONS`, as loom reads it).
pub fn run_model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    eprintln!("loom model: {name}");
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// A `VirtualStorage` whose `copy` asserts that no client is using the
/// bytes (`in_use`) and records that a copy happened (`moved`).
#[derive(Debug)]
pub struct WatchedStorage {
    pub inner: VirtualStorage,
    pub in_use: Arc<AtomicBool>,
    pub moved: Arc<AtomicBool>,
}

impl DeviceStorage for WatchedStorage {
    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }
    fn allocate(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        self.inner.allocate(size)
    }
    fn deallocate(&mut self, id: StorageId) {
        self.inner.deallocate(id)
    }
    fn flush(&mut self) {
        self.inner.flush()
    }
    fn resource(&mut self, handle: &StorageHandle) -> Result<Resource, StorageError> {
        self.inner.resource(handle)
    }
    fn write(&mut self, handle: &StorageHandle, data: &[u8]) -> Result<(), StorageError> {
        self.inner.write(handle, data)
    }
    fn read(&mut self, handle: &StorageHandle, out: &mut [u8]) -> Result<(), StorageError> {
        self.inner.read(handle, out)
    }
    fn copy(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        assert!(
            !self.in_use.load(Ordering::SeqCst),
            "bytes moved while a client held a pin on them"
        );
        self.moved.store(true, Ordering::SeqCst);
        self.inner.copy(from, to)
    }
    fn slide(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        assert!(
            !self.in_use.load(Ordering::SeqCst),
            "bytes slid while a client held a pin on them"
        );
        self.moved.store(true, Ordering::SeqCst);
        self.inner.slide(from, to)
    }
    fn bytes_allocated(&self) -> u64 {
        self.inner.bytes_allocated()
    }
    fn granule(&self) -> Option<u64> {
        self.inner.granule()
    }
    fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        self.inner.reserve_range(size)
    }
    fn map(&mut self, range: &StorageHandle) -> Result<(), StorageError> {
        self.inner.map(range)
    }
    fn unmap(&mut self, range: &StorageHandle) {
        self.inner.unmap(range)
    }
}

/// A device's actors and coordinator running their real loops on loom
/// threads ([`start`]), until [`Running::end`].
pub struct Running {
    coordinator: loom::thread::JoinHandle<()>,
    actors: Vec<loom::thread::JoinHandle<()>>,
    stop: StopSignal,
}

/// Run the coordinator and every actor, each on a loom thread of its own.
pub fn start(
    coordinator: CoordinatorUnderTest,
    stop: StopSignal,
    actors: Vec<ActorUnderTest>,
) -> Running {
    let coordinator = loom::thread::spawn(move || coordinator.run());
    let actors = actors
        .into_iter()
        .map(|actor| loom::thread::spawn(move || actor.run()))
        .collect();
    Running {
        coordinator,
        actors,
        stop,
    }
}

impl Running {
    /// Stop the coordinator (emptying the registry, as shutdown does), let
    /// go of the callers' `handles`, and wait for every actor to end.
    pub fn end(self, handles: Vec<StreamHandle>) {
        self.stop.stop();
        self.coordinator.join().unwrap();
        drop(handles);
        for actor in self.actors {
            actor.join().unwrap();
        }
    }
}

/// A headroom of nothing: the device may hold no more than it ever had
/// live.
pub fn strict_headroom() -> Headroom {
    Headroom {
        fraction: 0.0,
        slack: 0,
    }
}

/// Stream A (the first of `device`'s two) had a page live, the device's
/// high-water mark, then cached it: its handle and actor, then B's.
pub fn a_caches_a_page(
    device: &mut DeviceUnderTest,
    page: u64,
) -> (
    (StreamHandle, ActorUnderTest),
    (StreamHandle, ActorUnderTest),
) {
    let b = device.streams.pop().unwrap();
    let (a_handle, mut a_actor) = device.streams.pop().unwrap();
    let held = a_actor.reserve(page).unwrap();
    a_actor.publish();
    drop(held);
    a_actor.process_and_publish();
    assert_eq!(device.budget.granted(), page, "A caches its page");
    ((a_handle, a_actor), b)
}
