//! `replay` and `convert`: read a trace as a stream, replay it through one
//! supervisor per device, report beside the recorded allocator's figures.

use crate::cli::{
    ConvertArgs, Outcome, ReplayArgs, Settings, StorageKind, check_html, driver_costs, factory,
    plot, plural, print_driver, service_config,
};
use crate::output::Output;
use crate::progress::Progress;
use serde::Serialize;
use streamalloc::clock::ManualClock;
use streamalloc::memory::{Bytes, DeviceProperties};
use streamalloc::plot::check_output;
use streamalloc::replay::{ReplayReport, Replayer, sample_live};
use streamalloc::service::{ServiceConfig, Supervisor};
use streamalloc::trace::{TraceMeta, TraceReader, write_trace_jsonl};

/// Events between two progress updates.
const PROGRESS_EVERY: u64 = 4096;

/// The JSON a replay prints: the report, and what the trace said of itself.
#[derive(Serialize)]
struct ReplayJson<'a> {
    #[serde(flatten)]
    report: &'a ReplayReport,
    trace: &'a TraceMeta,
    settings: &'a Settings,
}

fn open(
    path: &std::path::Path,
    args_format: Option<streamalloc::trace::TraceFormat>,
    progress: &Progress,
) -> Result<TraceReader, String> {
    let named = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    if std::fs::metadata(path).is_ok_and(|m| m.len() > 1 << 20)
        && path
            .extension()
            .is_some_and(|e| e == "pickle" || e == "pkl")
    {
        progress.note(&format!("decoding {}", path.display()));
    }
    TraceReader::open(path, args_format).map_err(|e| named(&e))
}

/// One replay's outcome: the report and what the trace said of itself.
struct Replayed {
    report: ReplayReport,
    meta: TraceMeta,
    settings: Settings,
}

/// Replay the trace once under `budget` (the command's own when `None` is
/// not asked for), drawing the plot if `draw`.
fn replay_once(
    args: &ReplayArgs,
    budget: Option<u64>,
    draw: bool,
    label: &str,
    quiet: bool,
) -> Result<Replayed, String> {
    let size = std::fs::metadata(&args.file)
        .map_err(|e| format!("{}: {e}", args.file.display()))?
        .len();
    let mut progress = Progress::bytes(size, label, quiet);
    let mut reader = open(&args.file, args.format, &progress)?;
    let kind = args.common.storage.unwrap_or(StorageKind::Virtual);
    // A replayed trace may hold allocations as large as its device. On the
    // trace's clock: the same trace gives the same report on every run
    // (`replay/mod.rs`).
    let config = ServiceConfig {
        clock: ManualClock::shared(),
        budget,
        ..service_config(&args.common, DeviceProperties::new(1 << 40, 256))
    };
    let settings = Settings::of(&args.common, kind, &config);
    let costs = driver_costs(&args.common)?;
    let mut factory_error = None;
    let report = {
        let mut replayer = Replayer::new(|_device| {
            let storage = factory(kind, &args.common).unwrap_or_else(|err| {
                factory_error = Some(err);
                factory(StorageKind::Virtual, &args.common).expect("virtual storage always exists")
            });
            Supervisor::new(config.clone(), storage)
        });
        replayer.price_with(costs);
        if draw {
            replayer.record_timeline();
        }
        while let Some(event) = reader.next() {
            let event = event.map_err(|e| format!("{}: {e}", args.file.display()))?;
            replayer.event(&event).map_err(|e| e.to_string())?;
            if replayer.events() % PROGRESS_EVERY == 0 {
                progress.set(reader.bytes_read());
            }
        }
        if replayer.events() == 0 {
            return Err(format!(
                "{}: the trace holds no events",
                args.file.display()
            ));
        }
        progress.set(size);
        let timeline = replayer.take_timeline();
        let report = replayer.finish().map_err(|e| e.to_string())?;
        if let Some(mut timeline) = timeline {
            if report.recorded_peak_reserved_bytes.is_some() {
                timeline.recorded_name = Some(recorded_name(reader.meta()).into());
            }
            plot(
                &args.common.plot,
                &timeline,
                &format!("replay: {}", args.file.display()),
                Some(&args.file),
                quiet,
            )?;
            if let Some(path) = &args.common.html {
                write_page(
                    args,
                    &settings,
                    &report,
                    &timeline,
                    reader.meta(),
                    path,
                    quiet,
                )?;
            }
        }
        report
    };
    progress.finish();
    if let Some(err) = factory_error {
        return Err(err);
    }
    Ok(Replayed {
        report,
        meta: reader.meta().clone(),
        settings,
    })
}

