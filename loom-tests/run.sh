#!/usr/bin/env bash
# Run the loom models of the real service code. Each model is its own test
# binary; they compile the crate under the crate-specific cfg so no
# dependency sees a global `--cfg loom`.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:-} --cfg streamalloc_loom -C debug-assertions"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/loom}"
models=(loom_park loom_in_place loom_hot loom_release loom_resolve loom_shutdown loom_budget loom_two_short loom_headroom loom_lifecycle loom_retire loom_answers loom_tick loom_lend)
for model in "${models[@]}"; do
    echo "-- $model"
    cargo test --release --test "$model" -- --nocapture
done
