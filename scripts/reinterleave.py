#!/usr/bin/env python3
"""Other interleavings of a multi-stream trace: the same threads' work, as
another run of the same program could have scheduled it.

A recording of several host threads (one CUDA stream each) fixes one
interleaving of their allocations; a server's next run interleaves them
otherwise, and an allocator tuned to the first may pay more on the next.
This writes variants of a trace in this project's JSON Lines format
(`streamalloc convert` makes one from a PyTorch snapshot or an RMM log):

  bursts SEED   the worker streams take turns in bursts of 1..40 events,
                at random (each stream's own order kept); the events keep
                the recording's timestamps in order, so its pauses stay
                where they were
  late MS       the last stream to start starts MS milliseconds later; the
                events merge by their (shifted) timestamps

Events before the first worker stream's (loading weights on the default
stream) stay first. Allocation ids are renamed per lifetime, so that a
pointer one stream freed and another reused never clashes when their order
changes. The same arguments give the same file.

usage: python3 scripts/reinterleave.py IN.jsonl OUT.jsonl bursts SEED
       python3 scripts/reinterleave.py IN.jsonl OUT.jsonl late MS
"""

import json
import random
import sys


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError):
        sys.exit(f"{path}: not JSON Lines (`streamalloc convert {path} OUT.jsonl` makes them)")
    meta = lines[0] if "meta" in lines[0] else None
    events = lines[1:] if meta else lines
    return meta, events


def rename_lifetimes(events):
    """Each allocation gets an id of its own; its free follows it."""
    current, next_id = {}, 1 << 40
    for event in events:
        if event["action"] == "alloc":
            next_id += 4096
            current[event["id"]] = next_id
            event["id"] = next_id
        elif event["action"] == "free" and event["id"] in current:
            event["id"] = current.pop(event["id"])


def workers(events):
    """The streams other than the default one, in the order they start."""
    first = {}
    for index, event in enumerate(events):
        if event["action"] in ("alloc", "free") and event["stream"] != 0:
            first.setdefault(event["stream"], index)
    return sorted(first, key=first.get)


def bursts(events, seed):
    rng = random.Random(seed)
    streams = workers(events)
    start = next(i for i, e in enumerate(events) if e["stream"] in streams)
    head, rest = events[:start], events[start:]
    queues = {}
    for event in rest:
        queues.setdefault(event["stream"], []).append(event)
    order = []
    while any(queues.values()):
        stream = rng.choice(sorted(s for s in queues if queues[s]))
        take = rng.randint(1, 40)
        order += queues[stream][:take]
        del queues[stream][:take]
    times = [event["time_ns"] for event in events]
    merged = head + order
    for event, time in zip(merged, times):
        event["time_ns"] = time
    return merged


def late(events, ms):
    last = workers(events)[-1]
    for index, event in enumerate(events):
        event["_order"] = index
        if event["stream"] == last:
            event["time_ns"] += int(ms * 1e6)
    events.sort(key=lambda e: (e["time_ns"], e["_order"]))
    for event in events:
        del event["_order"]
    return events


def main():
    if len(sys.argv) != 5 or sys.argv[3] not in ("bursts", "late"):
        sys.exit(__doc__)
    source, out, mode, value = sys.argv[1:]
    meta, events = read(source)
    if len(workers(events)) < 2:
        sys.exit(f"{source}: fewer than two worker streams, nothing to interleave")
    rename_lifetimes(events)
    events = bursts(events, int(value)) if mode == "bursts" else late(events, float(value))
    with open(out, "w") as f:
        if meta:
            f.write(json.dumps(meta) + "\n")
        for event in events:
            f.write(json.dumps(event) + "\n")


if __name__ == "__main__":
    main()