/// Moments along the trace whose live allocations the page shows (the
/// peak besides).
const SAMPLE_POINTS: u64 = 2_000;
/// The largest allocations shown at the peak...
const SAMPLE_TOP_AT_PEAK: usize = 100;
/// ... and at each other moment.
const SAMPLE_TOP: usize = 30;

/// `--html`: the page of one replay. The allocations live along the trace
/// come from a second pass over the file (no allocator: bookkeeping only),
/// at moments the replay's count of events and its peak fix.
fn write_page(
    args: &ReplayArgs,
    settings: &Settings,
    report: &ReplayReport,
    timeline: &streamalloc::timeline::Timeline,
    meta: &TraceMeta,
    path: &std::path::Path,
    quiet: bool,
) -> Result<(), String> {
    let named = |e: &dyn std::fmt::Display| format!("{}: {e}", args.file.display());
    let reader = TraceReader::open(&args.file, args.format).map_err(|e| named(&e))?;
    let samples = sample_live(
        reader,
        report.events,
        report.peak_live_event,
        SAMPLE_POINTS,
        SAMPLE_TOP,
        SAMPLE_TOP_AT_PEAK,
    )
    .map_err(|e| named(&e))?;
    let recorded = recorded_name(meta);
    let mut notes = vec![format!(
        "{} {} on {} {}; driver priced as an {} would charge it ({} calls).",
        report.events,
        plural(report.events, "event"),
        report.streams,
        plural(report.streams as u64, "stream"),
        report.driver.costs,
        report.driver.calls,
    )];
    notes.push(format!("Settings: {settings}."));
    if let Some(budget) = report.budget {
        notes.push(format!(
            "Budget {} per device: {}.",
            Bytes(budget),
            if report.failures == 0 {
                "the trace fits".to_string()
            } else {
                format!(
                    "the trace does NOT fit ({} {} failed)",
                    report.failures,
                    plural(report.failures, "allocation")
                )
            }
        ));
    }
    let page = streamalloc::html::Page {
        title: format!("streamalloc replay: {}", args.file.display()),
        facts: streamalloc::html::replay_facts(report, recorded),
        timeline,
        samples: Some(&samples),
        stacks: &meta.stacks,
        tables: streamalloc::html::replay_tables(report),
        notes,
    };
    crate::cli::write_page(path, &page, Some(&args.file), quiet)
}

