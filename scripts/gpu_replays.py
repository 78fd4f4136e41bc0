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


def replay(binary, path, storage, handle_granules=None):
    extra = [] if handle_granules is None else ["--handle-granules", str(handle_granules)]
    out = subprocess.run(
        [binary, "replay", path, "--json", "--quiet", "--storage", storage] + extra,
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout)


def main():
    binary, snapshots = sys.argv[1], sys.argv[2:]
    print("| snapshot | handle granules | events | cuda us/event (wall) | virtual us/event (wall) | modeled driver us/event | modeled + virtual / cuda | driver counts equal | granules mapped / peak | stream waits |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for snapshot in snapshots:
            path = snapshot
            if snapshot.endswith(".gz"):
                path = os.path.join(tmp, os.path.basename(snapshot)[:-3])
                with gzip.open(snapshot, "rb") as src, open(path, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            for handle_granules in (None, 1):
                row(binary, path, handle_granules)
    return 0


def row(binary, path, handle_granules):
    """One snapshot on the GPU and on virtual storage, with physical
    handles of the default size (None) or of one granule each."""
    cuda = replay(binary, path, "cuda", handle_granules)
    virt = replay(binary, path, "virtual", handle_granules)
    same = cuda["driver"]["ops"] == virt["driver"]["ops"]
    if not same:
        diff = {k: (cuda["driver"]["ops"][k], v) for k, v in virt["driver"]["ops"].items() if cuda["driver"]["ops"][k] != v}
        print(f"  {os.path.basename(path)}: counts differ (cuda, virtual): {diff}", file=sys.stderr)
    modeled = virt["driver"]["modeled_us_per_event"]
    cuda_us = cuda["ns_per_op"] / 1000
    virt_us = virt["ns_per_op"] / 1000
    size = "default" if handle_granules is None else handle_granules
    print(f"| {os.path.basename(path)} | {size} | {virt['events']} | {cuda_us:.1f} | {virt_us:.2f} | {modeled:.1f} | {(modeled + virt_us) / cuda_us:.2f} | {same} | {virt['driver']['mapped_over_peak']:.2f} | {virt['driver']['stream_waits']} |")


if __name__ == "__main__":
    sys.exit(main())
