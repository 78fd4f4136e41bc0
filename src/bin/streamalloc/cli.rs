//! The command line's arguments, and what the subcommands share: the
//! storage and service they build, the driver's pricing, progress, plots
//! and pages, the words of their reports.

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::path::PathBuf;
use streamalloc::memory::{Bytes, DeviceProperties, MemoryConfig, MemoryConfiguration};
use streamalloc::plot::{Timeline, write_svg};
use streamalloc::service::{Calls, Headroom, ServiceConfig, Settle, StorageFactory};
use streamalloc::storage::{
    DeviceStorage, DriverCosts, DriverReport, HandleCut, HostStorage, VirtualStorage,
};
use streamalloc::trace::TraceFormat;

#[derive(Parser, Debug)]
#[command(
    name = "streamalloc",
    version,
    about = "A device-memory manager for multi-stream inference servers"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run an in-process multi-stream inference server on the allocator
    /// service and report memory and latency per stream and pool.
    Simulate(SimulateArgs),
    /// Replay an allocation trace (RMM CSV, PyTorch snapshot, or JSON Lines)
    /// through the service and report peak live and reserved bytes.
    Replay(ReplayArgs),
    /// Convert a trace to this project's JSON Lines format.
    Convert(ConvertArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum StorageKind {
    /// Real host memory.
    Host,
    /// Counts bytes, holds none (replays a GPU larger than this machine).
    Virtual,
    /// An NVIDIA GPU through CUDA (needs the `cuda` feature).
    Cuda,
}

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Preset {
    /// Expandable arenas: address space mapped a granule at a time (the
    /// adaptive layout on a storage without virtual memory).
    Expandable,
    /// Metadata pages plus the adaptive arena.
    Adaptive,
    /// One allocation per page, size-binned.
    Exclusive,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum Model {
    /// A small decoder: hidden 768, intermediate 3072, 12 layers.
    Small,
    /// A 7B-class decoder: hidden 4096, intermediate 11008, 32 layers.
    #[value(name = "7b")]
    Llama7b,
}

#[derive(clap::Args, Debug)]
pub(crate) struct Common {
    /// Where pages come from.
    #[arg(long, value_enum)]
    pub(crate) storage: Option<StorageKind>,
    /// How far the modeled device runs behind its host, in cleanup points
    /// of each stream (`host` and `virtual` storage): memory given back
    /// goes only that many flushes later, and granules mapped again before
    /// then are taken back with no driver call. 0: at once, as on a GPU
    /// with no kernels queued, which is what a replay of allocation events
    /// is.
    #[arg(long, default_value_t = 0)]
    pub(crate) reclaim_lag: u64,
    /// The most 2 MiB granules one physical handle covers: a run of fresh
    /// granules is mapped with one driver call per this many, and memory
    /// goes back a whole handle at a time (1: a handle per granule).
    #[arg(long, default_value_t = streamalloc::storage::DEFAULT_HANDLE_GRANULES,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) handle_granules: u64,
    /// Streams cut physical handles at up to one in this many of the
    /// granules a range holds (64 by default): fewer driver calls, more
    /// bytes held (free granules of a handle partly in use stay, at the
    /// peak and after the load falls).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) handle_share: Option<u64>,
    /// Streams that share their device cut physical handles at up to one
    /// in this many of the most granules a range held, instead of
    /// `--handle-share`'s: fewer driver calls as memory moves between
    /// streams, more bytes held at the peak.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) shared_handle_share: Option<u64>,
    /// The pool layout.
    #[arg(long = "config", value_enum, default_value = "expandable")]
    pub(crate) preset: Preset,
    /// Simulate a device of this many bytes: `300M`, `1.5GiB`, `80GB`
    /// (K, M, G, T and KiB..TiB are powers of 1024; KB, MB, GB, TB powers
    /// of 1000; B or nothing: bytes).
    #[arg(long, value_parser = parse_bytes, allow_hyphen_values = true)]
    pub(crate) budget: Option<u64>,
    /// How far the device's reserved bytes may run ahead of its peak live
    /// bytes before a growing stream first gets cached pages back, as a
    /// fraction (0.04 is 4 %), or `off` to let every stream keep its cache.
    /// By default 0.01 on the expandable preset, 0.04 on the page presets
    /// (`Headroom::for_memory`).
    #[arg(long, value_parser = parse_headroom)]
    pub(crate) headroom: Option<HeadroomArg>,
    /// The ratio of reserved to recently used bytes past which a stream
    /// gives the excess back when its load falls (1.04), or `off` to keep
    /// pages cached until each pool's periodic cleanup.
    #[arg(long, default_value = "1.04", value_parser = parse_settle)]
    pub(crate) settle: SettleArg,
    /// A stream about to grow the device past its headroom first asks the
    /// others to serve it from their room (lending): fewer driver calls,
    /// peaks up to 0.03 of live higher on some multi-stream traces. Off:
    /// memory moves between streams only in rounds that unmap it there and
    /// map it here.
    #[arg(long)]
    pub(crate) lend: bool,
    /// Let each client handle keep hot caches of the sizes it repeats
    /// (served with no round trip; can move the peak by a percent or two).
    #[arg(long)]
    pub(crate) hot_cache: bool,
    /// Trim each expandable pool's free granules after every reservation
    /// instead of keeping them mapped up to the pool's peak (more driver
    /// calls; what every release before this one did).
    #[arg(long)]
    pub(crate) trim_to_live: bool,
    /// Draw live and reserved bytes over time to this SVG file.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
    /// Write one self-contained HTML page: memory over time with zoom, the
    /// allocations live at the peak and along the trace with the stacks
    /// that made them, and per-stream and per-pool tables.
    #[arg(long, value_name = "PAGE.html")]
    pub(crate) html: Option<PathBuf>,
    /// Print one JSON object instead of the human report.
    #[arg(long)]
    pub(crate) json: bool,
    /// No progress on stderr.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Price the driver's operations with this JSON table of nanoseconds
    /// per call (`DriverCosts`' fields; those left out keep the NVIDIA
    /// H200's, the default).
    #[arg(long, value_name = "JSON")]
    pub(crate) driver_costs: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub(crate) struct SimulateArgs {
    #[command(flatten)]
    pub(crate) common: Common,
    /// The model whose shapes the server uses.
    #[arg(long, value_enum, default_value = "small")]
    pub(crate) model: Model,
    /// Multiply the model's widths by this (a number above 0).
    #[arg(long, default_value_t = 1.0, value_parser = parse_scale)]
    pub(crate) scale: f64,
    /// Device streams (one allocator actor each; at most 256, what a
    /// device runs).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) streams: u32,
    /// Client threads submitting requests.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) clients: u32,
    /// Requests in all.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) requests: u32,
    /// Longest prompt, tokens.
    #[arg(long, default_value_t = 512)]
    pub(crate) max_prompt: u64,
    /// Most generated tokens per request.
    #[arg(long, default_value_t = 64)]
    pub(crate) max_new_tokens: u64,
    /// Seed of the request lengths (same seed, same requests).
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// Record every reservation and free to this JSON Lines trace (for
    /// `replay`, or to feed another allocator the same sequence).
    #[arg(long)]
    pub(crate) record: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub(crate) struct ReplayArgs {
    /// The trace file.
    pub(crate) file: PathBuf,
    /// Its format (detected when not given).
    #[arg(long, value_parser = format_parser())]
    pub(crate) format: Option<TraceFormat>,
    /// Find the smallest budget the trace fits: bisect over replays (each
    /// the same on every run) to 1 MiB or 0.1 %, whichever is larger, and
    /// report the bracket (fits in X, not in Y) with the replay at X.
    #[arg(long, conflicts_with = "budget")]
    pub(crate) min_budget: bool,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(clap::Args, Debug)]
pub(crate) struct ConvertArgs {
    /// The trace to read.
    pub(crate) input: PathBuf,
    /// Where to write JSON Lines.
    pub(crate) output: PathBuf,
    /// The input's format (detected when not given).
    #[arg(long, value_parser = format_parser())]
    pub(crate) format: Option<TraceFormat>,
    /// No progress on stderr.
    #[arg(long)]
    pub(crate) quiet: bool,
}

/// `--format`'s values, listed in `--help`.
fn format_parser() -> impl clap::builder::TypedValueParser<Value = TraceFormat> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["jsonl", "rmm", "torch"])
        .map(|name| name.parse().expect("every listed name parses"))
}

/// `--budget`: a size, as [`Bytes`] parses one.
fn parse_bytes(text: &str) -> Result<u64, String> {
    text.parse::<Bytes>().map(|bytes| bytes.0)
}

/// What makes each stream's storage: of `kind`, shaped by `common`'s
/// `--reclaim-lag` and `--handle-granules`.
pub(crate) fn factory(kind: StorageKind, common: &Common) -> Result<StorageFactory, String> {
    let (lag, handle) = (common.reclaim_lag, common.handle_granules);
    match kind {
        StorageKind::Host => Ok(Box::new(move |_| {
            let storage = HostStorage::new().with_reclaim_lag(lag);
            Ok(Box::new(storage.with_handle_granules(handle)) as Box<dyn DeviceStorage>)
        })),
        StorageKind::Virtual => Ok(Box::new(move |_| {
            let storage = VirtualStorage::new().with_reclaim_lag(lag);
            Ok(Box::new(storage.with_handle_granules(handle)) as Box<dyn DeviceStorage>)
        })),
        #[cfg(feature = "cuda")]
        StorageKind::Cuda => {
            let context =
                streamalloc::storage::CudaStorage::context(0).map_err(|e| e.to_string())?;
            Ok(Box::new(move |_| {
                streamalloc::storage::CudaStorage::on_context(context.clone())
                    .map(|s| Box::new(s.with_handle_granules(handle)) as Box<dyn DeviceStorage>)
            }))
        }
        #[cfg(not(feature = "cuda"))]
        StorageKind::Cuda => {
            Err("this build has no CUDA support; rebuild with --features cuda".into())
        }
    }
}

/// `--scale`: a finite number above 0 (widths of 0, or NaN, model nothing).
fn parse_scale(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(scale) if scale.is_finite() && scale > 0.0 => Ok(scale),
        _ => Err(format!("`{text}` is not a number above 0")),
    }
}

/// The table `--driver-costs` names, or the H200's.
pub(crate) fn driver_costs(common: &Common) -> Result<DriverCosts, String> {
    let Some(path) = &common.driver_costs else {
        return Ok(DriverCosts::default());
    };
    let named = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| named(&e))?;
    let mut costs: DriverCosts = serde_json::from_str(&text).map_err(|e| named(&e))?;
    if !text.contains("\"name\"") {
        costs.name = format!("{} (the H200's where it is silent)", path.display()).into();
    }
    Ok(costs)
}