pub(crate) fn replay(args: ReplayArgs) -> Result<Outcome, String> {
    // Checked first: a bad output path fails before the work, not after.
    if let Some(path) = &args.common.plot {
        check_output(path)?;
    }
    if let Some(path) = &args.common.html {
        check_html(path)?;
    }
    let quiet = args.common.quiet || args.common.json;
    if args.min_budget {
        return min_budget(&args, quiet);
    }
    let label = format!("replay {}", args.file.display());
    let Replayed {
        report,
        meta,
        settings,
    } = replay_once(
        &args,
        args.common.budget,
        args.common.plot.is_some() || args.common.html.is_some(),
        &label,
        quiet,
    )?;
    if args.common.json {
        let json = ReplayJson {
            report: &report,
            trace: &meta,
            settings: &settings,
        };
        println!(
            "{}",
            serde_json::to_string(&json).map_err(|e| e.to_string())?
        );
    } else {
        print_report(&report, &meta);
    }
    if report.failures > 0 {
        let first = report
            .first_failure
            .as_ref()
            .map(|f| format!(" (first, {f})"))
            .unwrap_or_default();
        let failed = format!(
            "{} {} failed",
            report.failures,
            plural(report.failures, "allocation")
        );
        match report.budget {
            Some(budget) => eprintln!(
                "{}: does not fit the budget of {}: {failed}{first}",
                args.file.display(),
                Bytes(budget),
            ),
            None => eprintln!("{}: {failed}{first}", args.file.display()),
        }
        return Ok(Outcome::DoesNotFit);
    }
    Ok(Outcome::Done)
}

/// The smallest budget found, as `--min-budget --json` prints it.
#[derive(Serialize)]
struct MinBudget {
    /// The trace fits a budget of this many bytes...
    fits: u64,
    /// ... and not one of this many (known without a replay when it is
    /// one byte under the peak live bytes, which no budget below can hold).
    does_not_fit: u64,
    /// The bracket is at most this wide: 1 MiB or 0.1 % of `fits`,
    /// whichever is larger.
    precision: u64,
    /// Replays it took.
    replays: u32,
}

#[derive(Serialize)]
struct MinBudgetJson<'a> {
    min_budget: &'a MinBudget,
    /// The replay under the smallest budget that fits.
    #[serde(flatten)]
    report: &'a ReplayReport,
    trace: &'a TraceMeta,
}

/// The bracket's width at which bisection stops.
fn precision(fits: u64) -> u64 {
    (1u64 << 20).max(fits / 1000)
}

/// `replay --min-budget`: bisect over replays (each the same on every run,
/// so the answer is too) for the smallest budget the trace fits.
fn min_budget(args: &ReplayArgs, quiet: bool) -> Result<Outcome, String> {
    let replays = std::cell::Cell::new(0u32);
    let once = |budget: Option<u64>, draw: bool| {
        replays.set(replays.get() + 1);
        let n = replays.get();
        let label = match budget {
            Some(budget) => format!("min-budget: replay {n} at {}", Bytes(budget)),
            None => format!("min-budget: replay {n} without a budget"),
        };
        replay_once(args, budget, draw, &label, quiet)
    };
    let free = once(None, false)?;
    // The budget is each device's: the bracket is that of the device that
    // needs the most. No budget under its most bytes live at once can hold
    // them; its unbudgeted peak is where bisection starts.
    let devices = if free.report.devices.is_empty() {
        std::slice::from_ref(&free.report)
    } else {
        free.report.devices.as_slice()
    };
    let most = |figure: fn(&ReplayReport) -> u64| devices.iter().map(figure).max().unwrap_or(0);
    let mut does_not_fit = most(|d| d.peak_live_bytes).saturating_sub(1);
    let mut fits = most(|d| d.peak_reserved_bytes).max(1);
    let mut best = loop {
        let tried = once(Some(fits), false)?;
        if tried.report.fits != Some(false) {
            break tried;
        }
        // Tighter than unbudgeted growth can be worse: widen the bracket.
        does_not_fit = fits;
        fits = fits
            .saturating_add(fits / 4)
            .max(fits.saturating_add(1 << 20));
        if replays.get() > 64 {
            return Err(format!(
                "{}: no budget up to {} fits",
                args.file.display(),
                Bytes(fits)
            ));
        }
    };
    while fits - does_not_fit > precision(fits) {
        let mid = does_not_fit + (fits - does_not_fit) / 2;
        let tried = once(Some(mid), false)?;
        if tried.report.fits == Some(false) {
            does_not_fit = mid;
        } else {
            fits = mid;
            best = tried;
        }
    }
    if args.common.plot.is_some() || args.common.html.is_some() {
        best = once(Some(fits), true)?;
    }
    let found = MinBudget {
        fits,
        does_not_fit,
        precision: precision(fits),
        replays: replays.get(),
    };
    if args.common.json {
        let json = MinBudgetJson {
            min_budget: &found,
            report: &best.report,
            trace: &best.meta,
        };
        println!(
            "{}",
            serde_json::to_string(&json).map_err(|e| e.to_string())?
        );
    } else {
        println!(
            "smallest budget: fits in {}, not in {} ({} bytes / {} bytes; within {}, {} replays)",
            Bytes(found.fits),
            Bytes(found.does_not_fit),
            found.fits,
            found.does_not_fit,
            Bytes(found.precision),
            found.replays
        );
        print_report(&best.report, &best.meta);
    }
    Ok(Outcome::Done)
}

