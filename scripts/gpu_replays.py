#!/usr/bin/env python3
"""Replays of real PyTorch snapshots on the GPU beside the model: each
snapshot replayed with `--storage cuda` (real driver calls, timed) and
`--storage virtual` (no memory, the driver priced by the H200 table), and
the two reports' driver counts compared.

usage: python3 scripts/gpu_replays.py STREAMALLOC_BINARY SNAPSHOT...
(a `.gz` snapshot is unpacked to a temporary file first).
"""
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile


# Each snapshot runs as the default cuts its physical handles, with the
# larger handles of `--handle-share 16` (docs/performance.md, "Larger
# handles, as an option"), with a granule a handle (what the driver
# cost before handles grew), and with lending between streams (`--lend`:
# an event and a stream wait a loan where rounds map and unmap; the same
# as the default on a snapshot of one stream).
VARIANTS = (
    ("default", []),
    ("share 16", ["--handle-share", "16"]),
    ("1 granule", ["--handle-granules", "1"]),
    ("lend", ["--lend"]),
)


def replay(binary, path, storage, extra):
    out = subprocess.run(
        [binary, "replay", path, "--json", "--quiet", "--storage", storage] + extra,
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout)


def main():
    binary, snapshots = sys.argv[1], sys.argv[2:]
    print("| snapshot | handles | events | cuda us/event (wall) | virtual us/event (wall) | modeled driver us/event | modeled + virtual / cuda | driver counts equal | granules mapped / peak | stream waits |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for snapshot in snapshots:
            path = snapshot
            if snapshot.endswith(".gz"):
                path = os.path.join(tmp, os.path.basename(snapshot)[:-3])
                with gzip.open(snapshot, "rb") as src, open(path, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            for label, extra in VARIANTS:
                row(binary, path, label, extra)
    return 0


def row(binary, path, label, extra):
    """One snapshot on the GPU and on virtual storage, its physical
    handles cut as `extra` says."""
    cuda = replay(binary, path, "cuda", extra)
    virt = replay(binary, path, "virtual", extra)
    same = cuda["driver"]["ops"] == virt["driver"]["ops"]
    if not same:
        diff = {k: (cuda["driver"]["ops"][k], v) for k, v in virt["driver"]["ops"].items() if cuda["driver"]["ops"][k] != v}
        print(f"  {os.path.basename(path)}: counts differ (cuda, virtual): {diff}", file=sys.stderr)
    modeled = virt["driver"]["modeled_us_per_event"]
    cuda_us = cuda["ns_per_op"] / 1000
    virt_us = virt["ns_per_op"] / 1000
    print(f"| {os.path.basename(path)} | {label} | {virt['events']} | {cuda_us:.1f} | {virt_us:.2f} | {modeled:.1f} | {(modeled + virt_us) / cuda_us:.2f} | {same} | {virt['driver']['mapped_over_peak']:.2f} | {virt['driver']['stream_waits']} |")


if __name__ == "__main__":
    sys.exit(main())
