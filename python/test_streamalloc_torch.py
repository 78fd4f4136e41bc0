"""The shared library through ctypes, as Python calls it: without torch,
over host memory. Run: python3 python/test_streamalloc_torch.py (after
cargo build -p streamalloc-torch)."""

import ctypes
import os
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import streamalloc_torch as sa  # noqa: E402


def main():
    lib = sa._library()
    stream = ctypes.c_void_p(0x40)
    sa.set_recording(True)
    errors = []

    def worker(seed):
        import random

        rng = random.Random(seed)
        held = []
        try:
            for _ in range(5000):
                if held and rng.random() < 0.45:
                    ptr, size = held.pop(rng.randrange(len(held)))
                    lib.streamalloc_free(ptr, size, 0, stream)
                else:
                    size = rng.randrange(1, 1 << 20)
                    ptr = lib.streamalloc_malloc(size, 0, stream)
                    if not ptr:
                        raise AssertionError(f"{size} bytes refused")
                    ctypes.memset(ptr, seed & 0xFF, min(size, 64))
                    held.append((ptr, size))
                if rng.random() < 0.01:
                    lib.streamalloc_free(ctypes.c_void_p(0xDEAD0000), 8, 0, stream)  # a stranger
                    lib.streamalloc_malloc(8, -1, stream)  # no such device
            for ptr, size in held:
                lib.streamalloc_free(ptr, size, 0, stream)
        except Exception as err:  # reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    s = sa.stats()
    assert s["live_bytes"] == 0, s
    assert s["allocations"] == s["frees"] > 0, s
    assert s["refusals"]["unknown_free"] > 0 and s["refusals"]["bad_device"] > 0, s
    assert s["devices"][0]["bytes_in_use"] == 0, s
    summary = sa.memory_summary()
    assert "device 0" in summary and "refusals" in summary, summary
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.jsonl")
        written = sa.dump_trace(path)
        assert written == 2 * s["allocations"], (written, s)
        with open(path) as f:
            assert sum(1 for _ in f) >= written
    assert "torch" not in sys.modules, "importing streamalloc_torch must not import torch"
    print(f"python: 4 threads, {s['allocations']} allocations and frees, stats back to zero, trace of {written} events: ok")


if __name__ == "__main__":
    main()