/// What to call the allocator that recorded the trace.
fn recorded_name(meta: &TraceMeta) -> &'static str {
    if meta.source.starts_with("pytorch") {
        "PyTorch"
    } else {
        "recorded"
    }
}

fn print_report(report: &ReplayReport, meta: &TraceMeta) {
    println!(
        "replayed {} {} on {} {}{} ({:.0} ns/event)",
        report.events,
        plural(report.events, "event"),
        report.streams,
        plural(report.streams as u64, "stream"),
        if report.devices.is_empty() {
            String::new()
        } else {
            format!(" of {} devices", report.devices.len())
        },
        report.ns_per_op
    );
    for device in &meta.devices {
        println!(
            "snapshot, device {}: {} {} holding {}, {} {} live ({}); {} {} live before the recording began ({})",
            device.device,
            device.segments,
            plural(device.segments, "segment"),
            Bytes(device.reserved_bytes),
            device.active_blocks,
            plural(device.active_blocks, "block"),
            Bytes(device.active_bytes),
            device.preexisting_allocations,
            plural(device.preexisting_allocations, "allocation"),
            Bytes(device.preexisting_bytes),
        );
    }
    if !meta.allocator_settings.is_empty() {
        let settings: Vec<String> = meta
            .allocator_settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!("allocator settings: {}", settings.join(", "));
    }
    let name = recorded_name(meta);
    for device in &report.devices {
        print_figures(
            &format!("device {}: ", device.device.unwrap_or(0)),
            device,
            name,
        );
    }
    print_figures(
        if report.devices.is_empty() {
            ""
        } else {
            "all devices: "
        },
        report,
        name,
    );
}