/// The driver figures of a report, in two lines.
pub(crate) fn print_driver(prefix: &str, driver: &DriverReport) {
    let ops = &driver.ops;
    println!(
        "{prefix}driver ({} model): {} calls, {:.1} us per event ({:.1} beyond mapping the peak once), {:.3} s in all",
        driver.costs,
        driver.calls,
        driver.modeled_us_per_event,
        driver.beyond_peak_us_per_event,
        driver.modeled_ns as f64 / 1e9,
    );
    println!(
        "{prefix}granules mapped {} over a peak of {} at once ({:.2}x; {} in new handles), unmapped {}; pages allocated {}, freed {}; stream waits {}; copies {} ({})",
        driver.granules_mapped,
        driver.peak_granules_mapped,
        driver.mapped_over_peak,
        ops.handle_granules_created,
        ops.granules_unmapped(),
        ops.pages_allocated,
        ops.pages_freed,
        driver.stream_waits,
        ops.copies,
        Bytes(ops.bytes_copied),
    );
    if !driver.by_path.is_empty() {
        let paths: Vec<String> = (driver.by_path.iter())
            .map(|cost| format!("{} {:.2}", cost.path, cost.us_per_event))
            .collect();
        println!("{prefix}  by path, us per event: {}", paths.join(", "));
        let mapped: Vec<String> = (driver.by_path.iter())
            .filter(|cost| cost.granules_mapped > 0)
            .map(|cost| format!("{} {}", cost.path, cost.granules_mapped))
            .collect();
        if !mapped.is_empty() {
            println!("{prefix}  granules mapped by path: {}", mapped.join(", "));
        }
    }
}

