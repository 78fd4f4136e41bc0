#!/usr/bin/env python3
"""The costs `DriverCosts` estimates rather than measures, measured on this
machine's GPU through the CUDA driver (ctypes, no torch): address space
reserved and freed, and a device-to-device copy queued on a stream.

usage: python3 scripts/driver_probe.py        (on a machine with a GPU)
Prints one JSON object of nanoseconds per call, in `--driver-costs` form,
on standard output; on standard error, what the copy's cost is made of.

On standard error too, the host's cost to queue a `cuStreamWaitEvent` (one
stream ordered after another's event), which no `DriverCosts` field prices
yet.

A copy is measured three ways, because 2,000 small copies queued back to
back (how `copy_ns` was first measured, 7.5 us on the H200) fill the
stream's queue, and then the host waits for the device to run them: what
that loop times is the device's time per small copy, not the host's cost
to queue one. So: the host's time to queue a copy on a stream with room
(`copy_ns`: batches of 32, each run to the end before the next is timed),
the device's time per 4 KiB copy (events around 2,000 of them: reported,
not priced), and the bandwidth of one 256 MiB copy (`copy_bytes_per_us`).
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
    cuda.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    cuda.cuEventSynchronize.argtypes = [ctypes.c_void_p]
    cuda.cuEventElapsedTime.argtypes = [
        ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p]
    stream = ctypes.c_void_p()
    check(cuda.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
    big = 256 << 20
    a, b = u64(), u64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(a), big), "alloc")
    check(cuda.cuMemAlloc_v2(ctypes.byref(b), big), "alloc")

    def small_copy():
        check(cuda.cuMemcpyDtoDAsync_v2(b.value, a.value, 4096, stream), "copy")

    for _ in range(100):  # warm up
        small_copy()
    check(cuda.cuStreamSynchronize(stream), "sync")

    # The host's cost to queue one, the stream never full.
    batch, batches = 32, N // 32
    queued = []
    for _ in range(batches):
        start = time.perf_counter_ns()
        for _ in range(batch):
            small_copy()
        queued.append((time.perf_counter_ns() - start) / batch)
        check(cuda.cuStreamSynchronize(stream), "sync")
    queue_ns = sorted(queued)[len(queued) // 2]

    # Back to back, as the first probe measured it: the queue fills.
    start = time.perf_counter_ns()
    for _ in range(N):
        small_copy()
    back_to_back_ns = (time.perf_counter_ns() - start) / N
    check(cuda.cuStreamSynchronize(stream), "sync")

    # The device's time: events around the same copies.
    begin, end = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuEventCreate(ctypes.byref(begin), 0), "cuEventCreate")
    check(cuda.cuEventCreate(ctypes.byref(end), 0), "cuEventCreate")
    ms = ctypes.c_float()

    def device_ms(work):
        check(cuda.cuEventRecord(begin, stream), "cuEventRecord")
        work()
        check(cuda.cuEventRecord(end, stream), "cuEventRecord")
        check(cuda.cuEventSynchronize(end), "cuEventSynchronize")
        check(cuda.cuEventElapsedTime(ctypes.byref(ms), begin, end), "elapsed")
        return ms.value

    def many_small():
        for _ in range(N):
            small_copy()

    device_small_ns = device_ms(many_small) * 1e6 / N
    # Bandwidth: one large copy, the best of three.
    large = min(device_ms(lambda: check(
        cuda.cuMemcpyDtoDAsync_v2(b.value, a.value, big, stream), "copy")) for _ in range(3))
    bytes_per_us = big / (large * 1000)

    # Ordering one stream after another (what serving a reservation from
    # another stream's room needs, `docs/cross-stream-serving.md`): an
    # event recorded on one stream and waited for on a second.
    # `cuStreamWaitEvent` queues the wait on the GPU; the host's cost to
    # queue it is what is timed, in batches as the copies were.
    cuda.cuStreamWaitEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
    other = ctypes.c_void_p()
    check(cuda.cuStreamCreate(ctypes.byref(other), 1), "cuStreamCreate")
    mark = ctypes.c_void_p()
    check(cuda.cuEventCreate(ctypes.byref(mark), 2), "cuEventCreate")  # no timing
    check(cuda.cuEventRecord(mark, stream), "cuEventRecord")
    for _ in range(100):  # warm up
        check(cuda.cuStreamWaitEvent(other, mark, 0), "cuStreamWaitEvent")
    check(cuda.cuStreamSynchronize(other), "sync")
    waits = []
    for _ in range(batches):
        start = time.perf_counter_ns()
        for _ in range(batch):
            check(cuda.cuStreamWaitEvent(other, mark, 0), "cuStreamWaitEvent")
        waits.append((time.perf_counter_ns() - start) / batch)
        check(cuda.cuStreamSynchronize(other), "sync")
    stream_wait_event_ns = sorted(waits)[len(waits) // 2]
    cuda.cuEventDestroy_v2(mark)
    cuda.cuStreamDestroy_v2(other)

    cuda.cuEventDestroy_v2(begin)
    cuda.cuEventDestroy_v2(end)
    cuda.cuMemFree_v2(a.value)
    cuda.cuMemFree_v2(b.value)
    print(json.dumps({
        "address_reserve_ns": round(reserve),
        "address_free_ns": round(free),
        "copy_ns": round(queue_ns),
        "copy_bytes_per_us": round(bytes_per_us),
    }))
    print(json.dumps({
        "copy_queued_with_room_ns": round(queue_ns),
        "copy_back_to_back_ns": round(back_to_back_ns),
        "copy_4k_on_device_ns": round(device_small_ns),
        "copy_256m_on_device_ms": round(large, 3),
        "stream_wait_event_ns": round(stream_wait_event_ns),
    }), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