fn print_figures(prefix: &str, report: &ReplayReport, recorded: &str) {
    let reasons = if report.failure_reasons.is_empty() {
        String::new()
    } else {
        let each: Vec<String> = report
            .failure_reasons
            .iter()
            .map(|(reason, count)| format!("{reason} {count}"))
            .collect();
        format!(": {}", each.join(", "))
    };
    println!(
        "{prefix}allocations {}, frees {}, failures {}{reasons} (trace recorded {}), unknown frees {}, implicit frees {}",
        report.allocations,
        report.frees,
        report.failures,
        report.trace_failures,
        report.unknown_frees,
        report.implicit_frees,
    );
    println!(
        "{prefix}peak live {}, peak reserved {}, reserved / live {:.3}, relocated {}",
        Bytes(report.peak_live_bytes),
        Bytes(report.peak_reserved_bytes),
        report.reserved_over_live,
        report.relocated
    );
    if let (Some(theirs), Some(saved)) = (report.recorded_peak_reserved_bytes, report.saved_bytes) {
        let verdict = if saved >= 0 {
            format!("{} saved", Bytes(saved.unsigned_abs()))
        } else {
            format!("{} more", Bytes(saved.unsigned_abs()))
        };
        println!(
            "{prefix}{recorded} reserved {} ({:.3} of live), streamalloc {} ({verdict})",
            Bytes(theirs),
            theirs as f64 / report.peak_live_bytes.max(1) as f64,
            Bytes(report.peak_reserved_bytes),
        );
    }
    println!(
        "{prefix}after the load fell: live {}, reserved {}, reserved / live {:.3} (no explicit cleanup)",
        Bytes(report.settled_live_bytes),
        Bytes(report.settled_reserved_bytes),
        report.settled_reserved_over_live,
    );
    if let (Some(budget), Some(fits)) = (report.budget, report.fits) {
        println!(
            "{prefix}budget {}: {}",
            Bytes(budget),
            if fits {
                "the trace fits"
            } else {
                "the trace does NOT fit"
            }
        );
    }
    if let Some(first) = &report.first_failure {
        println!("{prefix}first failure: {first}");
    }
    print_driver(prefix, &report.driver);
    let (total, in_trace) = (&report.driver, &report.driver_in_trace);
    println!(
        "{prefix}  of which up to the trace's last event: {:.1} us per event ({:.1} beyond mapping the peak once), granules mapped {:.2}x the peak; after the load fell: {:.3} s",
        in_trace.modeled_us_per_event,
        in_trace.beyond_peak_us_per_event,
        in_trace.mapped_over_peak,
        total.modeled_ns.saturating_sub(in_trace.modeled_ns) as f64 / 1e9,
    );
    for stream in &report.per_stream {
        println!(
            "{prefix}stream {} (trace stream {}): {} {}, {} {}, {} {}; peak live {}, peak reserved {}",
            stream.stream,
            stream.trace_stream,
            stream.events,
            plural(stream.events, "event"),
            stream.allocations,
            plural(stream.allocations, "allocation"),
            stream.failures,
            plural(stream.failures, "failure"),
            Bytes(stream.peak_live_bytes),
            Bytes(stream.peak_reserved_bytes),
        );
        if stream.lent + stream.borrowed > 0 {
            println!(
                "{prefix}  lent {} {} to other streams, borrowed {} from them",
                stream.lent,
                plural(stream.lent, "allocation"),
                stream.borrowed,
            );
        }
        print_driver(&format!("{prefix}  "), &stream.driver);
    }
}

pub(crate) fn convert(args: ConvertArgs) -> Result<(), String> {
    let size = std::fs::metadata(&args.input)
        .map_err(|e| format!("{}: {e}", args.input.display()))?
        .len();
    // Refused before the input is even read: writing never touches it.
    let mut out = Output::open(&args.output, &args.input)?;
    let mut progress = Progress::bytes(
        size,
        &format!("convert {}", args.input.display()),
        args.quiet,
    );
    let mut reader = open(&args.input, args.format, &progress)?;
    let meta = reader.meta().clone();
    let write_error = |e: &dyn std::fmt::Display| format!("{}: {e}", args.output.display());
    write_trace_jsonl(&meta, &[], &mut out).map_err(|e| write_error(&e))?;
    let mut events = 0u64;
    let mut batch = Vec::with_capacity(PROGRESS_EVERY as usize);
    while let Some(event) = reader.next() {
        batch.push(event.map_err(|e| format!("{}: {e}", args.input.display()))?);
        if batch.len() == batch.capacity() {
            events += batch.len() as u64;
            streamalloc::trace::write_jsonl(&batch, &mut out).map_err(|e| write_error(&e))?;
            batch.clear();
            progress.set(reader.bytes_read());
        }
    }
    events += batch.len() as u64;
    streamalloc::trace::write_jsonl(&batch, &mut out).map_err(|e| write_error(&e))?;
    progress.finish();
    if events == 0 {
        // Dropped uncommitted: nothing is left where the output was to be.
        return Err(format!(
            "{}: the trace holds no events",
            args.input.display()
        ));
    }
    out.commit()?;
    if !args.quiet {
        eprintln!(
            "wrote {events} {} to {}",
            plural(events, "event"),
            args.output.display()
        );
    }
    Ok(())
}
