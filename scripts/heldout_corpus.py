#!/usr/bin/env python3
"""A second placement corpus, written apart from `placement_corpus.py` and
after the placement it checks: the same families in other shapes, so that
a mechanism tuned to the first corpus shows it here.

Families (each seeded; the same seed gives the same file):
  serving_contig  continuous batching without paging: each request's KV
                  cache one allocation, grown by reallocation every 64
                  tokens; 2, 3 or 8 streams; the load falls at 50-80 %
  serving_paged   paged KV blocks of 1, 4 or 16 MiB, 2 or 6 streams, ten
                  requests a stream until 60 %, then two
  training_odd    12-48 layers of odd sizes, three copies of the weights,
                  gradient accumulation over 1, 2 or 4 micro-batches
  random_geo      RMM's random pattern with log-normal sizes (256 B..64 MiB)
  cnn_multi       two streams training a CNN in turns, shapes of channels x
                  spatial size, batch 8..64 per step
  lora_var        frozen weights of 8-90 MiB, adapters of rank 4..64
  fragment_saw    runs with two of every three freed, then larger requests;
                  the load falls to one run at the end

usage: python3 scripts/heldout_corpus.py OUTDIR [--seed S] [--events N]
A family's file is OUTDIR/FAMILY-hSEED.csv; the placement table runs it
like the first corpus: scripts/placement_table.sh SEED EVENTS heldout.
"""

import argparse
import math
import os
import random

from placement_corpus import KIB, MIB, Trace


def serving_contig(tr, rng, events):
    # non-paged KV: each request's cache grows by reallocation (free old, alloc larger)
    streams = rng.choice([2, 3, 8])
    fall_at = int(events * rng.uniform(0.5, 0.8))
    per_tok = rng.choice([64, 128, 160]) * KIB
    active = [[] for _ in range(streams)]
    while tr.events < events:
        cap = 1 if tr.events > fall_at else rng.choice([3, 5, 8])
        for s in range(streams):
            while len(active[s]) < cap and rng.random() < 0.4:
                toks = rng.randint(32, 2048)
                active[s].append([toks, rng.randint(4, 200), tr.alloc(toks * per_tok, s)])
            n = max(1, len(active[s]))
            a = [
                tr.alloc(n * rng.choice([1, 2, 3]) * 512 * KIB + rng.randrange(4096), s)
                for _ in range(6)
            ]
            for p in a:
                tr.free(p)
            for req in list(active[s]):
                req[0] += 1
                req[1] -= 1
                if req[0] % 64 == 0:
                    new = tr.alloc(req[0] * per_tok, s)
                    tr.free(req[2])
                    req[2] = new
                if req[1] <= 0:
                    tr.free(req[2])
                    active[s].remove(req)


def serving_paged(tr, rng, events):
    streams = rng.choice([2, 6])
    kv = rng.choice([1, 4, 16]) * MIB
    fall_at = int(events * 0.6)
    active = [[] for _ in range(streams)]
    while tr.events < events:
        cap = 2 if tr.events > fall_at else 10
        for s in range(streams):
            while len(active[s]) < cap and rng.random() < 0.6:
                prompt = rng.randint(64, 4096)
                active[s].append(
                    [
                        prompt,
                        rng.randint(16, 256),
                        [tr.alloc(kv, s) for _ in range(math.ceil(prompt / 512))],
                    ]
                )
            t = len(active[s]) or 1
            acts = [tr.alloc(t * 8192 * (1 + l % 4), s) for l in range(12)]
            for p in reversed(acts):
                tr.free(p)
            for req in list(active[s]):
                req[0] += 1
                req[1] -= 1
                if req[0] % 512 == 0:
                    req[2].append(tr.alloc(kv, s))
                if req[1] <= 0:
                    for b in req[2]:
                        tr.free(b)
                    active[s].remove(req)


