//! The command line's bad-input table: each row a file and the arguments a
//! user gave, with the exit code and the words they should see. A new
//! defect is one new row.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream\n";

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("streamalloc-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn file(&self, name: &str, content: &[u8]) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, content).unwrap();
        path.to_str().unwrap().to_string()
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_streamalloc"))
        .args(args)
        .output()
        .unwrap()
}

/// A small RMM log: `rounds` rounds of three 4 MiB allocations and their frees.
fn rmm_log(rounds: u32) -> String {
    let mut log = String::from(HEADER);
    for round in 0..rounds {
        for i in 0..3u32 {
            let ptr = 0x1000 + u64::from(round * 3 + i) * 0x100000;
            log.push_str(&format!(
                "1,{},allocate,{ptr:#x},4194304,0x0\n",
                round * 10 + i
            ));
        }
        for i in 0..3u32 {
            let ptr = 0x1000 + u64::from(round * 3 + i) * 0x100000;
            log.push_str(&format!(
                "1,{},free,{ptr:#x},4194304,0x0\n",
                round * 10 + 5 + i
            ));
        }
    }
    log
}

struct Row {
    name: &'static str,
    args: Vec<String>,
    /// Expected exit code.
    code: i32,
    /// Words stderr must hold.
    stderr: &'static str,
    /// Words stdout must hold.
    stdout: &'static str,
}

fn row(
    name: &'static str,
    args: &[&str],
    code: i32,
    stderr: &'static str,
    stdout: &'static str,
) -> Row {
    Row {
        name,
        args: args.iter().map(|s| s.to_string()).collect(),
        code,
        stderr,
        stdout,
    }
}

/// Run each row; what went other than the row says, one line each (a
/// stderr longer than `longest` bytes counts as wrong: errors quote
/// excerpts, not their input).
fn run_rows(rows: &[Row], longest: usize) -> Vec<String> {
    let mut failures = Vec::new();
    for row in rows {
        let out = cli(&row.args.iter().map(String::as_str).collect::<Vec<_>>());
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        if out.status.code() != Some(row.code)
            || !stderr.contains(row.stderr)
            || !stdout.contains(row.stdout)
            || stderr.len() > longest
        {
            failures.push(format!(
                "{}: exit {:?} (want {}), stderr {} (want {:?}), stdout {} (want {:?})",
                row.name,
                out.status.code(),
                row.code,
                stderr.chars().take(600).collect::<String>(),
                row.stderr,
                stdout.chars().take(600).collect::<String>(),
                row.stdout
            ));
        }
    }
    failures
}

#[test]
fn every_bad_input_is_a_clear_error_with_a_non_zero_exit() {
    let dir = Scratch::new("bad-input");
    let empty = dir.file("empty.csv", b"");
    let blank = dir.file("blank.jsonl", b"\n\n  \n");
    let header_only = dir.file("header.csv", HEADER.as_bytes());
    let wrong_header = dir.file("wrong.csv", b"A,B,C,D,E,F\n1,2,3,4,5,6\n");
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend(rmm_log(2).as_bytes());
    let bom = dir.file("bom.csv", &bom);
    let good = dir.file("good.csv", rmm_log(4).as_bytes());
    let missing = dir.path("missing.csv");
    let converted = dir.path("out.jsonl");
    let rows = vec![
        row("empty file", &["replay", &empty], 1, "empty", ""),
        row("blank lines only", &["replay", &blank], 1, "no events", ""),
        row(
            "a header and no events",
            &["replay", &header_only],
            1,
            "no events",
            "",
        ),
        row(
            "wrong header",
            &["replay", &wrong_header],
            1,
            "not an RMM log header",
            "",
        ),
        row(
            "UTF-8 BOM before the header",
            &["replay", &bom],
            0,
            "",
            "replayed 12 events",
        ),
        row(
            "plot into a missing directory fails before the replay",
            &["replay", &good, "--plot", "/nonexistent/dir/x.svg"],
            1,
            "/nonexistent/dir",
            "",
        ),
        row(
            "a trace that does not fit: exit 3, the report, and why",
            &["replay", &good, "--budget", "6M"],
            3,
            "does not fit the budget",
            ": out of memory",
        ),
        row(
            "a missing file",
            &["replay", &missing],
            1,
            "missing.csv",
            "",
        ),
        row(
            "an unknown format lists the known ones",
            &["replay", &good, "--format", "xml"],
            2,
            "jsonl, rmm, torch",
            "",
        ),
        row(
            "simulate with no streams",
            &["simulate", "--streams", "0"],
            2,
            "--streams",
            "",
        ),
        row(
            "simulate with no clients",
            &["simulate", "--clients", "0"],
            2,
            "--clients",
            "",
        ),
        row(
            "simulate with no requests",
            &["simulate", "--requests", "0"],
            2,
            "--requests",
            "",
        ),
        row(
            "convert an empty trace",
            &["convert", &empty, &converted],
            1,
            "empty",
            "",
        ),
    ];
    let failures = run_rows(&rows, usize::MAX);
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    assert!(
        !Path::new(&converted).exists(),
        "an empty conversion leaves no file"
    );
}

