#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU but no cargo.
#
# Here (with cargo):   scripts/gpu-check.sh build    -> binaries in .gpu/
# There (no cargo):    scripts/gpu-check.sh run      -> CUDA tests, then the table
# Optional there:      python3 scripts/torch_snapshots.py OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-run}" in
build)
    mkdir -p .gpu
    cargo build --release --features cuda --example gpu_check
    cp target/release/examples/gpu_check .gpu/
    bin=$(cargo test --release --features cuda --test cuda --no-run --message-format=json 2>/dev/null \
        | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | grep '/cuda-' | head -1)
    cp "$bin" .gpu/cuda_tests
    ls -la .gpu
    ;;
run)
    echo "== CUDA tests"
    timeout 240 .gpu/cuda_tests --test-threads 1
    echo "== pool vs driver, relocation vs plain copy"
    timeout 120 .gpu/gpu_check
    ;;
*)
    echo "usage: $0 [build|run]" >&2
    exit 2
    ;;
esac
