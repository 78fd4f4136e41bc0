//! Host time per event of a manager alone replaying traces: our
//! `MemoryManager` (the default expandable layout, `VirtualStorage`) beside
//! CubeCL 0.11.3's `MemoryManagement` (its default, adaptive pages, on a
//! counting storage), each trace stream its own manager, every trace turned
//! into the same dense steps first (`streamalloc_vs_cubecl::replays`).
//!
//! The traces: every `.csv` (or other trace file) in the directories
//! `REPLAY_CORPUS` names (`:`-separated); without it, the placement corpus
//! of seed 1 and the held-out corpus of seed 101 at 100,000 events each,
//! generated once under the bench's target directory with
//! `scripts/placement_corpus.py` and `scripts/heldout_corpus.py`.
//!
//! `cd benches/vs-cubecl && cargo bench --bench replays`, then
//! `python3 replay_table.py` for the table of ns per event and ratios.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use cubecl_server::memory_management::MemoryConfiguration as CubeConfig;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use streamalloc::memory::MemoryConfiguration;
use streamalloc::trace::read_trace;
use streamalloc_vs_cubecl::replays::{Steps, cubecl_alone, ours_alone};

/// The corpus the host-time target names: both generators, 100,000
/// events a trace.
const GENERATED: [(&str, u64); 2] = [("placement", 1), ("heldout", 101)];
const EVENTS: u64 = 100_000;

fn corpus() -> Vec<PathBuf> {
    let dirs: Vec<PathBuf> = match std::env::var_os("REPLAY_CORPUS") {
        Some(dirs) => std::env::split_paths(&dirs).collect(),
        None => GENERATED
            .iter()
            .map(|&(kind, seed)| generated(kind, seed))
            .collect(),
    };
    let mut traces: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|dir| {
            std::fs::read_dir(dir)
                .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
                .map(|entry| entry.expect("a directory entry").path())
        })
        // Not the generator's `.done` marker, nor any other hidden file.
        .filter(|path| path.is_file() && !is_hidden(path))
        .collect();
    traces.sort();
    traces
}

fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with('.'))
}

/// The `kind` corpus of `seed`, generated once.
fn generated(kind: &str, seed: u64) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{kind}-{seed}-{EVENTS}"));
    if dir.join(".done").exists() {
        return dir;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(format!("{kind}_corpus.py"));
    let status = Command::new("python3")
        .arg(&script)
        .arg(&dir)
        .args(["--seed", &seed.to_string(), "--events", &EVENTS.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|err| panic!("python3 {}: {err}", script.display()));
    assert!(status.success(), "{} failed", script.display());
    std::fs::write(dir.join(".done"), "").expect("the corpus is marked done");
    dir
}

fn replays(c: &mut Criterion) {
    let mut group = c.benchmark_group("replay");
    for path in corpus() {
        let events =
            read_trace(&path, None).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
        let steps = Steps::of(&events);
        let name = path
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        group.throughput(Throughput::Elements(steps.events as u64));
        group.bench_function(BenchmarkId::new("streamalloc", &name), |b| {
            b.iter(|| black_box(ours_alone(&steps, &MemoryConfiguration::Expandable)))
        });
        group.bench_function(BenchmarkId::new("cubecl", &name), |b| {
            b.iter(|| black_box(cubecl_alone(&steps, &CubeConfig::Adaptive)))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(3));
    targets = replays
}
criterion_main!(benches);
