"""Getting 2 GiB of host data in front of a GPU kernel: managed memory with PrefetchResourceAdaptor
against cudaMalloc plus a pinned cudaMemcpy (the peer, measured in the same run with the same kernel).

Each path starts from the same data in pinned host memory and ends when a kernel has read every byte:
- cudaMalloc + cudaMemcpy(pinned -> device) + kernel
- uvm_lab: allocate from PrefetchResourceAdaptor(ManagedMemoryResource()) + copy_from_host(pinned) +
  kernel, with the adaptor prefetching on access (the copy prefetches 64 MiB chunks one ahead of
  itself) and on allocation (RMM's way: the whole fresh allocation is populated on the GPU before the
  copy can start), and with plain managed memory
For context it also times the two ways host-written managed data reaches a kernel: by faults, and by a
prefetch before the kernel. Needs a GPU; managed memory stays far below the card's free memory.

    python benchmarks/prefetch_read.py [--size 2GiB] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

import uvm_lab as ul


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="2GiB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    size = ul.parse_size(args.size)

    backend = ul.use_backend("cuda")
    from cuda.bindings import runtime as cudart

    from uvm_lab.backends.cuda import check

    free, _ = backend.mem_info()
    if 3 * size > free // 2:
        raise SystemExit(f"refusing: {ul.format_bytes(size)} x3 is too close to the {ul.format_bytes(free)} free")
    print(f"{backend!r}: {ul.format_bytes(size)}, {ul.format_bytes(free)} free")

    source = ul.DeviceBuffer(size=size, mr=ul.mr.PinnedHostMemoryResource(), label="pinned source")
    source.host_view()[:] = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    data = source.host_view()

    def kernel_read(ptr: int) -> None:
        backend._gpu_touch(ptr, size, "read", 0)    # the same kernel for every path

    def cuda_malloc_memcpy() -> float:
        start = time.perf_counter()
        ptr = check(cudart.cudaMalloc(size))
        check(cudart.cudaMemcpy(ptr, data.ctypes.data, size, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice))
        kernel_read(ptr)
        elapsed = time.perf_counter() - start
        check(cudart.cudaFree(ptr))
        return elapsed

    on_allocate = ul.mr.PrefetchResourceAdaptor(ul.mr.ManagedMemoryResource())
    on_access = ul.mr.PrefetchResourceAdaptor(ul.mr.ManagedMemoryResource(), on="access")

    def uvm_prefetch_adaptor(mr: ul.mr.MemoryResource) -> float:
        start = time.perf_counter()
        buf = ul.DeviceBuffer(size=size, mr=mr)
        buf.copy_from_host(data)
        kernel_read(buf.ptr)
        elapsed = time.perf_counter() - start
        buf.close()
        return elapsed

    managed = ul.mr.ManagedMemoryResource()
    side = int(check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking)))
    chunk = 64 << 20
    events = [check(cudart.cudaEventCreateWithFlags(cudart.cudaEventDisableTiming)) for _ in range(-(-size // chunk))]
    gpu = cudart.cudaMemLocation()
    gpu.type = cudart.cudaMemLocationType.cudaMemLocationTypeDevice
    gpu.id = 0

    def managed_memcpy_only() -> float:
        # Experiment: no prefetch at all; the copy lands in unpopulated managed memory.
        start = time.perf_counter()
        buf = ul.DeviceBuffer(size=size, mr=managed)
        check(cudart.cudaMemcpy(buf.ptr, data.ctypes.data, size, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice))
        kernel_read(buf.ptr)
        elapsed = time.perf_counter() - start
        buf.close()
        return elapsed

    def managed_pipelined() -> float:
        # Experiment: prefetch 64 MiB chunks on a side stream while the copy of the chunk before runs.
        start = time.perf_counter()
        buf = ul.DeviceBuffer(size=size, mr=managed)
        for i, offset in enumerate(range(0, size, chunk)):
            n = min(chunk, size - offset)
            check(cudart.cudaMemPrefetchAsync(buf.ptr + offset, n, gpu, 0, side))
            check(cudart.cudaEventRecord(events[i], side))
            check(cudart.cudaStreamWaitEvent(0, events[i], 0))
            check(cudart.cudaMemcpyAsync(buf.ptr + offset, data.ctypes.data + offset, n,
                                         cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, 0))
        kernel_read(buf.ptr)
        elapsed = time.perf_counter() - start
        buf.close()
        return elapsed

    def host_written(prefetch: bool) -> float:
        buf = ul.DeviceBuffer(size=size, mr=ul.mr.ManagedMemoryResource())
        buf.host_view()[:] = data                 # the host writes it: every page on the host
        start = time.perf_counter()
        if prefetch:
            buf.prefetch("gpu")
        kernel_read(buf.ptr)
        elapsed = time.perf_counter() - start
        buf.close()
        return elapsed

    paths = {
        "cudaMalloc + pinned cudaMemcpy + kernel": cuda_malloc_memcpy,
        "PrefetchResourceAdaptor(on='access') + copy_from_host + kernel": lambda: uvm_prefetch_adaptor(on_access),
        "PrefetchResourceAdaptor(on='allocate') + copy_from_host + kernel": lambda: uvm_prefetch_adaptor(on_allocate),
        "ManagedMemoryResource + copy_from_host + kernel": lambda: uvm_prefetch_adaptor(managed),
        "experiment: managed + cudaMemcpy, no prefetch": managed_memcpy_only,
        "experiment: managed, 64 MiB prefetch/copy pipeline": managed_pipelined,
        "host-written managed, kernel faults it in": lambda: host_written(False),
        "host-written managed, prefetch + kernel": lambda: host_written(True),
    }
    results = {}
    for name, fn in paths.items():
        fn()                                                   # warm-up: contexts, kernel compile, pools
        times = [fn() for _ in range(args.repeats)]
        results[name] = (min(times), statistics.median(times))
    base = results["cudaMalloc + pinned cudaMemcpy + kernel"][0]
    print(f"\n{'path':66} {'best ms':>8} {'median':>8} {'GB/s':>7} {'vs peer':>8}")
    for name, (best, median) in results.items():
        print(f"{name:66} {best * 1e3:8.1f} {median * 1e3:8.1f} {size / best / 1e9:7.1f} {best / base:7.2f}x")
    if args.json:
        args.json.write_text(json.dumps({k: {"best_ms": v[0] * 1e3, "median_ms": v[1] * 1e3}
                                         for k, v in results.items()}, indent=2))


if __name__ == "__main__":
    main()
