//! `streamalloc simulate`: a synthetic inference server on the service.

use crate::cli::{
    Model, Settings, SimulateArgs, StorageKind, check_html, driver_costs, factory, plot, plural,
    print_driver, progress_bar, service_config, write_page,
};
use std::time::Duration;
use streamalloc::memory::{Bytes, DeviceProperties};
use streamalloc::plot::{Timeline, check_output};
use streamalloc::service::Supervisor;
use streamalloc::trace::TraceRecorder;

/// Run the server `args` describe and report it (and plot, page and
/// record it where asked).
pub(crate) fn simulate(args: SimulateArgs) -> Result<(), String> {
    if let Some(path) = &args.common.plot {
        check_output(path)?;
    }
    if let Some(path) = &args.common.html {
        check_html(path)?;
    }
    let model = match args.model {
        Model::Small => streamalloc::simulate::ModelShape::SMALL,
        Model::Llama7b => streamalloc::simulate::ModelShape::LLAMA_7B,
    }
    .scaled(args.scale);
    let kind = args.common.storage.unwrap_or(StorageKind::Host);
    let mut config = service_config(&args.common, DeviceProperties::new(4 << 30, 256));
    let recorder = match &args.record {
        Some(path) => {
            Some(TraceRecorder::to_file(path).map_err(|e| format!("{}: {e}", path.display()))?)
        }
        None => None,
    };
    config.recorder = recorder.clone();
    let settings = Settings::of(&args.common, kind, &config);
    let supervisor = Supervisor::new(config, factory(kind, &args.common)?);
    let options = streamalloc::simulate::SimulateOptions {
        model,
        streams: args.streams,
        clients: args.clients,
        requests: args.requests,
        max_prompt: args.max_prompt,
        max_new_tokens: args.max_new_tokens,
        seed: args.seed,
        sample_every: Some(Duration::from_millis(20)),
        costs: driver_costs(&args.common)?,
    };
    let bar = progress_bar(
        u64::from(args.requests),
        "requests",
        args.common.json || args.common.quiet,
    );
    let mut timeline = Timeline::default();
    let report = streamalloc::simulate::simulate(
        &supervisor,
        &options,
        || bar.inc(1),
        (args.common.plot.is_some() || args.common.html.is_some()).then_some(&mut timeline),
    )
    .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    if let (Some(recorder), Some(path)) = (&recorder, &args.record) {
        supervisor.shutdown();
        recorder
            .flush()
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    plot(
        &args.common.plot,
        &timeline,
        &format!(
            "simulate: {} model, {} {}",
            model.name,
            args.streams,
            plural(args.streams, "stream")
        ),
        args.record.as_deref(),
        args.common.quiet || args.common.json,
    )?;
    if let Some(path) = &args.common.html {
        let page = streamalloc::html::Page {
            title: format!(
                "streamalloc simulate: {} model, {} {}",
                model.name,
                args.streams,
                plural(args.streams, "stream")
            ),
            facts: streamalloc::html::simulation_facts(&report),
            timeline: &timeline,
            samples: None,
            stacks: &[],
            tables: streamalloc::html::simulation_tables(&report),
            notes: vec![
                format!(
                    "{} requests from {} clients on the wall clock ({:.2} s); which allocations were live at a moment comes from a trace: record one (--record run.jsonl) and replay it with --html.",
                    report.requests, args.clients, report.seconds
                ),
                format!("Settings: {settings}."),
            ],
        };
        write_page(
            path,
            &page,
            args.record.as_deref(),
            args.common.quiet || args.common.json,
        )?;
    }
    if args.common.json {
        /// The report, with the settings it went by.
        #[derive(serde::Serialize)]
        struct SimulateJson<'a> {
            #[serde(flatten)]
            report: &'a streamalloc::simulate::SimulationReport,
            settings: &'a Settings,
        }
        let json = SimulateJson {
            report: &report,
            settings: &settings,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "simulated {} requests on a {} model (hidden {}, intermediate {}, {} layers) in {:.2} s; weights {}",
        report.requests,
        model.name,
        model.hidden,
        model.intermediate,
        model.layers,
        report.seconds,
        Bytes(report.weight_bytes)
    );
    println!(
        "device: peak live {}, peak reserved {} ({:.3}x); failed requests {}; cross-stream recoveries {}",
        Bytes(report.peak_live_bytes),
        Bytes(report.peak_reserved_bytes),
        report.peak_reserved_bytes as f64 / report.peak_live_bytes.max(1) as f64,
        report.failed_requests,
        report.recoveries
    );
    println!(
        "after the load fell: live {} (the weights), reserved {} ({:.3}x, no explicit cleanup)",
        Bytes(report.settled_live_bytes),
        Bytes(report.settled_reserved_bytes),
        report.settled_reserved_bytes as f64 / report.settled_live_bytes.max(1) as f64,
    );
    for stream in &report.streams {
        println!(
            "stream {}: peak live {}, peak reserved {} ({:.3}x), {} reservations ({:.0}/s), reserve_many p50 {:.1} us p99 {:.1} us, {} idle cleanups, {} relocated",
            stream.stream,
            Bytes(stream.peak_live_bytes),
            Bytes(stream.peak_reserved_bytes),
            stream.reserved_over_live,
            stream.reservations,
            stream.reservations_per_second,
            stream.round_trip_p50_us,
            stream.round_trip_p99_us,
            stream.idle_cleanups,
            stream.relocated
        );
        print_driver("    ", &stream.driver);
        for pool in &stream.pools {
            println!("    {pool}");
        }
    }
    print_driver("device: ", &report.driver);
    Ok(())
}
