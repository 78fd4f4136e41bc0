//! An in-process multi-stream inference server, to see the service work:
//! weights loaded once in a persistent window, client threads submitting
//! requests of varying lengths to N streams, activations reserved and freed
//! layer by layer, KV-cache blocks living as long as their request. Shapes
//! come from a real model configuration, scaled by an option.

use crate::memory::{AllocationMode, StreamId};
use crate::service::{DeviceStats, ServiceError, StreamHandle, Supervisor, SupervisorEvent};
use crate::storage::{DriverCosts, DriverPaths, DriverReport};
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use crate::timeline::Timeline;
use serde::Serialize;
use std::time::{Duration, Instant};

/// One pool of a stream, as the report shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolFigures {
    /// What kind of pool (`persistent`, `dedicated`, ...).
    pub kind: String,
    /// Pages held.
    pub pages: u64,
    /// The most pages held at once.
    pub pages_peak: u64,
    /// Live allocations.
    pub allocations: u64,
    /// Bytes the live allocations asked for.
    pub bytes_in_use: u64,
    /// Bytes of the pages held.
    pub bytes_reserved: u64,
    /// The most bytes in use at once.
    pub peak_bytes_in_use: u64,
    /// The most bytes reserved at once.
    pub peak_bytes_reserved: u64,
    /// The largest allocation served.
    pub largest_alloc: u64,
    /// The pool's own summary line.
    #[serde(skip)]
    pub summary: String,
}

impl From<&crate::memory::PoolReport> for PoolFigures {
    fn from(pool: &crate::memory::PoolReport) -> Self {
        Self {
            kind: pool.kind.to_string(),
            pages: pool.pages,
            pages_peak: pool.pages_peak,
            allocations: pool.usage.number_allocs,
            bytes_in_use: pool.usage.bytes_in_use,
            bytes_reserved: pool.usage.bytes_reserved,
            peak_bytes_in_use: pool.peak_bytes_in_use,
            peak_bytes_reserved: pool.peak_bytes_reserved,
            largest_alloc: pool.largest_alloc,
            summary: pool.to_string(),
        }
    }
}

impl std::fmt::Display for PoolFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.summary)
    }
}

/// A decoder's shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelShape {
    /// Its name.
    pub name: &'static str,
    /// Hidden size.
    pub hidden: u64,
    /// MLP intermediate size.
    pub intermediate: u64,
    /// Decoder layers.
    pub layers: u64,
    /// Attention heads.
    pub heads: u64,
    /// Vocabulary.
    pub vocab: u64,
}

impl ModelShape {
    /// A 7B-class decoder (LLaMA-7B's configuration).
    pub const LLAMA_7B: Self = Self {
        name: "7b",
        hidden: 4096,
        intermediate: 11008,
        layers: 32,
        heads: 32,
        vocab: 32000,
    };

    /// A small decoder (GPT-2 small's widths, 12 layers).
    pub const SMALL: Self = Self {
        name: "small",
        hidden: 768,
        intermediate: 3072,
        layers: 12,
        heads: 12,
        vocab: 32000,
    };

    /// Widths multiplied by `scale` (at least 64; layers kept).
    pub fn scaled(self, scale: f64) -> Self {
        let width = |v: u64| ((v as f64 * scale) as u64).max(64) / 64 * 64;
        Self {
            hidden: width(self.hidden),
            intermediate: width(self.intermediate),
            ..self
        }
    }
}

/// Bytes per element (bf16).
const ELEMENT: u64 = 2;
/// Tokens per KV-cache block (PagedAttention's).
const BLOCK_TOKENS: u64 = 16;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimulateOptions {
    /// The model.
    pub model: ModelShape,
    /// Streams.
    pub streams: u32,
    /// Client threads.
    pub clients: u32,
    /// Requests in all.
    pub requests: u32,
    /// Longest prompt, in tokens.
    pub max_prompt: u64,
    /// Most generated tokens per request.
    pub max_new_tokens: u64,
    /// Seed of the request lengths.
    pub seed: u64,
    /// Sample the timeline this often (`None`: no timeline).
    pub sample_every: Option<Duration>,
    /// What the driver's operations are priced at.
    pub costs: DriverCosts,
}

