#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU but no cargo.
#
# Here (with cargo):   scripts/gpu-check.sh build    -> binaries in .gpu/
# There (no cargo):    scripts/gpu-check.sh run      -> CUDA tests, then the table
# Optional there:      python3 scripts/torch_snapshots.py OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
case "${1:-run}" in
build)
    mkdir -p .gpu
    cargo build --release --features cuda --example gpu_check --bin streamalloc
    cp "$target/release/examples/gpu_check" "$target/release/streamalloc" .gpu/
    cargo build --release -p streamalloc-torch --features cuda
    cp "$target/release/libstreamalloc_torch.so" .gpu/
    # The real snapshots, when the shared folder is beside the checkout,
    # and two of the two-stream one's threads interleaved in short bursts
    # (scripts/reinterleave.py: memory moves between its streams at each
    # turn, the costliest case for the driver).
    if [ -d ../shared/torch-h200 ]; then
        cp ../shared/torch-h200/*.pickle.gz .gpu/
        two=../shared/torch-h200/serve_two_streams-default.pickle.gz
        if [ -f "$two" ]; then
            "$target/release/streamalloc" convert "$two" .gpu/two.jsonl --quiet
            for seed in 1 2; do
                python3 scripts/reinterleave.py .gpu/two.jsonl \
                    ".gpu/serve_two_streams-bursts$seed.jsonl" bursts "$seed"
            done
            rm .gpu/two.jsonl
        fi
    fi
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
    echo "== what the cost table estimates, measured"
    timeout 60 python3 scripts/driver_probe.py || true
    echo "== real PyTorch programs on streamalloc beside PyTorch's allocator"
    STREAMALLOC_TORCH_LIBRARY=.gpu/libstreamalloc_torch.so timeout 400 python3 scripts/torch-check.py || true
    echo "== real snapshots on the GPU beside the model"
    if ls .gpu/*.pickle.gz >/dev/null 2>&1; then
        timeout 360 python3 scripts/gpu_replays.py .gpu/streamalloc .gpu/*.pickle.gz \
            $(ls .gpu/*.jsonl 2>/dev/null)
    fi
    ;;
*)
    echo "usage: $0 [build|run]" >&2
    exit 2
    ;;
esac