def training_odd(tr, rng, events):
    layers = rng.randint(12, 48)
    w = [rng.randint(100 * KIB, 12 * MIB) for _ in range(layers)]
    held = [tr.alloc(x) for x in w] + [tr.alloc(x) for x in w] + [tr.alloc(x) for x in w]
    accum = rng.choice([1, 2, 4])
    while tr.events < events:
        grads = None
        for micro in range(accum):
            b = rng.randint(4, 96)
            acts = [tr.alloc(b * rng.randint(20, 200) * KIB) for _ in range(layers)]
            g2 = []
            for i in reversed(range(layers)):
                t = tr.alloc(b * 50 * KIB)
                tr.free(acts.pop())
                tr.free(t)
                g2.append(tr.alloc(w[i]))
            if grads is None:
                grads = g2
            else:
                for g in g2:
                    tr.free(g)
        for g in grads:
            tr.free(g)


def random_geo(tr, rng, events):
    live = []
    cap = rng.choice([256, 1024]) * MIB
    lb = 0
    while tr.events < events:
        if live and (lb > cap or rng.random() < 0.48):
            i = rng.randrange(len(live))
            p, s = live[i]
            live[i] = live[-1]
            live.pop()
            tr.free(p)
            lb -= s
        else:
            s = int(min(64 * MIB, max(256, rng.lognormvariate(math.log(256 * KIB), 2.0))))
            live.append((tr.alloc(s), s))
            lb += s


def cnn_multi(tr, rng, events):
    streams = 2
    shapes = [
        rng.choice([64, 128, 256, 512]) * rng.choice([7, 14, 28, 56]) ** 2 * 4 for _ in range(120)
    ]
    params = [[tr.alloc(max(1024, s // 16), st) for s in shapes[:60]] for st in range(streams)]
    while tr.events < events:
        for st in range(streams):
            b = rng.choice([8, 16, 32, 64])
            acts = []
            for s in shapes:
                acts.append(tr.alloc(s * b // 16, st))
                tr.free(tr.alloc(s * b // 64 + 512, st))
            for a in reversed(acts):
                g = tr.alloc(tr.live[a][0], st)
                tr.free(a)
                tr.free(g)


def lora_var(tr, rng, events):
    layers = rng.randint(16, 40)
    frozen = [tr.alloc(rng.randint(8, 90) * MIB + rng.randrange(MIB)) for _ in range(layers)]
    r = rng.choice([4, 8, 16, 64])
    adapters = [tr.alloc(r * 4096 * rng.choice([2, 4])) for _ in range(layers * 4)]
    opt = [tr.alloc(r * 4096 * 8) for _ in range(layers * 4)]
    while tr.events < events:
        seq = rng.randint(64, 4096)
        acts = [tr.alloc(seq * 5120 * 2) for _ in range(layers)]
        g = []
        for a in reversed(acts):
            t = tr.alloc(seq * 5120 * 2 * 4)
            tr.free(t)
            tr.free(a)
            g.append(tr.alloc(r * 4096 * 2))
        for x in g:
            tr.free(x)


def fragment_saw(tr, rng, events):
    held = []
    while tr.events < events:
        sizes = [rng.randint(64 * KIB, 6 * MIB) for _ in range(40)]
        ps = [tr.alloc(s) for s in sizes]
        keep = [p for i, p in enumerate(ps) if i % 3 == 0]
        for i, p in enumerate(ps):
            if i % 3:
                tr.free(p)
        big = [tr.alloc(rng.randint(6 * MIB, 20 * MIB)) for _ in range(5)]
        held.append(keep + big)
        if len(held) > 8:
            for p in held.pop(rng.randrange(len(held))):
                tr.free(p)
    # load falls
    while len(held) > 1:
        for p in held.pop():
            tr.free(p)


FAMILIES = {
    "serving_contig": serving_contig,
    "serving_paged": serving_paged,
    "training_odd": training_odd,
    "random_geo": random_geo,
    "cnn_multi": cnn_multi,
    "lora_var": lora_var,
    "fragment_saw": fragment_saw,
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("--seed", type=int, default=101)
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    for name, family in FAMILIES.items():
        rng = random.Random(f"ho-{name}-{args.seed}")
        path = os.path.join(args.outdir, f"{name}-h{args.seed}.csv")
        tr = Trace(path, rng)
        family(tr, rng, args.events)
        tr.close()
        print(path)


if __name__ == "__main__":
    main()
