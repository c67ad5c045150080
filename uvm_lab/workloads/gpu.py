"""Run a workload as real CuPy kernels on managed memory (needs CuPy and an NVIDIA GPU).

Each phase pattern has one kernel, reading (or writing) exactly the bytes the simulator's access stream
says it touches, in the same order as far as a GPU has an order (grid-stride for sweeps, one warp per
128 B read for gathers, whose offsets come from the same seeded stream as the simulator's). A pass is
timed as wall time between two device synchronizations. Managed allocations that would not fit in free
device memory are refused: this side never oversubscribes a real GPU (the simulator is the place for that).
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np

from ..errors import BackendError, InvalidArgumentError, OutOfMemoryError
from ..events.accesses import range_record, stream_header, stream_runs
from ..events.bus import get_bus
from ..events.schema import AccessType, MemoryKind
from ..location import HOST_ID, Location
from ..units import PAGE_SIZE, format_bytes
from .patterns import phase_stream, stream_shape
from .sim import MigrationCounter, PhaseResult, _advise, _passes, parse_policy, pass_steps, swept_bytes
from .spec import Phase, Workload

__all__ = ["gpu_available", "run_gpu"]

_KERNELS = r"""
extern "C" __global__ void stream_read(const unsigned int* a, unsigned long long n, unsigned int* sink) {
    unsigned int s = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) s += a[i];
    if (s == 0x9E3779B9u) sink[0] = s;      // keeps the loads without writing in practice
}
extern "C" __global__ void stream_write(unsigned int* a, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) a[i] = (unsigned int)i;
}
extern "C" __global__ void strided_read(const unsigned int* a, unsigned long long count, unsigned long long step,
                                        unsigned int* sink) {
    unsigned int s = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < count;
         i += (unsigned long long)gridDim.x * blockDim.x) s += a[i * step];
    if (s == 0x9E3779B9u) sink[0] = s;
}
extern "C" __global__ void gather_read(const unsigned int* a, const long long* offsets, unsigned long long count,
                                       unsigned int* sink) {
    unsigned long long warp = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) / 32;
    unsigned int lane = threadIdx.x % 32, s = 0;
    unsigned long long warps = (unsigned long long)gridDim.x * blockDim.x / 32;
    for (unsigned long long w = warp; w < count; w += warps) s += a[offsets[w] / 4 + lane];
    if (s == 0x9E3779B9u) sink[0] = s;
}
extern "C" __global__ void stencil3(const unsigned int* in, unsigned int* out, unsigned long long rows,
                                    unsigned long long width) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < rows * width;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long r = i / width, c = i % width;
        unsigned long long up = r ? r - 1 : r, down = r + 1 < rows ? r + 1 : r;
        out[i] = in[up * width + c] + in[i] + in[down * width + c];
    }
}
extern "C" __global__ void tile_fma(const unsigned int* a, const unsigned int* b, unsigned int* c,
                                    unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) c[i] += a[i] * b[i];
}
"""


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one GPU."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:   # no CuPy, no driver, no device: all mean "not here"
        return False


def _host_view(ptr: int, size: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(ptr))


def _cuda_backend(device: int = 0) -> Any:
    from ..backends import _cuda_backend_class
    from ..events.bus import EventBus

    cls = _cuda_backend_class()
    if cls is None:
        raise BackendError("run_gpu needs uvm_lab's CUDA backend (cuda-python and a GPU)")
    return cls(device, bus=EventBus())


#: The most of the GPU's free memory a workload's managed buffers may take by default: real GPUs are never
#: oversubscribed here.
MAX_FRACTION_OF_FREE = 0.9


def run_gpu(workload: Workload, *, policy: str = "faults", prefetch_chunk: int = 256 << 20,
            max_fraction_of_free: float = MAX_FRACTION_OF_FREE, backend: Any = None,
            collector: Any = None) -> list[PhaseResult]:
    """Run ``workload`` on GPU 0 with CuPy and return one result per pass of each phase.

    Buffers start host-written, as :func:`~uvm_lab.workloads.run_sim` starts them by default. Managed
    memory, prefetches and advice go through uvm_lab's CUDA backend (the same calls ``run_sim`` makes on
    the simulator); the kernels are CuPy's. A pass's time is wall time from a synchronized device to a
    synchronized device.

    Parameters
    ----------
    backend
        A CUDA backend; by default a new one publishing to a private bus.
    collector
        A started :class:`~uvm_lab.tracing.CuptiCollector` publishing to ``backend.bus``: each result then
        carries the bytes CUPTI saw migrate in that pass (flushed after every pass) and its records of
        each kind (those of counters the collector did not enable count 0). Without one these fields are None.
        On the process-wide bus, what CUPTI lost is found on the host's page tables after each pass
        (:meth:`~uvm_lab.tracing.CuptiCollector.check_host`) and counted too.

    Raises
    ------
    BackendError
        Without CuPy or a GPU.
    OutOfMemoryError
        When the workload needs more than ``max_fraction_of_free`` of free device memory.
    InvalidArgumentError
        For an unknown policy or a fraction outside (0, 1].
    """
    prefetching, advice = parse_policy(policy)
    if not 0 < max_fraction_of_free <= 1:
        raise InvalidArgumentError(f"max_fraction_of_free must be in (0, 1], got {max_fraction_of_free!r}",
                                   value=max_fraction_of_free, expected="0 < f <= 1")
    if not gpu_available():
        raise BackendError("run_gpu needs CuPy and an NVIDIA GPU; run_sim runs the same workload on the simulator")
    import cupy

    if backend is None:
        backend = _cuda_backend(cupy.cuda.Device().id)
    dev = backend.current_device()
    free, _ = backend.mem_info(dev)
    if workload.total_bytes > max_fraction_of_free * free:
        raise OutOfMemoryError(f"{workload.name} needs {format_bytes(workload.total_bytes)} of managed memory, more "
                               f"than {max_fraction_of_free:.0%} of the {format_bytes(free)} free: real GPUs are "
                               f"never oversubscribed here", size=workload.total_bytes, free=free, limit=free)
    module = cupy.RawModule(code=_KERNELS)
    for name in ("stream_read", "stream_write", "strided_read", "gather_read", "stencil3", "tile_fma"):
        module.get_function(name)   # compiled now, not inside the first timed pass
    sink = cupy.zeros(1, dtype=cupy.uint32)
    ptrs: dict[str, int] = {}
    counter = None
    try:
        for name, size in workload.buffers.items():
            ptrs[name] = backend.allocate(size, MemoryKind.MANAGED)
            if backend.bus.wants_accesses:   # for a recording that replays it (uvm_lab.trace_replay)
                backend.bus.publish(range_record(ptrs[name], size, HOST_ID, AccessType.WRITE,
                                                 start=backend.now_ns()))
            _host_view(ptrs[name], size)[::PAGE_SIZE] = 1     # host-written, page by page
            _advise(backend, ptrs[name], size, advice, Location.device(dev))
        cupy.cuda.runtime.deviceSynchronize()
        if collector is not None:
            collector.flush()
            counter = MigrationCounter(backend.bus)   # from here on: the passes' records only
        results = []
        for phase in workload.phases:
            for i, one in enumerate(_passes(phase)):
                results.append(_run_pass(cupy, module, backend, workload, one, i, ptrs, sink, prefetching,
                                         prefetch_chunk, dev, collector, counter))
        return results
    finally:
        cupy.cuda.runtime.deviceSynchronize()
        if counter is not None:
            counter.close()
        for ptr in ptrs.values():
            backend.free(ptr)


def _accesses(backend: Any, workload: Workload, phase: Phase, ptrs: dict[str, int], prefetching: bool, chunk: int,
              dev: int) -> list[np.ndarray]:
    """The ACCESS records of each part of the pass, as the simulator would publish them running it
    (:func:`~uvm_lab.workloads.sim.pass_steps`, :func:`~uvm_lab.events.accesses.stream_runs`)."""
    processor = HOST_ID if phase.processor == "host" else dev
    shape = stream_shape(phase)
    now = backend.now_ns()
    out = []
    for what, addrs, writes, launch in pass_steps(workload, phase, ptrs, prefetching, chunk):
        if what != "access":
            continue
        pages = addrs & ~np.uint64(PAGE_SIZE - 1)
        header = stream_header(processor, AccessType.WRITE, uniform=False, launch=bool(launch), start=now,
                               warps=None, **shape)
        runs = stream_runs(pages, writes, processor, AccessType.WRITE, uniform=False, alloc_ids=0, start=now)
        out.append(np.concatenate([header, runs]))
    return out


def _array(cupy: Any, ptr: int, size: int, owner: Any = None) -> Any:
    mem = cupy.cuda.UnownedMemory(ptr, size, owner)
    return cupy.ndarray((size // 4,), dtype=cupy.uint32, memptr=cupy.cuda.MemoryPointer(mem, 0))


def _run_pass(cupy: Any, module: Any, backend: Any, workload: Workload, phase: Phase, index: int,
              ptrs: dict[str, int], sink: Any, prefetching: bool, chunk: int, dev: int, collector: Any,
              counter: MigrationCounter | None) -> PhaseResult:
    sizes = workload.buffers
    grid, block = 132 * 8, 256
    first = phase.buffers[0]
    a = _array(cupy, ptrs[first], sizes[first])
    gpu = Location.device(dev)
    offsets = None
    if phase.pattern == "gather":   # the offsets are made before the clock starts (on the device, not managed)
        offsets = cupy.asarray(np.concatenate([c.offsets for c in phase_stream(workload, phase)]))
    # What the pass touches, as the simulator's access streams of the same pass (made before the clock starts),
    # for a recording that replays it: published as the kernels are launched.
    accesses = _accesses(backend, workload, phase, ptrs, prefetching, chunk, dev) if backend.bus.wants_accesses \
        else []
    cupy.cuda.runtime.deviceSynchronize()
    start = time.perf_counter()

    def launching(parts: int | None = None) -> None:
        """Publish the access records of the next ``parts`` parts (None: all that are left)."""
        for _ in range(len(accesses) if parts is None else min(parts, len(accesses))):
            backend.bus.publish(accesses.pop(0))

    def prefetch(name: str) -> None:
        # The simulator's prefetch policy: each chunk of what the kernel touches goes ahead of it.
        if prefetching:
            for lo in range(0, sizes[name], chunk):
                backend.prefetch(ptrs[name] + lo, min(chunk, sizes[name] - lo), gpu)

    if phase.pattern in ("host_write", "host_read"):
        launching()
        view = _host_view(ptrs[first], sizes[first])
        if phase.pattern == "host_write":
            view[::PAGE_SIZE * int(phase.param("every", 1))] = 2
        else:
            int(view[::PAGE_SIZE].sum())
    elif phase.pattern == "stream":
        write = bool(phase.param("write", False))

        def sweep(part, n: int) -> None:
            if write:
                module.get_function("stream_write")((grid,), (block,), (part, np.uint64(n)))
            else:
                module.get_function("stream_read")((grid,), (block,), (part, np.uint64(n), sink))

        if prefetching:
            for lo in range(0, sizes[first], chunk):
                n = min(chunk, sizes[first] - lo)
                backend.prefetch(ptrs[first] + lo, n, gpu)
                launching(1)   # the simulator's part of the pass that this chunk is
                sweep(a[lo // 4:], n // 4)
        else:
            launching()
            sweep(a, a.size)
    elif phase.pattern == "strided":
        prefetch(first)
        step = int(phase.param("stride", 64 << 10)) // 4
        a = a[int(phase.param("offset", 0)) // 4:]
        launching()
        module.get_function("strided_read")((grid,), (block,), (a, np.uint64(-(-a.size // step)), np.uint64(step),
                                                                 sink))
    elif phase.pattern == "gather":
        prefetch(first)
        assert offsets is not None   # made above for every gather
        launching()
        module.get_function("gather_read")((grid,), (block,), (a, offsets, np.uint64(len(offsets)), sink))
    elif phase.pattern == "stencil":
        for name in dict.fromkeys(phase.buffers):
            prefetch(name)
        out = _array(cupy, ptrs[phase.buffers[-1]], sizes[phase.buffers[-1]])
        width = int(phase.param("row_bytes", 1 << 20)) // 4
        rows = min(a.size, out.size) // width
        launching()
        module.get_function("stencil3")((grid,), (block,), (a, out, np.uint64(rows), np.uint64(width)))
    elif phase.pattern == "matmul":
        names = (phase.buffers + phase.buffers[-1:] * 3)[:3]
        for name in dict.fromkeys(names):
            prefetch(name)
        n = int(phase.param("tiles", 4))
        bufs = [_array(cupy, ptrs[b], sizes[b]) for b in names]
        tile = min(x.size for x in bufs) // (n * n) // (PAGE_SIZE // 4) * (PAGE_SIZE // 4)
        launching()
        fma = module.get_function("tile_fma")
        for i in range(n):
            for j in range(n):
                for k in range(n):
                    fma((grid,), (block,), (bufs[0][(i * n + k) * tile:], bufs[1][(k * n + j) * tile:],
                                            bufs[2][(i * n + j) * tile:], np.uint64(tile)))
    cupy.cuda.runtime.deviceSynchronize()
    seconds = time.perf_counter() - start
    if counter is None:
        return PhaseResult(phase.pattern, index, seconds, swept_bytes(workload, phase), None, None, None, None)
    collector.flush()
    if collector.bus is get_bus():
        # What CUPTI lost (it does, silently, with GPU fault capture on), from the host's page tables: the pass's
        # bytes are then what moved. Their maps are the process-wide tracker's, which only that bus feeds.
        collector.check_host()
    moved = counter.take()
    return PhaseResult(phase.pattern, index, seconds, swept_bytes(workload, phase), None, moved.htod, moved.dtoh, None,
                       moved.records, moved.evicted)
