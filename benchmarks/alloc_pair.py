"""Allocation speed from Python: alloc+free pairs, random sizes 256 B to 8 MiB, 64 live at a time.

Peers measured in the same run, same size sequence: RMM's PoolMemoryResource.allocate/deallocate,
CuPy's MemoryPool, and raw cudaMallocAsync/cudaFreeAsync through cuda.bindings. uvm_lab's pool is
measured plain, under a StatisticsResourceAdaptor, while a trace records every event, and with the capture of
each event's source line turned off (what the capture costs a pair).

    python benchmarks/alloc_pair.py [--ops 200000] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvm_lab as ul

LIVE = 64


def workload(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    sizes = [rng.randint(256, 8 << 20) for _ in range(n)]
    victims = [rng.randrange(LIVE + 1) for _ in range(n)]
    return sizes, victims


def run(alloc: Callable[[int], int], free: Callable[[int, int], None], sizes: list[int], victims: list[int]) -> float:
    """Seconds per alloc+free pair through RMM's interface: ``allocate(nbytes)``, ``deallocate(ptr, nbytes)``.

    The loop is what a user writes: it keeps each pointer with its size, which ``deallocate`` needs.
    """
    live: list[tuple[int, int]] = []
    gc.disable()
    try:
        start = time.perf_counter()
        for size, victim in zip(sizes, victims, strict=True):
            live.append((alloc(size), size))
            if len(live) > LIVE:
                free(*live.pop(victim))
        elapsed = time.perf_counter() - start
    finally:
        for ptr, size in live:
            free(ptr, size)
        gc.enable()
    return elapsed / len(sizes)


def run_owned(malloc: Callable[[int], object], sizes: list[int], victims: list[int]) -> float:
    """Seconds per alloc+free pair where dropping the last reference frees (CuPy's ``MemoryPointer``)."""
    live: list[object] = []
    gc.disable()
    try:
        start = time.perf_counter()
        for size, victim in zip(sizes, victims, strict=True):
            live.append(malloc(size))
            if len(live) > LIVE:
                live.pop(victim)
        elapsed = time.perf_counter() - start
    finally:
        live.clear()
        gc.enable()
    return elapsed / len(sizes)


def _nothing(ptr: int, size: int) -> None:
    pass


def best_of(repeats: int, fn: Callable[[], float]) -> tuple[float, float]:
    times = [fn() for _ in range(repeats)]
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes, victims = workload(args.ops)
    results: dict[str, tuple[float, float]] = {}

    backend = ul.use_backend("auto")
    print(f"backend: {backend!r}")

    def uvm(mr: ul.mr.MemoryResource) -> Callable[[], float]:
        return lambda: run(mr.allocate, mr.deallocate, sizes, victims)

    # The loop alone, with calls that do nothing: what every row below pays before any allocator works.
    results["harness alone (no allocator)"] = best_of(args.repeats, lambda: run(int, _nothing, sizes, victims))

    pool = ul.mr.PoolMemoryResource(ul.mr.CudaMemoryResource(), initial_pool_size="1GiB")
    results["uvm_lab PoolMemoryResource"] = best_of(args.repeats, uvm(pool))
    stats = ul.mr.StatisticsResourceAdaptor(pool)
    results["uvm_lab pool + statistics"] = best_of(args.repeats, uvm(stats))
    with ul.record():
        results["uvm_lab pool, recording events"] = best_of(args.repeats, uvm(pool))
    from uvm_lab.events import sources
    sources.set_capturing(False)
    try:
        results["uvm_lab pool, source lines off"] = best_of(args.repeats, uvm(pool))
    finally:
        sources.set_capturing(True)
    # Once more with lines on, right after: the machine's drift shows in the gap between the two "on" rows.
    results["uvm_lab PoolMemoryResource, again"] = best_of(args.repeats, uvm(pool))
    # As installed where no C compiler was found: every call in Python, on the Python free list.
    from uvm_lab.mr import bestfit
    from uvm_lab.mr import pool as pool_module
    compiled, pool_module.BestFit = pool_module.BestFit, bestfit.PyBestFit
    try:
        pure = ul.mr.PoolMemoryResource(ul.mr.CudaMemoryResource(), initial_pool_size="1GiB")
    finally:
        pool_module.BestFit = compiled
    results["uvm_lab pool, built without a C compiler"] = best_of(args.repeats, uvm(pure))
    del pure

    try:
        import rmm

        rpool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 30)
        results["RMM PoolMemoryResource"] = best_of(args.repeats, lambda: run(rpool.allocate, rpool.deallocate,
                                                                              sizes, victims))
    except ImportError as exc:
        print(f"RMM not measured: {exc}")
    try:
        import cupy

        cpool = cupy.cuda.MemoryPool()
        results["CuPy MemoryPool"] = best_of(args.repeats, lambda: run_owned(cpool.malloc, sizes, victims))
    except ImportError as exc:
        print(f"CuPy not measured: {exc}")
    if not backend.is_simulated:
        from cuda.bindings import runtime as cudart

        def malloc_async(n: int) -> int:
            return cudart.cudaMallocAsync(n, 0)[1]

        def free_async(p: int, n: int) -> None:
            cudart.cudaFreeAsync(p, 0)

        results["cudaMallocAsync/cudaFreeAsync"] = best_of(args.repeats, lambda: run(malloc_async, free_async,
                                                                                      sizes, victims))
        cudart.cudaDeviceSynchronize()

    rmm_best = results.get("RMM PoolMemoryResource", (None,))[0]
    cupy_best = results.get("CuPy MemoryPool", (None,))[0]
    print(f"\n{'allocator':40} {'best us/pair':>13} {'median':>8} {'vs RMM pool':>12} {'vs CuPy pool':>13}")
    for name, (best, median) in results.items():
        vs_rmm = f"{best / rmm_best:.2f}x" if rmm_best else "-"
        vs_cupy = f"{best / cupy_best:.2f}x" if cupy_best else "-"
        print(f"{name:40} {best * 1e6:13.2f} {median * 1e6:8.2f} {vs_rmm:>12} {vs_cupy:>13}")
    on = min(results["uvm_lab PoolMemoryResource"][0], results["uvm_lab PoolMemoryResource, again"][0])
    off = results["uvm_lab pool, source lines off"][0]
    print(f"\ncapturing each event's source line: {(on - off) * 1e9:+.0f} ns a pair, "
          f"{on / off:.3f}x the pool without it")
    if args.json:
        args.json.write_text(json.dumps({k: {"best_us": v[0] * 1e6, "median_us": v[1] * 1e6}
                                         for k, v in results.items()}, indent=2))


if __name__ == "__main__":
    main()
