#!/usr/bin/env python3
"""Write PyTorch memory snapshots shaped as `torch.cuda.memory._dump_snapshot`
writes them, with Python's own pickle, for the reader's tests.

Each fixture is a snapshot taken mid-run by a small caching allocator that
keeps PyTorch's books: segments taken from the device (`segment_alloc`, or
`segment_map` for expandable segments), blocks handed out from them
(`alloc`, `free_requested`, `free_completed`), and at the end the segments
with their blocks' states. The trace starts after the run began (blocks
allocated before it are freed in it, or still active at its end), frames
are shared objects (Python memoizes them), and one fixture has two devices.

Next to each `NAME.pickle`, `NAME.expected.json` holds what the snapshot
says, computed here from the allocator's own books (not by the reader under
test): per device, the peak and final live bytes counting allocations made
before the recording, and PyTorch's peak reserved bytes during it.

    python3 scripts/make_torch_fixtures.py tests/fixtures/torch
"""

import json
import pickle
import random
import sys
from pathlib import Path

MIB = 1 << 20
SMALL_SEGMENT = 2 * MIB


class Device:
    """One device's caching allocator, keeping PyTorch's books."""

    def __init__(self, index, rng, frames, expandable=False):
        self.index = index
        self.rng = rng
        self.frames = frames
        self.expandable = expandable
        self.segments = {}  # address -> dict(total, blocks: {addr: [size, state]})
        self.next_segment = 0x7F0000000000 + index * 0x10000000000
        self.time = 1_000_000
        self.trace = []
        self.recording = False
        self.live = {}  # block address -> size
        self.reserved = 0
        self.peak_reserved = 0
        self.peak_live = 0
        self.live_at_start = None

    def event(self, action, addr, size):
        self.time += self.rng.randint(1, 50)
        if self.recording:
            self.trace.append(
                {
                    "action": action,
                    "addr": addr,
                    "size": size,
                    "stream": 0,
                    "time_us": self.time,
                    # The same list object for many events: Python's pickler
                    # writes it once and refers to it through the memo.
                    "frames": self.rng.choice(self.frames),
                }
            )

    def take_segment(self, size):
        addr = self.next_segment
        self.next_segment += max(size, SMALL_SEGMENT) * 2
        self.segments[addr] = {"total": size, "blocks": {}}
        self.reserved += size
        self.event("segment_map" if self.expandable else "segment_alloc", addr, size)
        if self.recording:
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        return addr

    def alloc(self, size):
        size = (size + 511) // 512 * 512
        # First fit in a free stretch of a segment, else a new segment.
        for addr, segment in self.segments.items():
            start = self.gap(addr, segment, size)
            if start is not None:
                segment["blocks"][start] = [size, "active_allocated"]
                break
        else:
            total = max(size, SMALL_SEGMENT) if size < 10 * MIB else size
            addr = self.take_segment(total)
            start = addr
            self.segments[addr]["blocks"][start] = [size, "active_allocated"]
        self.live[start] = size
        self.peak_live = max(self.peak_live, sum(self.live.values()))
        self.event("alloc", start, size)
        return start

    @staticmethod
    def gap(addr, segment, size):
        """The first address of a segment with `size` free bytes."""
        at = addr
        for start, (length, _) in sorted(segment["blocks"].items()):
            if start - at >= size:
                return at
            at = start + length
        return at if addr + segment["total"] - at >= size else None

    def free(self, start):
        size = self.live.pop(start)
        self.event("free_requested", start, size)
        self.event("free_completed", start, size)
        for addr, segment in self.segments.items():
            if start in segment["blocks"]:
                del segment["blocks"][start]
                if not segment["blocks"] and self.rng.random() < 0.5:
                    self.reserved -= segment["total"]
                    del self.segments[addr]
                    self.event("segment_unmap" if self.expandable else "segment_free", addr, segment["total"])
                break

    def start_recording(self):
        self.recording = True
        self.live_at_start = sum(self.live.values())
        self.peak_live = self.live_at_start
        self.peak_reserved = self.reserved

    def snapshot_segments(self):
        out = []
        for addr, segment in sorted(self.segments.items()):
            blocks = []
            offset = addr
            for start, (size, state) in sorted(segment["blocks"].items()):
                if start > offset:
                    blocks.append(
                        {"address": offset, "size": start - offset, "requested_size": 0,
                         "state": "inactive", "frames": []}
                    )
                blocks.append(
                    {"address": start, "size": size, "requested_size": size - 7,
                     "state": state, "frames": self.rng.choice(self.frames)}
                )
                offset = start + size
            if offset < addr + segment["total"]:
                blocks.append(
                    {"address": offset, "size": addr + segment["total"] - offset,
                     "requested_size": 0, "state": "inactive", "frames": []}
                )
            out.append(
                {
                    "device": self.index,
                    "address": addr,
                    "total_size": segment["total"],
                    "allocated_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
                    "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
                    "requested_size": sum(b["requested_size"] for b in blocks),
                    "stream": 0,
                    "segment_type": "small" if segment["total"] <= SMALL_SEGMENT else "large",
                    "segment_pool_id": (0, 0),
                    "is_expandable": self.expandable,
                    "frames": [],
                    "blocks": blocks,
                }
            )
        return out


