#!/usr/bin/env bash
# The placement table: every family of a placement corpus, generated with
# one seed, replayed through streamalloc (service and manager alone) and
# CubeCL 0.11.3 side by side, in one run.
#
# usage: scripts/placement_table.sh [SEED] [EVENTS] [CORPUS]   (from the repo root)
#   CORPUS: `placement` (scripts/placement_corpus.py, the default) or
#   `heldout` (scripts/heldout_corpus.py: the same families in other shapes,
#   written after the placement it checks).
set -euo pipefail
seed=${1:-1}
events=${2:-100000}
corpus=${3:-placement}
case "$corpus" in
placement | heldout) ;;
*)
    echo "unknown corpus '$corpus' (placement or heldout)" >&2
    exit 2
    ;;
esac
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 "scripts/${corpus}_corpus.py" "$dir" --seed "$seed" --events "$events" >/dev/null
cd benches/vs-cubecl
cargo build --release --quiet --bin memory
"${CARGO_TARGET_DIR:-target}/release/memory" "$dir"/*.csv