#[test]
fn errors_name_the_path_once() {
    let dir = Scratch::new("path-once");
    let bad = dir.file(
        "bad.csv",
        format!("{HEADER}1,0,allocate,0x1,lots,0x0\n").as_bytes(),
    );
    let out = cli(&["replay", &bad]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("bad.csv").count(), 1, "{stderr}");
    assert!(stderr.contains("line 2: bad size"), "{stderr}");
}

#[test]
fn quiet_runs_print_only_the_report() {
    let dir = Scratch::new("quiet");
    let good = dir.file("good.csv", rmm_log(3).as_bytes());
    let out = cli(&["replay", &good, "--quiet"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert!(String::from_utf8_lossy(&out.stdout).contains("peak live"));
    // Not on a terminal, progress is a plain line on stderr at most once a
    // second: a replay done in less prints none (it printed "about 0 s
    // left" at every tenth: issue 41, item 12).
    let out = cli(&["replay", &good]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("% ("), "{stderr}");
}

#[test]
fn simulate_json_has_structured_pools_holding_the_weights() {
    let out = cli(&[
        "simulate",
        "--requests",
        "4",
        "--max-prompt",
        "32",
        "--max-new-tokens",
        "2",
        "--json",
        "--quiet",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pools = report["streams"][0]["pools"].as_array().unwrap();
    let persistent = pools
        .iter()
        .find(|p| p["kind"] == "persistent")
        .expect("a persistent pool");
    assert!(
        persistent["allocations"].as_u64().unwrap() > 0,
        "{persistent}"
    );
    assert_eq!(
        report["settled_live_bytes"], report["weight_bytes"],
        "live once the load fell: the weights"
    );
}

/// A snapshot pickle: `segments` and one device's trace entries, each a
/// list of (key, value) pairs (sizes may be negative, blocks may not fit).
fn snapshot(
    segments: Vec<Vec<(&str, serde_pickle::Value)>>,
    trace: Vec<Vec<(&str, serde_pickle::Value)>>,
) -> Vec<u8> {
    use serde_pickle::{HashableValue as K, Value as V};
    let dict = |pairs: Vec<(&str, V)>| {
        V::Dict(
            pairs
                .into_iter()
                .map(|(k, v)| (K::String(k.into()), v))
                .collect(),
        )
    };
    let mut root = std::collections::BTreeMap::new();
    root.insert(
        K::String("segments".into()),
        V::List(segments.into_iter().map(dict).collect()),
    );
    root.insert(
        K::String("device_traces".into()),
        V::List(vec![V::List(trace.into_iter().map(dict).collect())]),
    );
    serde_pickle::value_to_vec(&V::Dict(root), serde_pickle::SerOptions::new()).unwrap()
}

/// Issue 45: hostile inputs answer a short, precise error, quickly.
#[test]
fn hostile_inputs_get_short_precise_errors() {
    use serde_pickle::Value as V;
    let dir = Scratch::new("hostile");
    let long_number = "9".repeat(100_000);
    let huge_size = dir.file(
        "huge.csv",
        format!("{HEADER}1,0,allocate,0x10,{long_number},0x0\n").as_bytes(),
    );
    let huge_jsonl = dir.file(
        "huge.jsonl",
        format!("{{\"time_ns\":1,\"stream\":0,\"action\":\"alloc\",\"id\":1,\"size\":\"{long_number}\"}}\n").as_bytes(),
    );
    let bad_time = dir.file(
        "time.csv",
        format!("{HEADER}1,99:99:99.999999,allocate,0x10,100,0x0\n").as_bytes(),
    );
    let small = dir.file(
        "small.csv",
        format!("{HEADER}1,0,allocate,0x10,100,0x0\n").as_bytes(),
    );
    let mut devices = String::new();
    for device in 0..3_000 {
        devices.push_str(&format!(
            "{{\"time_ns\":{device},\"device\":{device},\"stream\":0,\"action\":\"alloc\",\"id\":1,\"size\":1024}}\n"
        ));
    }
    let devices = dir.file("devices.jsonl", devices.as_bytes());
    let block = |size: i64| {
        V::List(vec![V::Dict(
            [
                ("address", V::I64(0x1000)),
                ("size", V::I64(size)),
                ("state", V::String("active_allocated".into())),
            ]
            .into_iter()
            .map(|(k, v)| (serde_pickle::HashableValue::String(k.into()), v))
            .collect(),
        )])
    };
    let segment = |device: i64, blocks: V| {
        vec![
            ("device", V::I64(device)),
            ("total_size", V::I64(100)),
            ("stream", V::I64(0)),
            ("blocks", blocks),
        ]
    };
    let alloc = |size: i64| {
        vec![
            ("action", V::String("alloc".into())),
            ("addr", V::I64(0x1000)),
            ("size", V::I64(size)),
            ("stream", V::I64(0)),
            ("time_us", V::I64(1)),
        ]
    };
    let overfull = dir.file(
        "overfull.pickle",
        &snapshot(vec![segment(0, block(1000 << 40))], vec![alloc(10)]),
    );
    let negative = dir.file("negative.pickle", &snapshot(vec![], vec![alloc(-5)]));
    let far_device = dir.file(
        "far.pickle",
        &snapshot(vec![segment(99_999_999, block(50))], vec![alloc(10)]),
    );
    let rows = vec![
        row(
            "a 100,000-digit size quotes an excerpt",
            &["replay", &huge_size],
            1,
            "(100000 bytes)",
            "",
        ),
        row(
            "a 100,000-digit JSON value quotes an excerpt, and one line number",
            &["replay", &huge_jsonl],
            1,
            "line 1: column",
            "",
        ),
        row(
            "an RMM time past the clock's",
            &["replay", &bad_time],
            1,
            "bad time \"99:99:99.999999\"",
            "",
        ),
        row(
            "a budget past 2^64 - 1 bytes",
            &["replay", &small, "--budget", "18446744073709551616"],
            2,
            "more than 2^64 - 1 bytes",
            "",
        ),
        row(
            "a negative budget",
            &["replay", &small, "--budget", "-5M"],
            2,
            "cannot be negative",
            "",
        ),
        row(
            "a unit that is not one",
            &["replay", &small, "--budget", "300Q"],
            2,
            "powers of 1024",
            "",
        ),
        row(
            "a small allocation refused says the granule is what did not fit",
            &["replay", &small, "--budget", "1M"],
            3,
            "does not fit",
            "needs 2.00 MiB of new device memory",
        ),
        row(
            "a device per line",
            &["replay", &devices],
            1,
            "more than 64 devices",
            "",
        ),
        row(
            "blocks larger than their segment",
            &["replay", &overfull],
            1,
            "in a segment of 100",
            "",
        ),
        row(
            "a negative size in a snapshot",
            &["replay", &negative],
            1,
            "a negative size (-5)",
            "",
        ),
        row(
            "a segment on device 99,999,999 is one device",
            &["replay", &far_device],
            0,
            "",
            "device 99999999",
        ),
    ];
    let failures = run_rows(&rows, 2_000);
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Issue 41, item 1: `convert` once deleted its input when told to write
/// over it (`convert t.csv t.csv`), or emptied it (`./t.jsonl`). By any
/// name, the input is refused as the output and stays byte-identical.
#[test]
fn convert_never_writes_over_its_input_by_any_name() {
    let dir = Scratch::new("convert-input");
    let log = rmm_log(50);
    let input = dir.file("t.csv", log.as_bytes());
    let jsonl = dir.path("t.jsonl");
    assert!(
        cli(&["convert", &input, &jsonl, "--quiet"])
            .status
            .success()
    );
    let jsonl_bytes = std::fs::read(&jsonl).unwrap();
    let hard = dir.path("hard.csv");
    std::fs::hard_link(&input, &hard).unwrap();
    let mut names = vec![
        ("the same path", input.clone(), input.clone()),
        (
            "./ before it",
            input.clone(),
            format!("{}/./t.csv", dir.0.display()),
        ),
        ("a hard link", input.clone(), hard.clone()),
        (
            "JSON Lines, ./",
            jsonl.clone(),
            format!("{}/./t.jsonl", dir.0.display()),
        ),
    ];
    #[cfg(unix)]
    {
        let link = dir.path("link.csv");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        names.push(("a symlink", input.clone(), link.clone()));
        names.push(("read through a symlink", link, input.clone()));
    }
    for (how, from, to) in names {
        let out = cli(&["convert", &from, &to]);
        assert_eq!(out.status.code(), Some(1), "{how}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("refusing to write over the input"),
            "{how}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(std::fs::read(&input).unwrap(), log.as_bytes(), "{how}");
        assert_eq!(std::fs::read(&jsonl).unwrap(), jsonl_bytes, "{how}");
    }
    // Nothing left behind but the files made here.
    let mut left: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert!(left.iter().all(|name| !name.ends_with(".tmp")), "{left:?}");
}

/// Issue 41, items 2-12: each a row, failing before its fix.
#[test]
fn replay_and_convert_say_what_they_did() {
    let dir = Scratch::new("trust");
    let good = dir.file("good.csv", rmm_log(4).as_bytes());
    let huge = dir.file(
        "huge.csv",
        format!("{HEADER}1,0,allocate,0x10,18446744073709551615,0x0\n").as_bytes(),
    );
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/torch");
    let two = format!("{fixtures}/two_devices.pickle");
    let mid = format!("{fixtures}/mid_run.pickle");
    // A gzip-compressed copy of a fixture reads as the fixture.
    let gz = {
        use std::io::Write;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(&std::fs::read(&mid).unwrap()).unwrap();
        dir.file("mid.pickle.gz", &encoder.finish().unwrap())
    };
    let png = dir.path("out.png");
    let rows = vec![
        row(
            "an unbudgeted replay with a failure exits 3",
            &["replay", &huge, "--quiet"],
            3,
            "1 allocation failed",
            "failures 1",
        ),
        row(
            "a budget that does not fit: peak live is the trace's, nothing saved",
            &["replay", &two, "--budget", "100M", "--quiet"],
            3,
            "does not fit",
            "all devices: peak live 181.92 MiB",
        ),
        row(
            "--plot takes only .svg",
            &["replay", &good, "--plot", &png],
            1,
            "name it with .svg",
            "",
        ),
        row(
            "simulate --scale nan",
            &["simulate", "--scale", "nan"],
            2,
            "not a number above 0",
            "",
        ),
        row(
            "simulate --scale 0",
            &["simulate", "--scale", "0"],
            2,
            "not a number above 0",
            "",
        ),
        row(
            "simulate --streams past what a device runs",
            &["simulate", "--streams", "100000"],
            2,
            "1..=256",
            "",
        ),
        row(
            "a budget past 2^64 - 1 bytes, in digits",
            &["replay", &good, "--budget", "99999999999999999999"],
            2,
            "more than 2^64 - 1 bytes",
            "",
        ),
        row(
            "a pickle read as RMM says what it likely is",
            &["replay", &mid, "--format", "rmm"],
            1,
            "not UTF-8 text",
            "",
        ),
        row(
            "one stream, one segment: no plural",
            &["replay", &good, "--quiet"],
            0,
            "",
            "on 1 stream (",
        ),
        row(
            "a gzip-compressed snapshot replays",
            &["replay", &gz, "--quiet"],
            0,
            "",
            "PyTorch reserved",
        ),
        row(
            "convert --quiet prints nothing",
            &["convert", &good, &dir.path("q.jsonl"), "--quiet"],
            0,
            "",
            "",
        ),
    ];
    let failures = run_rows(&rows, usize::MAX);
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    // Nothing saved where an allocation failed; the PNG was not written.
    let out = cli(&["replay", &two, "--budget", "100M", "--quiet"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("all devices: PyTorch reserved"),
        "{stdout}"
    );
    assert!(!std::path::Path::new(&png).exists());
    // convert --quiet: nothing at all on stderr.
    let out = cli(&["convert", &good, &dir.path("q2.jsonl"), "--quiet"]);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // convert to standard output.
    let out = cli(&["convert", &good, "-", "--quiet"]);
    assert!(out.status.success());
    // An RMM log says nothing of itself: no meta line, one line an event.
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 24);
}

/// Issue 41, the done-when: `--min-budget` on a trace of two devices
/// answers a budget `--budget` confirms fits, and a lower end it confirms
/// does not.
#[test]
fn min_budget_of_several_devices_is_confirmed_by_budget() {
    let two = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/torch/two_devices.pickle"
    );
    let out = cli(&["replay", two, "--min-budget", "--json", "--quiet"]);
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let fits = json["min_budget"]["fits"].as_u64().unwrap();
    let does_not_fit = json["min_budget"]["does_not_fit"].as_u64().unwrap();
    assert!(does_not_fit < fits);
    let at = |budget: u64| {
        cli(&["replay", two, "--budget", &budget.to_string(), "--quiet"])
            .status
            .code()
    };
    assert_eq!(at(fits), Some(0), "fits in {fits}");
    assert_eq!(at(does_not_fit), Some(3), "not in {does_not_fit}");
    // The budget is a device's: well under the devices' summed peak live.
    let summed = json["peak_live_bytes"].as_u64().unwrap();
    assert!(fits < summed * 3 / 4, "{fits} of {summed}");
}