/// One stream's figures.
#[derive(Debug, Clone, Serialize)]
pub struct StreamFigures {
    /// The stream.
    pub stream: u32,
    /// Most bytes in use at once (all pools).
    pub peak_live_bytes: u64,
    /// Most bytes of pages held at once.
    pub peak_reserved_bytes: u64,
    /// `peak_reserved / peak_live`.
    pub reserved_over_live: f64,
    /// Reservations.
    pub reservations: u64,
    /// Reservations per second of the run.
    pub reservations_per_second: f64,
    /// Median time of a layer's `reserve_many` (served in place, or a round
    /// trip to the actor's thread), microseconds.
    pub round_trip_p50_us: f64,
    /// Its 99th percentile, microseconds.
    pub round_trip_p99_us: f64,
    /// Idle cleanups.
    pub idle_cleanups: u64,
    /// Allocations relocated.
    pub relocated: u64,
    /// The pools once the load fell (the weights still held).
    pub pools: Vec<PoolFigures>,
    /// What its storage asked of the driver (per event: per reservation).
    pub driver: DriverReport,
}

/// What a simulation measured.
#[derive(Debug, Clone, Serialize)]
pub struct SimulationReport {
    /// The model simulated.
    pub model: ModelShape,
    /// Bytes of weights.
    pub weight_bytes: u64,
    /// Requests served.
    pub requests: u64,
    /// Requests that failed for want of memory.
    pub failed_requests: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Per stream.
    pub streams: Vec<StreamFigures>,
    /// Device totals.
    pub peak_reserved_bytes: u64,
    /// Device totals.
    pub peak_live_bytes: u64,
    /// Cross-stream recoveries (a short stream served after others gave back).
    pub recoveries: u64,
    /// Once the requests were done and the streams settled (weights still
    /// held, no explicit cleanup): bytes in use.
    pub settled_live_bytes: u64,
    /// ... and bytes of pages held.
    pub settled_reserved_bytes: u64,
    /// What the device's driver was asked, priced (per event: per
    /// reservation, all streams).
    pub driver: DriverReport,
}

/// xorshift64*, for repeatable request lengths.
struct Lengths(u64);

impl Lengths {
    fn next(&mut self, low: u64, high: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        low + self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % (high - low + 1)
    }
}

/// Load the weights on `stream` inside a persistent window.
fn load_weights(
    stream: &StreamHandle,
    model: &ModelShape,
) -> Result<(Vec<crate::memory::Allocation>, u64), ServiceError> {
    let _window = stream.window(AllocationMode::Persistent);
    let (h, i) = (model.hidden, model.intermediate);
    let mut sizes = vec![model.vocab * h * ELEMENT, model.vocab * h * ELEMENT];
    for _ in 0..model.layers {
        sizes.extend([h * h * ELEMENT; 4]); // q, k, v, o
        sizes.extend([h * i * ELEMENT; 3]); // gate, up, down
        sizes.extend([h * ELEMENT; 2]); // norms
    }
    let bytes = sizes.iter().sum();
    Ok((stream.reserve_many(&sizes)?, bytes))
}

/// The activations one layer reserves for `tokens` tokens at once.
fn layer_activations(model: &ModelShape, tokens: u64, context: u64) -> Vec<u64> {
    let (h, i) = (model.hidden, model.intermediate);
    vec![
        tokens * h * ELEMENT,                               // normed input
        3 * tokens * h * ELEMENT,                           // q, k, v
        (model.heads * tokens * context * ELEMENT).max(64), // attention scores
        tokens * h * ELEMENT,                               // attention output
        2 * tokens * i * ELEMENT,                           // gate, up
        tokens * h * ELEMENT,                               // mlp output
    ]
}

