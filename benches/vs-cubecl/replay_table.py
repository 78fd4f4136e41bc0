#!/usr/bin/env python3
"""The table of `cargo bench --bench replays`: host time per event of our
manager alone and CubeCL's, and their ratio, from criterion's estimates
(medians). usage: python3 replay_table.py [CRITERION_DIR]
(default: $CARGO_TARGET_DIR/criterion, else target/criterion)."""
import json
import os
import statistics
import sys
from pathlib import Path

root = Path(sys.argv[1]) if len(sys.argv) > 1 else (
    Path(os.environ.get("CARGO_TARGET_DIR", "target")) / "criterion")
group = root / "replay"


def per_event(contender, trace):
    run = group / contender / trace / "new"
    median = json.loads((run / "estimates.json").read_text())["median"]["point_estimate"]
    events = json.loads((run / "benchmark.json").read_text())["throughput"]["Elements"]
    return median / events


traces = sorted(p.name for p in (group / "streamalloc").iterdir() if (p / "new").is_dir())
print("| trace | streamalloc ns/event | CubeCL ns/event | ratio |")
print("| --- | --- | --- | --- |")
ratios = []
for trace in traces:
    ours, theirs = per_event("streamalloc", trace), per_event("cubecl", trace)
    ratios.append(ours / theirs)
    print(f"| {trace} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f} |")
if ratios:
    print(f"\nratio: median {statistics.median(ratios):.2f}, "
          f"geometric mean {statistics.geometric_mean(ratios):.2f}, max {max(ratios):.2f}")
