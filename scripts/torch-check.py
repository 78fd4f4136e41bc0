#!/usr/bin/env python3
"""Real PyTorch programs on streamalloc (a machine with a GPU).

Each workload runs twice, each time in a fresh process: on PyTorch's own
caching allocator, and on streamalloc through its pluggable-allocator
library (streamalloc_torch.enable()), with the same seed and deterministic
algorithms. One line per workload: outputs equal (within a stated
tolerance), peak reserved beside PyTorch's max_memory_reserved, and the
median step time beside PyTorch's.

usage: STREAMALLOC_TORCH_LIBRARY=.gpu/libstreamalloc_torch.so python3 scripts/torch-check.py
(the library built here: cargo build --release -p streamalloc-torch --features cuda)

streamalloc runs once per layout in LAYOUTS (the library's default,
adaptive pages; expandable arenas; and expandable arenas whose physical
handles are cut at up to 1/16 of a range, STREAMALLOC_TORCH_HANDLE_SHARE),
each row with the host's waits for a stream that the library counted
(issue 43: none on the paths that reserve, release, trim, settle or give
back). Rows print as they come, every workload's layout before the next
layout, so a run cut short keeps what it measured.
"""
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = ("mlp_train", "conv_train", "decode_two_streams", "record_stream", "alloc_free")
# A layout, and the share its physical handles are cut at ("" for the default).
LAYOUTS = (("adaptive", ""), ("expandable", ""), ("expandable", "16"))
TOLERANCE = 1e-4


def workload(name):
    import torch

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    dev = torch.device("cuda")
    steps = []

    def timed(step):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = step()
        torch.cuda.synchronize()
        steps.append((time.perf_counter() - start) * 1e3)
        return out

    if name == "mlp_train":
        model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(2048, 2048), torch.nn.GELU())]).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for i in range(30):
            batch = 64 + 32 * (i % 7)  # varying batch: varying sizes
            x = torch.randn(batch, 2048, device=dev)

            def step():
                opt.zero_grad(set_to_none=True)
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                return loss

            out = timed(step)
        result = out.item()
    elif name == "conv_train":
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(64, 128, 3, padding=1, stride=2), torch.nn.ReLU(),
            torch.nn.Conv2d(128, 256, 3, padding=1, stride=2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(256, 10),
        ).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for i in range(20):
            x = torch.randn(32, 3, 96 + 16 * (i % 4), 96 + 16 * (i % 4), device=dev)
            y = torch.randint(0, 10, (32,), device=dev)

            def step():
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                return loss

            out = timed(step)
        result = out.item()
    elif name == "alloc_free":
        # The allocator's own time, no kernel: 1,000 tensors of 16 KiB made
        # and dropped at once, a step each (the README of
        # shared/torch-h200 measured 2.3-3.7 ms on PyTorch's allocator).
        kept = torch.empty(1 << 20, device=dev)  # the device in use first
        for _ in range(20):
            def step():
                for _ in range(1000):
                    t = torch.empty(4096, device=dev)
                    del t
                return None

            timed(step)
        result = float(kept.numel())
    elif name == "record_stream":
        # Memory made on one stream, read by long work on another
        # (x.record_stream), freed, and the next allocation filled at once:
        # an allocator that reused it before the other stream was done
        # would change what that stream computes.
        main, side = torch.cuda.current_stream(), torch.cuda.Stream()
        sums = []
        for i in range(12):
            def step():
                x = torch.randn(2048, 2048, device=dev)
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    y = x
                    for _ in range(6):
                        y = torch.tanh(y @ x)
                    sums.append(y.sum())
                x.record_stream(side)
                del x
                z = torch.full((2048, 2048), float(i), device=dev)
                del z
                return None

            timed(step)
        torch.cuda.synchronize()
        result = sum(s.item() for s in sums)
    else:  # decode_two_streams: a KV cache growing on two streams at once
        layers, hidden = 8, 1024
        weights = [torch.randn(hidden, hidden, device=dev) / hidden**0.5 for _ in range(layers)]
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        totals = []
        for s_index, stream in enumerate(streams):
            with torch.cuda.stream(stream):
                state = torch.randn(8, hidden, device=dev)
                cache = []
                for token in range(48):
                    def step():
                        h = state
                        for w in weights:
                            h = torch.tanh(h @ w)
                        cache.append(h.clone())
                        keys = torch.stack(cache)  # grows every token
                        return h + keys.mean(0)

                    state = timed(step)
                totals.append(state.sum())
            torch.cuda.current_stream().wait_stream(stream)
        result = sum(t.item() for t in totals)
    return result, steps


def child(name, mode):
    # "native", or "streamalloc:LAYOUT:SHARE" (read once, at the library's
    # first use).
    streamalloc = mode.startswith("streamalloc")
    if streamalloc:
        _, layout, share = mode.split(":")
        os.environ["STREAMALLOC_TORCH_CONFIG"] = layout
        if share:
            os.environ["STREAMALLOC_TORCH_HANDLE_SHARE"] = share
    import torch

    if streamalloc:
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import streamalloc_torch

        streamalloc_torch.enable()
    result, steps = workload(name)
    torch.cuda.synchronize()
    if streamalloc:
        import streamalloc_torch

        stats = streamalloc_torch.stats()
        peak = max(d["peak_bytes_reserved"] for d in stats["devices"])
        extra = {
            "refusals": {k: v for k, v in stats["refusals"].items() if v},
            "stream_waits": sum(d["driver"]["stream_waits"] for d in stats["devices"]),
        }
    else:
        peak = torch.cuda.max_memory_reserved()
        extra = {}
    print(json.dumps({"result": result, "peak_reserved": peak, "step_ms": statistics.median(steps[2:]), **extra}))


def main():
    if len(sys.argv) == 3:
        return child(sys.argv[1], sys.argv[2])
    print("| workload | layout | outputs equal (rel. tol. 1e-4) | peak reserved, streamalloc / PyTorch (MiB) | median step, streamalloc / PyTorch (ms) | stream waits | refusals |", flush=True)
    print("| --- | --- | --- | --- | --- | --- | --- |", flush=True)
    failed = False

    def run(name, mode):
        out = subprocess.run([sys.executable, __file__, name, mode], capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            print(f"| {name} | {mode} | failed: {out.stderr.strip().splitlines()[-1:]} | | | | |", flush=True)
            return None
        return json.loads(out.stdout.strip().splitlines()[-1])

    mib = 1 << 20
    native = {name: run(name, "native") for name in WORKLOADS}
    failed = any(a is None for a in native.values())
    for layout, share in LAYOUTS:
        label = layout + (f", handles 1/{share}" if share else "")
        for name in WORKLOADS:
            a = native[name]
            if a is None:
                continue
            b = run(name, f"streamalloc:{layout}:{share}")
            if b is None:
                failed = True
                continue
            equal = abs(a["result"] - b["result"]) <= TOLERANCE * max(1.0, abs(a["result"]))
            failed |= not equal
            print(
                f"| {name} | {label} | {equal} ({b['result']:.6g} vs {a['result']:.6g}) | "
                f"{b['peak_reserved'] / mib:.1f} / {a['peak_reserved'] / mib:.1f} ({b['peak_reserved'] / max(a['peak_reserved'], 1):.2f}x) | "
                f"{b['step_ms']:.2f} / {a['step_ms']:.2f} ({b['step_ms'] / max(a['step_ms'], 1e-9):.2f}x) | "
                f"{b['stream_waits']} | {b.get('refusals', {})} |",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
