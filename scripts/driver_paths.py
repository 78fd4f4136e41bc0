#!/usr/bin/env python3
"""The driver's modeled time by the path that asked for it, as a Markdown
table: one row per trace, microseconds per event (`docs/trace.md`, "The
driver, by path"). Each trace is replayed with `streamalloc replay --json`;
the same traces give the same table on every run.

With --granules the table holds the granules each path mapped instead,
over the most mapped at once (a row's cells add up to its "mapped / peak").

usage: python3 scripts/driver_paths.py [--bin PATH] [--in-trace] [--granules] TRACE...
       (--bin: the streamalloc binary, target/release/streamalloc by
       default; --in-trace: up to the trace's last event only, the give-back
       after the load fell left out; any other `replay` option after `--`)
"""

import json
import os
import subprocess
import sys

PATHS = ["growth", "trim", "compaction", "round", "lend", "short", "settle", "idle", "cleanup", "serve"]


def replay(binary, trace, extra):
    out = subprocess.run(
        [binary, "replay", trace, "--json", "--quiet", *extra],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(f"{trace}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main(argv):
    binary = os.path.join(os.path.dirname(__file__), "..", "target", "release", "streamalloc")
    field, traces, extra, granules = "driver", [], [], False
    args = iter(argv)
    for arg in args:
        if arg == "--bin":
            binary = next(args, None) or sys.exit("--bin needs a path")
        elif arg == "--in-trace":
            field = "driver_in_trace"
        elif arg == "--granules":
            granules = True
        elif arg == "--":
            extra = list(args)
        else:
            traces.append(arg)
    if not traces:
        sys.exit(__doc__)
    rows = []
    for trace in traces:
        report = replay(binary, trace, extra)
        driver = report[field]
        if granules:
            peak = max(driver["peak_granules_mapped"], 1)
            by_path = {
                cost["path"]: cost["granules_mapped"] / peak
                for cost in driver.get("by_path", [])
                if cost["granules_mapped"] > 0
            }
        else:
            by_path = {cost["path"]: cost["us_per_event"] for cost in driver.get("by_path", [])}
        name = os.path.basename(trace).split(".")[0]
        rows.append((name, report["events"], driver, by_path))
    # Paths that asked nothing on any row stay out of the table.
    shown = [path for path in PATHS if any(path in row[3] for row in rows)]
    if granules:
        print("| trace | events | peak granules | mapped / peak | " + " | ".join(shown) + " |")
    else:
        print("| trace | events | us/event | beyond the peak once | " + " | ".join(shown) + " |")
    print("| --- | --- | --- | --- | " + " | ".join("---" for _ in shown) + " |")
    for name, events, driver, by_path in rows:
        cells = [f"{by_path[path]:.2f}" if path in by_path else "-" for path in shown]
        if granules:
            lead = f"{driver['peak_granules_mapped']:,} | {driver['mapped_over_peak']:.2f}"
        else:
            lead = f"{driver['modeled_us_per_event']:.2f} | {driver['beyond_peak_us_per_event']:.2f}"
        print(f"| `{name}` | {events:,} | {lead} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