pub(crate) fn service_config(common: &Common, device: DeviceProperties) -> ServiceConfig {
    let pools = match common.preset {
        Preset::Expandable => MemoryConfiguration::Expandable,
        Preset::Adaptive => MemoryConfiguration::Adaptive,
        Preset::Exclusive => MemoryConfiguration::ExclusivePages,
    };
    let memory = MemoryConfig {
        name: "cli".into(),
        device,
        keep_peak_mapped: !common.trim_to_live,
        ..MemoryConfig::with_pools(pools)
    };
    ServiceConfig {
        headroom: common.headroom.map_or_else(
            || Some(Headroom::for_memory(&memory)),
            |headroom| headroom.0,
        ),
        memory,
        budget: common.budget,
        settle: common.settle.0,
        handle_share: common.handle_share,
        shared_handle_share: common.shared_handle_share,
        lend_across_streams: common.lend,
        calls: Calls {
            hot_cache: common.hot_cache,
            ..Calls::default()
        },
        ..ServiceConfig::default()
    }
}

/// The settings a run went by, as its JSON report names them (defaults
/// filled in): two reports compare where these agree.
#[derive(Debug, Serialize)]
pub(crate) struct Settings {
    storage: StorageKind,
    config: Preset,
    budget: Option<u64>,
    /// The headroom's fraction, `None` where off.
    headroom: Option<f64>,
    /// The settle's ratio, `None` where off.
    settle: Option<f64>,
    handle_granules: u64,
    handle_share: u64,
    shared_handle_share: u64,
    reclaim_lag: u64,
    hot_cache: bool,
    trim_to_live: bool,
    /// Streams past the headroom ask the others to serve them first.
    lend: bool,
}

