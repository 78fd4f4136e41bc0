#!/usr/bin/env bash
# The placement table: every family of the placement corpus, generated with
# one seed, replayed through streamalloc (service and manager alone) and
# CubeCL 0.11.3 side by side, in one run.
#
# usage: scripts/placement_table.sh [SEED] [EVENTS]   (from the repo root)
set -euo pipefail
seed=${1:-1}
events=${2:-100000}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 scripts/placement_corpus.py "$dir" --seed "$seed" --events "$events" >/dev/null
cd benches/vs-cubecl
cargo build --release --quiet --bin memory
./target/release/memory "$dir"/*.csv
