#!/usr/bin/env python3
"""Generate a serving-like RMM logging CSV (for replay demos and benches).

Streams take requests; each request holds KV-cache blocks for its life and
allocates and frees per-layer activations. Pointers are reused after their
free, as a real allocator's are.

With --fall F, the last F of the events run at a low load (at most one
request per stream), so a replay can show what is held after the load falls.

usage: python3 scripts/gen_rmm_trace.py OUT.csv [--events N] [--seed S]
                                        [--streams K] [--fall F]
"""
import argparse
import random

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
next_ptr = 0x7F0000000000
t = 0.0
lines = ["Thread,Time,Action,Pointer,Size,Stream"]


def ptr():
    global next_ptr
    if free_ptrs and rng.random() < 0.7:
        return free_ptrs.pop(rng.randrange(len(free_ptrs)))
    next_ptr += 0x1000000
    return next_ptr


def emit(action, p, size, stream):
    global t
    t += rng.random() * 20e-6
    h, rem = divmod(t, 3600)
    m, s = divmod(rem, 60)
    lines.append(f"{stream},{int(h):02d}:{int(m):02d}:{s:09.6f},{action},{p:#x},{size},{stream + 1:#x}")


def end_request(stream):
    kv = live[stream].pop(rng.randrange(len(live[stream])))
    for p, size in kv:
        emit("free", p, size, stream)
        free_ptrs.append(p)


live = {s: [] for s in range(args.streams)}
fall_at = args.events * (1.0 - args.fall)
while len(lines) < args.events:
    stream = rng.randrange(args.streams)
    most = 6 if len(lines) < fall_at else 1
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
            free_ptrs.append(p)
    if len(live[stream]) > 6 or (live[stream] and rng.random() < 0.25):
        end_request(stream)
    while len(live[stream]) > most:
        end_request(stream)

with open(args.out, "w") as f:
    f.write("\n".join(lines) + "\n")
print(f"wrote {len(lines) - 1} events to {args.out}")