impl Settings {
    /// What `common` and the service it configured (`config`) on
    /// `storage` go by.
    pub(crate) fn of(common: &Common, storage: StorageKind, config: &ServiceConfig) -> Self {
        let handle_share = config
            .handle_share
            .unwrap_or(HandleCut::default().share_one_in);
        Self {
            storage,
            config: common.preset,
            budget: config.budget,
            headroom: config.headroom.map(|headroom| headroom.fraction),
            settle: config.settle.map(|settle| settle.ratio),
            handle_granules: common.handle_granules,
            handle_share,
            shared_handle_share: config.shared_handle_share.unwrap_or(handle_share),
            reclaim_lag: common.reclaim_lag,
            hot_cache: common.hot_cache,
            trim_to_live: common.trim_to_live,
            lend: config.lend_across_streams,
        }
    }
}

/// The name the command line takes for `value` (`virtual`, `expandable`).
fn value_name(value: impl ValueEnum) -> String {
    value
        .to_possible_value()
        .map_or_else(String::new, |name| name.get_name().to_string())
}

impl std::fmt::Display for Settings {
    /// One line: what a page shows of the settings.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let off_or = |value: Option<f64>, show: &dyn Fn(f64) -> String| {
            value.map_or_else(|| "off".to_string(), show)
        };
        write!(
            f,
            "{} storage, {} pools, budget {}, headroom {}, settle {}, physical handles of up to {} granules and 1/{} of a range (1/{} where streams share a device)",
            value_name(self.storage),
            value_name(self.config),
            self.budget
                .map_or_else(|| "none".to_string(), |budget| Bytes(budget).to_string()),
            off_or(self.headroom, &|fraction| format!(
                "{:.0} %",
                fraction * 100.0
            )),
            off_or(self.settle, &|ratio| format!("at {ratio}")),
            self.handle_granules,
            self.handle_share,
            self.shared_handle_share,
        )?;
        if self.reclaim_lag > 0 {
            write!(f, ", reclaim {} flushes behind", self.reclaim_lag)?;
        }
        if self.hot_cache {
            f.write_str(", hot caches")?;
        }
        if self.trim_to_live {
            f.write_str(", trimmed to live")?;
        }
        if self.lend {
            f.write_str(", lending between streams")?;
        }
        Ok(())
    }
}