/// Run the server; `progress` is told of each finished request.
pub fn simulate(
    supervisor: &Supervisor,
    options: &SimulateOptions,
    progress: impl Fn() + Sync,
    timeline: Option<&mut Timeline>,
) -> Result<SimulationReport, ServiceError> {
    let model = options.model;
    let streams: Vec<StreamHandle> = (0..options.streams.max(1))
        .map(|i| supervisor.stream(StreamId(i)))
        .collect::<Result<_, _>>()?;
    let events = supervisor.events();
    let (weights, weight_bytes) = load_weights(&streams[0], &model)?;
    let latencies: Vec<Mutex<Vec<Duration>>> =
        streams.iter().map(|_| Mutex::new(Vec::new())).collect();
    let next_request = AtomicU32::new(0);
    let failed = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let samples = Mutex::new(Timeline::new(
        (0..streams.len()).map(|i| format!("stream {i}")).collect(),
        "seconds",
    ));
    let start = Instant::now();
    std::thread::scope(|scope| -> Result<(), ServiceError> {
        if let Some(every) = options.sample_every.filter(|_| timeline.is_some()) {
            let (streams, samples, done) = (&streams, &samples, &done);
            scope.spawn(move || {
                let mut relocated_seen = 0;
                let mut peak_seen = 0;
                loop {
                    // One sample more once the clients are done: a peak
                    // after the last one still reaches the chart.
                    let finished = done.load(Ordering::Acquire);
                    let stats: Vec<_> = streams.iter().map(StreamHandle::stats).collect();
                    // The device's own meters, live first: the bytes live
                    // then were mapped then, so whatever the device holds a
                    // moment later holds them unless they were freed since;
                    // the streams' published figures lag their answers.
                    let device = supervisor.device_stats();
                    let mut timeline = samples.lock();
                    let at = start.elapsed().as_secs_f64();
                    let relocated: u64 = stats.iter().map(|s| s.relocated).sum();
                    let per_stream: Vec<u64> = stats.iter().map(|s| s.bytes_reserved).collect();
                    let live = device.bytes_in_use;
                    // Live bytes lie in reserved ones at every instant: two
                    // reads a moment apart (a free and its unmap between)
                    // must not draw live above reserved.
                    let reserved = device.bytes_reserved.max(live);
                    timeline.observe(at, live, reserved, None);
                    // A peak between two samples widens the bucket to it,
                    // so the chart tops out where the report does.
                    if device.peak_bytes_reserved > peak_seen {
                        peak_seen = device.peak_bytes_reserved;
                        timeline.peak_reserved(peak_seen);
                    }
                    let reserved = per_stream;
                    if relocated > relocated_seen {
                        timeline.relocated(relocated - relocated_seen);
                        relocated_seen = relocated;
                    }
                    timeline.close(reserved);
                    drop(timeline);
                    if finished {
                        break;
                    }
                    std::thread::sleep(every);
                }
            });
        }
        let clients: Vec<_> = (0..options.clients.max(1))
            .map(|client| {
                let stream = streams[client as usize % streams.len()].clone();
                let index = client as usize % streams.len();
                let (latencies, next_request, failed, progress, samples) =
                    (&latencies, &next_request, &failed, &progress, &samples);
                scope.spawn(move || -> Result<(), ServiceError> {
                    loop {
                        let request = next_request.fetch_add(1, Ordering::Relaxed);
                        if request >= options.requests {
                            return Ok(());
                        }
                        let mut lengths = Lengths(
                            options.seed
                                ^ (u64::from(request) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                        );
                        let prompt = lengths.next(8, options.max_prompt.max(8));
                        let new_tokens = lengths.next(1, options.max_new_tokens.max(1));
                        match serve_request(&stream, &model, prompt, new_tokens, &latencies[index])
                        {
                            Ok(()) => {}
                            Err(ServiceError::OutOfMemory(_) | ServiceError::Memory(_)) => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                samples.lock().failed();
                            }
                            Err(other) => return Err(other),
                        }
                        progress();
                    }
                })
            })
            .collect();
        let mut result = Ok(());
        for client in clients {
            if let Err(err) = client.join().expect("client thread panicked") {
                result = Err(err);
            }
        }
        done.store(true, Ordering::Release);
        result
    })?;
    let seconds = start.elapsed().as_secs_f64();
    // The load fell: every request is done, the weights are still held.
    let settled = supervisor.settled()?;
    let recoveries = events
        .drain()
        .iter()
        .filter(|e| matches!(e, SupervisorEvent::Recovered { .. }))
        .count() as u64;
    let mut figures = Vec::new();
    let mut device_paths = DriverPaths::default();
    let mut reservations = 0;
    for (index, stream) in streams.iter().enumerate() {
        let report = stream.report()?;
        device_paths = device_paths.combine(report.driver_paths);
        let stats = stream.stats();
        let mut samples = latencies[index].lock().clone();
        samples.sort();
        let percentile = |q: f64| {
            samples
                .get(((samples.len().max(1) - 1) as f64 * q) as usize)
                .map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        figures.push(StreamFigures {
            stream: index as u32,
            peak_live_bytes: report.peak_bytes_in_use,
            peak_reserved_bytes: report.peak_bytes_reserved,
            reserved_over_live: report.peak_bytes_reserved as f64
                / report.peak_bytes_in_use.max(1) as f64,
            reservations: stats.reservations,
            reservations_per_second: stats.reservations as f64 / seconds,
            round_trip_p50_us: percentile(0.5),
            round_trip_p99_us: percentile(0.99),
            idle_cleanups: stats.idle_cleanups,
            relocated: stats.relocated,
            pools: report.pools().map(PoolFigures::from).collect(),
            driver: DriverReport::by_path(
                report.driver_paths,
                report.driver.peak_granules_mapped,
                stats.reservations,
                &options.costs,
            ),
        });
        reservations += stats.reservations;
    }
    // The pools above were read with the weights held, as the settled
    // figures were.
    drop(weights);
    if let Some(timeline) = timeline {
        *timeline = samples.into_inner();
    }
    let device: DeviceStats = supervisor.device_stats();
    Ok(SimulationReport {
        model,
        weight_bytes,
        requests: u64::from(options.requests),
        failed_requests: failed.into_inner(),
        seconds,
        streams: figures,
        peak_reserved_bytes: device.peak_bytes_reserved,
        peak_live_bytes: device.peak_bytes_in_use,
        recoveries,
        settled_live_bytes: settled.bytes_in_use,
        settled_reserved_bytes: settled.bytes_reserved,
        driver: DriverReport::by_path(
            device_paths,
            device.peak_granules_mapped,
            reservations,
            &options.costs,
        ),
    })
}

/// One request: prefill the prompt, then decode token by token, with the
/// KV cache growing a block at a time and freed at the end.
fn serve_request(
    stream: &StreamHandle,
    model: &ModelShape,
    prompt: u64,
    new_tokens: u64,
    latencies: &Mutex<Vec<Duration>>,
) -> Result<(), ServiceError> {
    let block_bytes = 2 * model.layers * BLOCK_TOKENS * model.hidden * ELEMENT;
    let mut kv_cache = Vec::new();
    let timed = |sizes: &[u64]| -> Result<Vec<crate::memory::Allocation>, ServiceError> {
        let start = Instant::now();
        let batch = stream.reserve_many(sizes)?;
        latencies.lock().push(start.elapsed());
        Ok(batch)
    };
    let mut context = 0;
    for step in 0..=new_tokens {
        let tokens = if step == 0 { prompt } else { 1 };
        context += tokens;
        let blocks = context.div_ceil(BLOCK_TOKENS) as usize;
        if blocks > kv_cache.len() {
            kv_cache.extend(timed(&vec![block_bytes; blocks - kv_cache.len()])?);
        }
        let logits_size = tokens.min(1) * model.vocab * ELEMENT;
        for _ in 0..model.layers {
            // A layer's activations live until the next layer's are made.
            drop(timed(&layer_activations(model, tokens, context))?);
        }
        drop(timed(&[logits_size])?);
    }
    drop(kv_cache);
    Ok(())
}
