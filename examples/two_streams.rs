//! Two streams, one budget: the sequence behind the Service II figures.
//!
//! Stream 0 serves a burst of 1 MiB activations and lets them go (its pages
//! stay cached: no idle tick, as under steady load); stream 1 then needs a
//! large KV-cache block. Run once with the supervisor's cross-stream cleanup
//! and once without, on a device budget that only the cleanup makes enough.
//!
//! `cargo run --release --example two_streams`

use streamalloc::memory::{Bytes, StreamId};
use streamalloc::service::{ServiceConfig, ServiceError, Supervisor};

const MIB: u64 = 1 << 20;

fn run(budget: Option<u64>, cross_stream_cleanup: bool) -> Result<(), ServiceError> {
    let device = Supervisor::virtual_device(ServiceConfig {
        budget,
        cross_stream_cleanup,
        idle_tick: None,
        compaction_threshold: None,
        ..ServiceConfig::default()
    });
    let activations = device.stream(StreamId(0))?;
    let kv_cache = device.stream(StreamId(1))?;
    for _ in 0..4 {
        drop(activations.reserve_many(&[MIB; 48])?);
    }
    let cached = activations.stats().bytes_reserved;
    let block = kv_cache.reserve(40 * MIB);
    let reserved: u64 = device.stats().iter().map(|s| s.bytes_reserved).sum();
    let peak = device.budget().map(|b| b.peak());
    println!(
        "budget {:>9}, cross-stream cleanup {:>5}: stream 0 cached {}, KV block {}, device reserved after {}, budget peak {}",
        budget.map_or("none".into(), |b| Bytes(b).to_string()),
        cross_stream_cleanup,
        Bytes(cached),
        match &block {
            Ok(_) => "served".to_string(),
            Err(err) => format!(
                "failed ({})",
                err.to_string().split(';').next().unwrap_or("")
            ),
        },
        Bytes(reserved),
        peak.map_or("-".into(), |p| Bytes(p).to_string()),
    );
    Ok(())
}

fn main() -> Result<(), ServiceError> {
    // What the sequence needs with no budget at all.
    run(None, false)?;
    // A 64 MiB device: only giving back stream 0's cache makes room.
    run(Some(64 * MIB), false)?;
    run(Some(64 * MIB), true)?;
    Ok(())
}
