#!/usr/bin/env python3
"""The costs `DriverCosts` estimates rather than measures, measured on this
machine's GPU through the CUDA driver (ctypes, no torch): address space
reserved and freed, and a device-to-device copy queued on a stream.

usage: python3 scripts/driver_probe.py        (on a machine with a GPU)
Prints one JSON object of nanoseconds per call, in `--driver-costs` form.
"""
import ctypes
import json
import sys
import time

N = 2000


def main():
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        print(f"no CUDA driver: {err}", file=sys.stderr)
        return 1
    u64, size_t = ctypes.c_uint64, ctypes.c_size_t

    def check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: CUresult {rc}")

    check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    cuda.cuMemAddressReserve.argtypes = [ctypes.POINTER(u64), size_t, size_t, u64, ctypes.c_ulonglong]
    cuda.cuMemAddressFree.argtypes = [u64, size_t]
    size = 1 << 34  # 16 GiB of address space, as an arena's range
    ptrs = [u64() for _ in range(N)]
    start = time.perf_counter_ns()
    for p in ptrs:
        check(cuda.cuMemAddressReserve(ctypes.byref(p), size, 0, 0, 0), "reserve")
    reserve = (time.perf_counter_ns() - start) / N
    start = time.perf_counter_ns()
    for p in ptrs:
        check(cuda.cuMemAddressFree(p.value, size), "free")
    free = (time.perf_counter_ns() - start) / N

    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), size_t]
    cuda.cuMemcpyDtoDAsync_v2.argtypes = [u64, u64, size_t, ctypes.c_void_p]
    cuda.cuMemFree_v2.argtypes = [u64]
    stream = ctypes.c_void_p()
    check(cuda.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
    a, b = u64(), u64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(a), 1 << 20), "alloc")
    check(cuda.cuMemAlloc_v2(ctypes.byref(b), 1 << 20), "alloc")
    for _ in range(100):  # warm up
        cuda.cuMemcpyDtoDAsync_v2(b.value, a.value, 4096, stream)
    check(cuda.cuStreamSynchronize(stream), "sync")
    start = time.perf_counter_ns()
    for _ in range(N):
        check(cuda.cuMemcpyDtoDAsync_v2(b.value, a.value, 4096, stream), "copy")
    copy = (time.perf_counter_ns() - start) / N
    check(cuda.cuStreamSynchronize(stream), "sync")
    cuda.cuMemFree_v2(a.value)
    cuda.cuMemFree_v2(b.value)
    print(json.dumps({
        "address_reserve_ns": round(reserve),
        "address_free_ns": round(free),
        "copy_ns": round(copy),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
