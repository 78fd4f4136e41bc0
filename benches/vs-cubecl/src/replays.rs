//! A trace replayed through a manager alone, for timing: the events turned
//! once into dense steps, so that what a replay times is the manager's
//! work (a reservation, a release) and not the trace's bookkeeping, the
//! same for both sides.

use cubecl_server::memory_management::{
    ErrorGraph, MemoryConfiguration as CubeConfig, PageUpdate as CubeUpdate,
};
use std::collections::HashMap;
use streamalloc::memory::{
    DeviceProperties, MemoryConfig, MemoryConfiguration, MemoryManager, PageUpdate,
};
use streamalloc::storage::VirtualStorage;
use streamalloc::trace::{TraceAction, TraceEvent};

use crate::{CountedCopies, CountingStorage, cubecl_with};

/// Largest page either side may take: a replayed trace may hold
/// allocations as large as its device.
pub const MAX_PAGE: u64 = 1 << 40;

/// One thing a replay asks of a manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Reserve `size` bytes on manager `manager` and keep the handle in
    /// `slot`.
    Reserve {
        manager: usize,
        slot: usize,
        size: u64,
    },
    /// Drop the handle in `slot`.
    Release { slot: usize },
}

/// A trace as steps: one manager per (device, stream) of the trace, as
/// CubeCL keeps one per stream, and a slot per allocation live at once.
#[derive(Debug, Clone, Default)]
pub struct Steps {
    /// In the trace's order.
    pub steps: Vec<Step>,
    /// Managers the steps name.
    pub managers: usize,
    /// Slots the steps name.
    pub slots: usize,
    /// The trace's events these steps came from.
    pub events: usize,
}

impl Steps {
    /// The steps of `events`: an allocation of an id still live releases
    /// the old one first (the trace reused its pointer); frees of unknown
    /// ids, allocations of 0 bytes and the recording allocator's own
    /// events ask nothing.
    pub fn of(events: &[TraceEvent]) -> Self {
        let mut managers = HashMap::new();
        let mut live: HashMap<(u32, u64), usize> = HashMap::new();
        let mut free_slots = Vec::new();
        let mut steps = Steps {
            events: events.len(),
            ..Steps::default()
        };
        for event in events {
            let freed = match event.action {
                TraceAction::Alloc | TraceAction::Free => live.remove(&(event.device, event.id)),
                _ => continue,
            };
            if let Some(slot) = freed {
                steps.steps.push(Step::Release { slot });
                free_slots.push(slot);
            }
            if event.action != TraceAction::Alloc || event.size == 0 {
                continue;
            }
            let count = managers.len();
            let manager = *managers
                .entry((event.device, event.stream))
                .or_insert(count);
            let slot = free_slots.pop().unwrap_or_else(|| {
                steps.slots += 1;
                steps.slots - 1
            });
            live.insert((event.device, event.id), slot);
            steps.steps.push(Step::Reserve {
                manager,
                slot,
                size: event.size,
            });
        }
        steps.managers = managers.len();
        steps
    }
}

/// Replay `steps`, reserving through `reserve(manager, size)` (`None`:
/// refused) and releasing by dropping what it returned. Returns the
/// reservations refused.
fn replay<H>(steps: &Steps, mut reserve: impl FnMut(usize, u64) -> Option<H>) -> u64 {
    let mut slots = Vec::with_capacity(steps.slots);
    slots.resize_with(steps.slots, || None);
    let mut refused = 0;
    for step in &steps.steps {
        match *step {
            Step::Reserve {
                manager,
                slot,
                size,
            } => match reserve(manager, size) {
                Some(handle) => slots[slot] = Some(handle),
                None => refused += 1,
            },
            Step::Release { slot } => slots[slot] = None,
        }
    }
    refused
}

/// Replay `steps` through our `MemoryManager` alone in `pools`, one per
/// trace stream on `VirtualStorage`, every reservation with
/// `PageUpdate::Allow` (as CubeCL's side is driven). Returns the
/// reservations refused.
pub fn ours_alone(steps: &Steps, pools: &MemoryConfiguration) -> u64 {
    let mut managers: Vec<_> = (0..steps.managers)
        .map(|_| {
            MemoryManager::new(
                VirtualStorage::new(),
                MemoryConfig {
                    device: DeviceProperties::new(MAX_PAGE, 256),
                    ..MemoryConfig::with_pools(pools.clone())
                },
            )
        })
        .collect();
    replay(steps, |manager, size| {
        managers[manager].reserve(size, PageUpdate::Allow).ok()
    })
}

/// Replay `steps` through CubeCL's `MemoryManagement` in `config`, one per
/// trace stream on a counting storage, driven as its server drives it:
/// relocate when `relocation_need()` says so, then reserve with
/// `PageUpdate::Allow`. Returns the reservations refused.
pub fn cubecl_alone(steps: &Steps, config: &CubeConfig) -> u64 {
    let mut managers: Vec<_> = (0..steps.managers)
        .map(|_| cubecl_with(CountingStorage::default(), config.clone(), MAX_PAGE))
        .collect();
    let mut failures = ErrorGraph::default();
    replay(steps, |manager, size| {
        let memory = &mut managers[manager];
        if let Some(reason) = memory.relocation_need().reason(|| memory.bytes_allocated()) {
            memory.relocate(&mut CountedCopies, reason, &mut failures);
        }
        memory.reserve(size, CubeUpdate::Allow, &mut failures).ok()
    })
}