/// `--settle`: a ratio, or `off`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SettleArg(Option<Settle>);

fn parse_settle(text: &str) -> Result<SettleArg, String> {
    let ratio = number_or_off(text, 1.0, "a ratio")?;
    Ok(SettleArg(ratio.map(|ratio| Settle {
        ratio,
        ..Settle::default()
    })))
}

/// `--headroom`: a fraction, or `off`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadroomArg(Option<Headroom>);

fn parse_headroom(text: &str) -> Result<HeadroomArg, String> {
    let fraction = number_or_off(text, 0.0, "a fraction")?;
    Ok(HeadroomArg(fraction.map(|fraction| Headroom {
        fraction,
        ..Headroom::default()
    })))
}

/// A policy's option: `off` (`None`), or a finite number of at least `least`.
fn number_or_off(text: &str, least: f64, what: &str) -> Result<Option<f64>, String> {
    if text == "off" {
        return Ok(None);
    }
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value >= least => Ok(Some(value)),
        _ => Err(format!(
            "`{text}` is neither {what} of at least {least} nor `off`"
        )),
    }
}

pub(crate) fn progress_bar(total: u64, what: &str, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{bar:40}] {pos}/{len} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// Draw `timeline` to `path` (if asked), never over `input`: drawn to a
/// temporary file beside it, then renamed.
pub(crate) fn plot(
    path: &Option<PathBuf>,
    timeline: &Timeline,
    title: &str,
    input: Option<&std::path::Path>,
    quiet: bool,
) -> Result<(), String> {
    let Some(path) = path else {
        return Ok(());
    };
    if let Some(input) = input {
        crate::output::check_not_input(path, input)?;
    }
    let temporary = crate::output::AtomicFile::create(path)?;
    let drawn = temporary.temporary_path().to_path_buf();
    write_svg(timeline, &drawn, title)?;
    temporary.commit()?;
    if !quiet {
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}

/// Write `page` to `path`, never over `input`: to a temporary file beside
/// it, then renamed.
pub(crate) fn write_page(
    path: &std::path::Path,
    page: &streamalloc::html::Page<'_>,
    input: Option<&std::path::Path>,
    quiet: bool,
) -> Result<(), String> {
    if let Some(input) = input {
        crate::output::check_not_input(path, input)?;
    }
    let temporary = crate::output::AtomicFile::create(path)?;
    streamalloc::html::write_html(page, temporary.temporary_path())?;
    temporary.commit()?;
    if !quiet {
        eprintln!("page written to {}", path.display());
    }
    Ok(())
}

/// What a command came to: done, or a replay that did not fit its budget.
pub(crate) enum Outcome {
    /// It ran and its answer is the good one.
    Done,
    /// A replay whose trace did not fit the budget (exit code 3).
    DoesNotFit,
}

/// The exit code of a replay whose trace does not fit its budget.
pub(crate) const EXIT_DOES_NOT_FIT: u8 = 3;

/// An HTML page's name: `.html` or `.htm`, in a directory that exists.
pub(crate) fn check_html(path: &std::path::Path) -> Result<(), String> {
    let html = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("html") || e.eq_ignore_ascii_case("htm"));
    if !html {
        return Err(format!(
            "{}: the report is an HTML page: name it with .html",
            path.display()
        ));
    }
    streamalloc::plot::check_directory(path, "the page")?;
    Ok(())
}

/// `word`, with an s unless there is one.
pub(crate) fn plural(count: impl Into<u64>, word: &str) -> String {
    if count.into() == 1 {
        word.to_string()
    } else {
        format!("{word}s")
    }
}
