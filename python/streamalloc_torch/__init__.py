"""streamalloc as PyTorch's CUDA allocator.

    import streamalloc_torch
    streamalloc_torch.enable()          # before the first CUDA allocation
    ...                                 # the program, unchanged
    print(streamalloc_torch.memory_summary())
    streamalloc_torch.dump_trace("run.jsonl")   # with STREAMALLOC_TORCH_RECORD=1

Pure Python over ctypes: one build of the shared library serves any
Python 3, and importing this module needs no torch (only enable() and
mem_pool() do). docs/torch.md says what differs from PyTorch's allocator.
"""

import ctypes
import json
import os
import pathlib

__all__ = [
    "library_path",
    "enable",
    "mem_pool",
    "stats",
    "memory_summary",
    "dump_trace",
    "set_recording",
    "empty_cache",
]

_NAMES = ("libstreamalloc_torch.so", "libstreamalloc_torch.dylib", "streamalloc_torch.dll")
_lib = None


def library_path():
    """Where the shared library is: $STREAMALLOC_TORCH_LIBRARY, beside this
    module (an installed package), or a cargo build of the repository."""
    explicit = os.environ.get("STREAMALLOC_TORCH_LIBRARY")
    if explicit:
        return pathlib.Path(explicit)
    here = pathlib.Path(__file__).resolve().parent
    # `pip install` puts it beside this module, under an extension's name.
    candidates = sorted(here.glob("libstreamalloc_torch*.so")) + [here / name for name in _NAMES]
    repo = here.parent.parent
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", repo / "target"))
    for profile in ("release", "debug"):
        candidates += [target / profile / name for name in _NAMES]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise FileNotFoundError(
        "no streamalloc_torch shared library: build it (cargo build --release -p streamalloc-torch) "
        "or set STREAMALLOC_TORCH_LIBRARY; looked in " + ", ".join(str(c) for c in candidates)
    )


def _library():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(str(library_path()))
        lib.streamalloc_malloc.restype = ctypes.c_void_p
        lib.streamalloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.streamalloc_free.restype = None
        lib.streamalloc_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.streamalloc_stats_json.restype = ctypes.c_void_p
        lib.streamalloc_free_string.argtypes = [ctypes.c_void_p]
        lib.streamalloc_dump_trace.restype = ctypes.c_int64
        lib.streamalloc_dump_trace.argtypes = [ctypes.c_char_p]
        lib.streamalloc_set_recording.argtypes = [ctypes.c_int]
        lib.streamalloc_set_memory_fraction.argtypes = [ctypes.c_double, ctypes.c_int]
        lib.streamalloc_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        _lib = lib
    return _lib


def _allocator():
    import torch

    path = str(library_path())
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "streamalloc_malloc", "streamalloc_free")
    # The optional hooks, where this PyTorch has them.
    raw = allocator.allocator()
    lib = _library()
    for setter, name in (
        ("set_reset_fn", "streamalloc_empty_cache"),
        ("set_memory_fraction_fn", "streamalloc_set_memory_fraction"),
        ("set_record_stream_fn", "streamalloc_record_stream"),
    ):
        if hasattr(raw, setter):
            getattr(raw, setter)(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
    return allocator


def enable():
    """Make streamalloc this process's CUDA allocator. Call it before the
    first CUDA allocation: PyTorch cannot change allocators after one."""
    import torch

    # The GPU's memory unless told otherwise (read at the library's first call).
    os.environ.setdefault("STREAMALLOC_TORCH_STORAGE", "cuda")
    if torch.cuda.is_initialized() and torch.cuda.memory_allocated() > 0:
        raise RuntimeError(
            "CUDA memory was already allocated through PyTorch's allocator: "
            "call streamalloc_torch.enable() before the first CUDA tensor"
        )
    if torch.backends.cudnn.benchmark:
        raise RuntimeError("torch.backends.cudnn.benchmark needs memory_stats, which a pluggable allocator has not")
    torch.cuda.memory.change_current_allocator(_allocator())


def mem_pool():
    """A torch.cuda.MemPool over streamalloc, for part of a program
    (`with torch.cuda.use_mem_pool(streamalloc_torch.mem_pool()): ...`)."""
    import torch

    return torch.cuda.MemPool(_allocator().allocator())


def stats():
    """Every device's figures: peak live and reserved, per stream, driver
    operations, refusals."""
    lib = _library()
    text = lib.streamalloc_stats_json()
    if not text:
        raise RuntimeError("streamalloc_torch: no statistics")
    try:
        return json.loads(ctypes.string_at(text).decode())
    finally:
        lib.streamalloc_free_string(text)


def _bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def memory_summary():
    """A table in the spirit of torch.cuda.memory_summary()."""
    s = stats()
    lines = [
        f"streamalloc: {s['allocations']} allocations, {s['frees']} frees; "
        f"live {_bytes(s['live_bytes'])}, peak live {_bytes(s['peak_live_bytes'])}",
    ]
    for d in s["devices"]:
        lines.append(
            f"device {d['device']}: in use {_bytes(d['bytes_in_use'])} (peak {_bytes(d['peak_bytes_in_use'])}), "
            f"reserved {_bytes(d['bytes_reserved'])} (peak {_bytes(d['peak_bytes_reserved'])}), "
            f"{d['live_allocations']} live allocations"
        )
        for st in d["streams"]:
            lines.append(
                f"  stream {st['stream']}: in use {_bytes(st['bytes_in_use'])}, reserved {_bytes(st['bytes_reserved'])} "
                f"(peak {_bytes(st['peak_bytes_reserved'])}), {st['reservations']} reservations"
            )
    refused = {k: v for k, v in s["refusals"].items() if v}
    lines.append("refusals: " + (", ".join(f"{k} {v}" for k, v in sorted(refused.items())) or "none"))
    return "\n".join(lines)


def set_recording(on=True):
    """Start or stop recording allocations and frees for dump_trace()."""
    _library().streamalloc_set_recording(1 if on else 0)


def dump_trace(path):
    """Write what was recorded as JSON Lines (`streamalloc replay` reads
    it); the number of events."""
    written = _library().streamalloc_dump_trace(os.fspath(path).encode())
    if written < 0:
        raise RuntimeError("streamalloc_torch: no trace written (is recording on?)")
    return written


def empty_cache():
    """Give back what no allocation holds (torch.cuda.empty_cache() does
    this too, once enable() has run)."""
    _library().streamalloc_empty_cache()
