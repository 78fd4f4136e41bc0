//! What each fuzz target does with its input, shared with the plain test
//! that replays the committed corpus (`tests/fuzz_corpus.rs`).

#![allow(dead_code)]

use streamalloc::clock::ManualClock;
use streamalloc::memory::{
    AllocationMode, Cleanup, DeviceProperties, MemoryConfig, MemoryConfiguration, MemoryManager,
    PageUpdate, RelocationReason,
};
use streamalloc::replay::Replayer;
use streamalloc::service::{ServiceConfig, Supervisor};
use streamalloc::storage::{FaultPlan, HostStorage, LimitedStorage};
use streamalloc::trace::{read_jsonl, read_rmm_csv, read_torch_snapshot, read_torch_trace};

/// A reader must answer any input with events or a typed error: never panic.
pub fn trace_rmm(data: &[u8]) {
    let _ = read_rmm_csv(data);
}

/// As `trace_rmm`, for JSON Lines.
pub fn trace_jsonl(data: &[u8]) {
    let _ = read_jsonl(data);
}

/// As `trace_rmm`, for PyTorch snapshot pickles, read whole (segments,
/// device ids, settings) and, when it reads, replayed on virtual memory:
/// whatever devices, streams and sizes it names, the replay answers a
/// report or a typed error, in bounded memory.
pub fn trace_torch(data: &[u8]) {
    let _ = read_torch_snapshot(data);
    let Ok(trace) = read_torch_trace(data) else {
        return;
    };
    if trace.events.len() > 20_000 {
        return;
    }
    let mut replayer = Replayer::new(|_| {
        Supervisor::virtual_device(ServiceConfig {
            clock: ManualClock::shared(),
            ..ServiceConfig::default()
        })
    });
    for event in &trace.events {
        if replayer.event(event).is_err() {
            return;
        }
    }
    let _ = replayer.finish();
}

/// Decode bytes into manager operations; check after each that every live
/// allocation still reads back its mark and that nothing is lost at the end.
pub fn ops(data: &[u8]) {
    let faults = FaultPlan::none()
        .fail_allocation(u64::from(data.first().copied().unwrap_or(0) % 32) + 1)
        .fail_copy(u64::from(data.get(1).copied().unwrap_or(0) % 16) + 1);
    let storage = LimitedStorage::new(HostStorage::new(), 64 << 20).with_faults(faults);
    let pools = if data.get(2).copied().unwrap_or(0) % 2 == 0 {
        MemoryConfiguration::Adaptive
    } else {
        MemoryConfiguration::ExclusivePages
    };
    let mut memory = MemoryManager::new(
        storage,
        MemoryConfig {
            device: DeviceProperties::new(8 << 20, 64),
            ..MemoryConfig::with_pools(pools)
        },
    );
    let mut live = Vec::new();
    let mut guards = Vec::new();
    for chunk in data.chunks(4).skip(1) {
        let [op, a, b, c] = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
            *chunk.get(3).unwrap_or(&0),
        ];
        let arg = u64::from(u16::from_le_bytes([a, b]));
        match op % 10 {
            0..=3 => {
                let size = arg * (1 + u64::from(c % 64)) + 1;
                let mode = [
                    AllocationMode::Auto,
                    AllocationMode::Persistent,
                    AllocationMode::Dedicated,
                ][(c % 3) as usize];
                let update = [
                    PageUpdate::Allow,
                    PageUpdate::AddOnly,
                    PageUpdate::Forbidden,
                ][(c / 3 % 3) as usize];
                if let Ok(allocation) = memory.reserve_in(size, update, mode) {
                    if memory.write(&allocation, size - 1, &[c]).is_ok() {
                        live.push((allocation, size, c));
                    }
                }
            }
            4 | 5 if !live.is_empty() => {
                live.swap_remove(arg as usize % live.len());
            }
            6 => memory.cleanup(if c % 2 == 0 {
                Cleanup::Periodic
            } else {
                Cleanup::Explicit
            }),
            7 => {
                let reason = [
                    RelocationReason::Outdated,
                    RelocationReason::Compaction,
                    RelocationReason::Short,
                ][(c % 3) as usize];
                let _ = memory.relocate(reason);
            }
            8 if !live.is_empty() => {
                if let Ok(guard) = memory.guard(&live[arg as usize % live.len()].0) {
                    guards.push(guard);
                }
            }
            9 => {
                guards.pop();
            }
            _ => {}
        }
        for (allocation, size, mark) in &live {
            assert_eq!(
                memory.read(allocation, size - 1, 1).unwrap(),
                vec![*mark],
                "lost a byte"
            );
        }
    }
    drop(guards);
    drop(live);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_allocated(), 0, "leaked pages");
}
