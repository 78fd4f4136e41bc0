#!/usr/bin/env python3
"""Generate the placement corpus: one RMM logging CSV per workload family.

Families (each seeded; the same seed gives the same file):
  serving      multi-stream continuous batching: KV blocks held per request,
               per-step activations, the load falls for the last 30 %
  training     one stream, batch size varying per step: weights and optimizer
               state held, activations freed in reverse in the backward pass
  fragment     adversarial fragmentation: runs of allocations with every
               other one freed, then requests a little larger than the holes
  random       RMM's random_allocations benchmark pattern: random sizes,
               random frees, a cap on what is live
  cnn          many small tensors: a few hundred activations per step of
               4 KiB..4 MiB, temporaries freed at once
  lora         fine-tuning with adapters: large frozen weights, small
               adapters with gradients and optimizer state, activations

usage: python3 scripts/placement_corpus.py OUTDIR [--seed S] [--events N]
                                           [--families a,b,...]
A family's file is OUTDIR/FAMILY-sSEED.csv. The placement table runs them:
scripts/placement_table.sh.
"""
import argparse
import math
import os
import random

KIB = 1 << 10
MIB = 1 << 20


class Trace:
    """RMM's CSV: Thread,Time,Action,Pointer,Size,Stream (times in ns)."""

    def __init__(self, path, rng):
        self.out = open(path, "w", buffering=1 << 20)
        self.out.write("Thread,Time,Action,Pointer,Size,Stream\n")
        self.rng = rng
        self.t = 0
        self.next_ptr = 0x7F0000000000
        self.live = {}
        self.events = 0

    def alloc(self, size, stream=0):
        size = max(1, int(size))
        self.next_ptr += 0x1000
        p = self.next_ptr
        self.live[p] = (size, stream)
        self._emit("allocate", p, size, stream)
        return p

    def free(self, p):
        size, stream = self.live.pop(p)
        self._emit("free", p, size, stream)

    def _emit(self, action, p, size, stream):
        self.t += 500 + self.rng.randrange(2000)
        self.events += 1
        self.out.write(f"{stream},{self.t},{action},{p:#x},{size},{stream + 1:#x}\n")

    def close(self):
        self.out.close()


def serving(tr, rng, events):
    streams = 4
    kv_block = 2 * MIB
    active = [[] for _ in range(streams)]  # per stream: [tokens, left, blocks]
    fall_at = int(events * 0.7)
    while tr.events < events:
        cap = 1 if tr.events > fall_at else 6
        for s in range(streams):
            while len(active[s]) < cap and rng.random() < 0.5:
                prompt = rng.randint(16, 1024)
                blocks = [tr.alloc(kv_block, s) for _ in range(math.ceil(prompt / 256))]
                active[s].append([prompt, rng.randint(8, 128), blocks])
            tokens = sum(1 for _ in active[s]) or 1
            acts = []
            for layer in range(8):
                acts.append(tr.alloc(tokens * 4096 * (1 + layer % 3) * 2, s))
                if len(acts) > 2:
                    tr.free(acts.pop(0))
            for a in acts:
                tr.free(a)
            for req in list(active[s]):
                req[0] += 1
                req[1] -= 1
                if req[0] % 256 == 0:
                    req[2].append(tr.alloc(kv_block, s))
                if req[1] <= 0:
                    for b in req[2]:
                        tr.free(b)
                    active[s].remove(req)


def training(tr, rng, events):
    layers = 24
    weights = [rng.choice([1, 2, 4, 8]) * MIB + rng.randrange(64) * KIB for _ in range(layers)]
    held = [tr.alloc(w) for w in weights]
    held += [tr.alloc(2 * w) for w in weights]  # optimizer state
    while tr.events < events:
        batch = rng.choice([8, 12, 16, 24, 32, 48, 64])
        acts = []
        for i in range(layers):
            acts.append(tr.alloc(batch * (96 + 32 * (i % 4)) * KIB))
            tmp = tr.alloc(batch * 16 * KIB)
            tr.free(tmp)
        grads = []
        for i in reversed(range(layers)):
            g = tr.alloc(batch * (96 + 32 * (i % 4)) * KIB)
            tr.free(acts.pop())
            grads.append(tr.alloc(weights[i]))
            tr.free(g)
        for g in grads:
            tr.free(g)


def fragment(tr, rng, events):
    held = []
    size = 256 * KIB
    while tr.events < events:
        run = [tr.alloc(size + rng.randrange(8) * 4 * KIB) for _ in range(64)]
        small = []
        for i, p in enumerate(run):
            if i % 2:
                tr.free(p)
            else:
                small.append(p)
        # A little larger than every hole: none of them fits.
        larger = [tr.alloc(size * 5 // 4) for _ in range(16)]
        held.append((small, larger))
        if len(held) > 6:
            old_small, old_larger = held.pop(rng.randrange(len(held)))
            for p in old_small + old_larger:
                tr.free(p)
        size = size * 3 // 2 if size < 8 * MIB else 256 * KIB


def random_allocations(tr, rng, events):
    live = []
    cap = 512 * MIB
    live_bytes = 0
    while tr.events < events:
        if live and (live_bytes > cap or rng.random() < 0.45):
            i = rng.randrange(len(live))
            p, size = live[i]
            live[i] = live[-1]
            live.pop()
            tr.free(p)
            live_bytes -= size
        else:
            size = rng.randint(1, 8 * MIB)
            live.append((tr.alloc(size), size))
            live_bytes += size


def cnn(tr, rng, events):
    shapes = [int(math.exp(rng.uniform(math.log(4 * KIB), math.log(4 * MIB)))) for _ in range(160)]
    params = [tr.alloc(max(4 * KIB, s // 8)) for s in shapes[:80]]
    while tr.events < events:
        batch = rng.choice([16, 24, 32])
        acts = []
        for s in shapes:
            acts.append(tr.alloc(s * batch // 32))
            if rng.random() < 0.5:
                tr.free(tr.alloc(s // 4 + 256))
        for a in reversed(acts):
            g = tr.alloc(tr.live[a][0])
            tr.free(a)
            tr.free(g)


def lora(tr, rng, events):
    layers = 32
    frozen = [tr.alloc(rng.choice([32, 44, 64]) * MIB) for _ in range(layers)]
    adapters = []
    for _ in range(layers * 2):
        size = rng.choice([64, 128, 256]) * KIB
        adapters += [tr.alloc(size), tr.alloc(size), tr.alloc(2 * size)]
    while tr.events < events:
        seq = rng.randint(128, 2048)
        acts = [tr.alloc(seq * 8 * KIB) for _ in range(layers)]
        grads = []
        for a in reversed(acts):
            g = tr.alloc(seq * 8 * KIB)
            grads.append(tr.alloc(rng.choice([64, 128, 256]) * KIB))
            tr.free(a)
            tr.free(g)
        for g in grads:
            tr.free(g)


FAMILIES = {
    "serving": serving,
    "training": training,
    "fragment": fragment,
    "random": random_allocations,
    "cnn": cnn,
    "lora": lora,
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--families", default=",".join(FAMILIES))
    args = parser.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    for name in args.families.split(","):
        rng = random.Random(f"{name}-{args.seed}")
        path = os.path.join(args.outdir, f"{name}-s{args.seed}.csv")
        tr = Trace(path, rng)
        FAMILIES[name](tr, rng, args.events)
        tr.close()
        print(path)


if __name__ == "__main__":
    main()