def run(device, steps, record_from):
    """Allocate and free at random; record from step `record_from` on."""
    held = []
    for step in range(steps):
        if step == record_from:
            device.start_recording()
        if held and device.rng.random() < 0.45:
            device.free(held.pop(device.rng.randrange(len(held))))
        else:
            size = device.rng.choice([4096, 65536, 300_000, 1 * MIB, 3 * MIB, 12 * MIB])
            held.append(device.alloc(size))
    # A snapshot marker, as PyTorch writes when a snapshot is taken.
    device.event("snapshot", 0, 0)


def frames(rng):
    names = ["forward", "backward", "matmul", "conv2d", "layer_norm", "attention"]
    return [
        [{"filename": f"model_{i}.py", "line": rng.randint(1, 900), "name": name}
         for i, name in enumerate(rng.sample(names, 3))]
        for _ in range(6)
    ]


def fixture(name, out, devices, settings):
    snapshot = {
        "segments": [s for d in devices for s in d.snapshot_segments()],
        "device_traces": [d.trace for d in devices],
        "allocator_settings": settings,
    }
    (out / f"{name}.pickle").write_bytes(pickle.dumps(snapshot))
    expected = {
        "devices": [
            {
                "device": d.index,
                "peak_live_bytes": d.peak_live,
                "final_live_bytes": sum(d.live.values()),
                "live_at_start": d.live_at_start,
                "recorded_peak_reserved_bytes": d.peak_reserved,
                "reserved_at_snapshot": d.reserved,
            }
            for d in devices
        ]
    }
    (out / f"{name}.expected.json").write_text(json.dumps(expected, indent=1) + "\n")


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/torch")
    out.mkdir(parents=True, exist_ok=True)
    settings = {
        "PYTORCH_CUDA_ALLOC_CONF": "",
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": False,
        "release_lock_on_cudamalloc": False,
    }

    rng = random.Random(7)
    shared = frames(rng)
    mid_run = Device(0, rng, shared)
    run(mid_run, 400, record_from=150)
    fixture("mid_run", out, [mid_run], settings)

    rng = random.Random(11)
    shared = frames(rng)
    two = [Device(0, rng, shared), Device(1, rng, shared)]
    for d in two:
        run(d, 250, record_from=60)
    fixture("two_devices", out, two, settings)

    rng = random.Random(13)
    expandable = Device(0, rng, frames(rng), expandable=True)
    run(expandable, 300, record_from=100)
    fixture("expandable", out, [expandable], dict(settings, expandable_segments=True))


if __name__ == "__main__":
    main()
