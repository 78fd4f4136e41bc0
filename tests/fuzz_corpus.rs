//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the
//! same functions the fuzz targets run, so CI checks every input the fuzzer
//! kept without needing a nightly toolchain.

#[path = "../fuzz/fuzz_targets/common.rs"]
mod common;

fn replay(target: &str, run: fn(&[u8])) -> usize {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        run(&std::fs::read(&path).unwrap());
        count += 1;
    }
    assert!(count > 0, "no corpus for {target}");
    count
}

#[test]
fn the_fuzz_corpus_replays_cleanly() {
    let counts = [
        ("trace_rmm", replay("trace_rmm", common::trace_rmm)),
        ("trace_jsonl", replay("trace_jsonl", common::trace_jsonl)),
        ("trace_torch", replay("trace_torch", common::trace_torch)),
        ("ops", replay("ops", common::ops)),
    ];
    eprintln!("{counts:?}");
}
