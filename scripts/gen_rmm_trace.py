#!/usr/bin/env python3
"""Generate a serving-like RMM logging CSV (for replay demos and benches).

Streams take requests; each request holds KV-cache blocks for its life and
allocates and frees per-layer activations. Pointers are reused after their
free, as a real allocator's are.

With --fall F, the last F of the events run at a low load (at most one
request per stream), so a replay can show what is held after the load falls.

It streams: lines go to the file in chunks as they are made, and taking a
free pointer is O(1), so ten million events take well under a minute and
a few megabytes. Times are written as integer nanoseconds (RMM's reader
takes those as well as HH:MM:SS.ffffff).

usage: python3 scripts/gen_rmm_trace.py OUT.csv [--events N] [--seed S]
                                        [--streams K] [--fall F]
"""
import argparse
import random
import sys

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--events", type=int, default=200_000)
parser.add_argument("--seed", type=int, default=7)
parser.add_argument("--streams", type=int, default=4)
parser.add_argument("--fall", type=float, default=0.0)
args = parser.parse_args()
rng = random.Random(args.seed)
MIB = 1 << 20
free_ptrs = []
# Pointers kept for reuse at most (a real allocator's free lists are bounded
# too); the rest are forgotten, so memory stays flat however long the trace.
MAX_FREE = 1 << 16
next_ptr = 0x7F0000000000
t = 0.0
out = open(args.out, "w", buffering=1 << 20)
out.write("Thread,Time,Action,Pointer,Size,Stream\n")
chunk = []
events = 0


def ptr():
    global next_ptr
    if free_ptrs and rng.random() < 0.7:
        # Swap-remove: O(1), and any free pointer is as good as another.
        i = rng.randrange(len(free_ptrs))
        last = free_ptrs.pop()
        if i < len(free_ptrs):
            last, free_ptrs[i] = free_ptrs[i], last
        return last
    next_ptr += 0x1000000
    return next_ptr


def emit(action, p, size, stream):
    global t, events
    t += rng.random() * 20e-6
    chunk.append(f"{stream},{int(t * 1e9)},{action},{p:#x},{size},{stream + 1:#x}\n")
    events += 1
    if len(chunk) >= 65536:
        out.write("".join(chunk))
        chunk.clear()


def end_request(stream):
    kv = live[stream].pop(rng.randrange(len(live[stream])))
    for p, size in kv:
        emit("free", p, size, stream)
        keep(p)


def keep(p):
    if len(free_ptrs) < MAX_FREE:
        free_ptrs.append(p)


live = {s: [] for s in range(args.streams)}
fall_at = args.events * (1.0 - args.fall)
while events < args.events:
    stream = rng.randrange(args.streams)
    most = 6 if events < fall_at else 1
    # a request: KV blocks that live across many steps
    if rng.random() < 0.3 or not live[stream]:
        kv = [(ptr(), 2 * MIB) for _ in range(rng.randint(1, 8))]
        for p, size in kv:
            emit("allocate", p, size, stream)
        live[stream].append(kv)
    # a step: activations per layer
    for _layer in range(rng.randint(2, 6)):
        acts = [(ptr(), rng.choice([256 * 1024, 1 * MIB, 3 * MIB, rng.randint(4096, 6 * MIB)])) for _ in range(3)]
        for p, size in acts:
            emit("allocate", p, size, stream)
        for p, size in acts:
            emit("free", p, size, stream)
            keep(p)
    if len(live[stream]) > 6 or (live[stream] and rng.random() < 0.25):
        end_request(stream)
    while len(live[stream]) > most:
        end_request(stream)

out.write("".join(chunk))
out.close()
print(f"wrote {events} events to {args.out}", file=sys.stderr)
