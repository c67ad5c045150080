"""Run a workload on the simulated device, under a memory policy, and say what each phase cost."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from ..backends.sim import SimBackend
from ..backends.sim.platform import Platform
from ..errors import InvalidArgumentError
from ..events.bus import EventBus
from ..events.schema import Advice, EventKind, MemoryKind, MigrationCause
from ..location import Location
from ..units import PAGE_SIZE, parse_size
from .patterns import CHUNK, Chunk, phase_stream, stream_shape
from .spec import Phase, Workload

__all__ = ["ADVICE_POLICIES", "POLICIES", "MigrationCounter", "Moved", "PhaseResult", "parse_policy", "run_sim",
           "swept_bytes"]

#: How data reaches the GPU: fault it in (no advice); prefetch it chunk by chunk ahead of the kernel;
#: ReadMostly (reads duplicate, writes collapse); or leave it on the host (PreferredLocation=host) with the
#: GPU mapped to it (AccessedBy=GPU), read over the link. The prefetch strategy and an advice also go together,
#: joined by "+": "prefetch+read_mostly", "prefetch+remote" (:func:`parse_policy`).
POLICIES = ("faults", "prefetch", "read_mostly", "remote")
#: The advice a policy may set.
ADVICE_POLICIES = ("read_mostly", "remote")


def parse_policy(policy: object) -> tuple[bool, str | None]:
    """A policy as its two parts: whether it prefetches, and the advice it sets (None: none).

    Raises
    ------
    InvalidArgumentError
        For anything but one of :data:`POLICIES`, or "prefetch" and one advice joined by "+".
    """
    valid = f"{', '.join(POLICIES)}, or prefetch+read_mostly, prefetch+remote"
    parts = policy.split("+") if isinstance(policy, str) else []
    advice = [p for p in parts if p in ADVICE_POLICIES]
    if not parts or len(set(parts)) != len(parts) or len(advice) > 1 or len(parts) > 2 \
            or any(p not in POLICIES for p in parts) or ("faults" in parts and len(parts) > 1) \
            or (len(parts) == 2 and "prefetch" not in parts):
        raise InvalidArgumentError(f"policy must be one of {valid}, got {policy!r}", value=policy, expected=valid)
    return "prefetch" in parts, advice[0] if advice else None


@dataclass(frozen=True)
class PhaseResult:
    """What one pass of one phase cost on the simulator (or the GPU)."""

    phase: str
    pass_index: int
    seconds: float
    bytes: int | None        #: bytes of the buffers the pass sweeps (its working set); None where nothing measured it
    faults: int | None
    bytes_htod: int | None   #: bytes migrated to the GPU in the pass, prefetches included
    bytes_dtoh: int | None   #: bytes migrated to the host in the pass, evictions included
    bytes_remote: int | None
    #: records published in the pass, by CUPTI counter name (``htod``, ``dtoh``, ``gpu_faults``, ``cpu_faults``):
    #: the simulator's, or on a GPU what CUPTI delivered for the counters its collector enabled
    records: dict[str, int] | None = None
    #: bytes the pass moved to the host to make room on the GPU (of ``bytes_dtoh``)
    bytes_evicted: int | None = None

    @property
    def gb_per_s(self) -> float:
        """Working-set bytes per second, as the H200 measurements report a pass."""
        if self.bytes is None:
            return float("nan")
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


def _passes(phase: Phase) -> list[Phase]:
    """A multi-pass phase as one phase per pass, so that each pass is timed on its own."""
    n = int(phase.param("passes", 1))
    return [replace(phase, params={**phase.params, "passes": 1}) for _ in range(n)]


@dataclass(frozen=True)
class Moved:
    """What a :class:`MigrationCounter` counted since it was last taken."""

    htod: int      #: bytes migrated to the GPU
    dtoh: int      #: bytes migrated to the host, evictions included
    evicted: int   #: bytes migrated to the host to make room on the GPU (cause EVICTION)
    faults: int    #: page faults, the GPU's and the CPU's (a record may stand for several)
    records: dict[str, int]   #: records of each kind, by CUPTI counter name


class MigrationCounter:
    """Bytes of the HtoD and DtoH records published on a bus, and records of each counted kind, as they arrive.

    Both sides count the same way: the simulator's records, or CUPTI's on a GPU.
    """

    #: The kinds counted, by the name CUPTI's collector gives their counter.
    KINDS: ClassVar[dict[str, EventKind]] = {"htod": EventKind.HTOD, "dtoh": EventKind.DTOH,
                                             "gpu_faults": EventKind.GPU_PAGE_FAULT,
                                             "cpu_faults": EventKind.CPU_PAGE_FAULT}

    def __init__(self, bus: EventBus) -> None:
        self.htod = self.dtoh = self.evicted = self.faults = 0
        self.records = dict.fromkeys(self.KINDS, 0)
        self.bus = bus
        self._sub = bus.subscribe(self._add, kinds=tuple(self.KINDS.values()))

    def _add(self, records: np.ndarray) -> None:
        kind = records["kind"]
        counts = np.bincount(kind, minlength=256)
        for name, k in self.KINDS.items():
            self.records[name] += int(counts[k])
        nbytes = records["bytes"].astype(np.int64)
        dtoh = kind == EventKind.DTOH
        self.htod += int(nbytes[kind == EventKind.HTOD].sum())
        self.dtoh += int(nbytes[dtoh].sum())
        self.evicted += int(nbytes[dtoh & (records["flags"] == MigrationCause.EVICTION)].sum())
        faults = (kind == EventKind.GPU_PAGE_FAULT) | (kind == EventKind.CPU_PAGE_FAULT)
        self.faults += int(records["value"][faults].astype(np.int64).sum())

    def take(self) -> Moved:
        """What was counted since the last call."""
        self.bus.flush(wait=False)
        self._sub.drain()
        out = Moved(self.htod, self.dtoh, self.evicted, self.faults, self.records)
        self.htod = self.dtoh = self.evicted = self.faults = 0
        self.records = dict.fromkeys(self.KINDS, 0)
        return out

    def close(self) -> None:
        self.bus.unsubscribe(self._sub)


def _batched(chunks: Iterator[Chunk], ptrs: dict[str, int]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Chunks of (possibly several) buffers as address arrays of up to ``CHUNK`` accesses, with write flags."""
    parts: list[Chunk] = []
    n = 0
    for c in chunks:
        parts.append(c)
        n += len(c.offsets)
        if n >= CHUNK:
            yield _joined(parts, ptrs)
            parts, n = [], 0
    if parts:
        yield _joined(parts, ptrs)


def _joined(parts: list[Chunk], ptrs: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Chunks as one address array and one write-flag array (a stencil yields thousands of short chunks)."""
    lengths = [len(c.offsets) for c in parts]
    addrs = np.concatenate([c.offsets for c in parts], dtype=np.uint64, casting="unsafe")
    addrs += np.repeat(np.array([ptrs[c.buffer] for c in parts], dtype=np.uint64), lengths)
    if all(isinstance(c.write, (bool, np.bool_)) for c in parts):
        writes = np.repeat(np.array([c.write for c in parts], dtype=bool), lengths)
    else:
        writes = np.concatenate([np.broadcast_to(np.asarray(c.write, dtype=bool), c.offsets.shape) for c in parts])
    return addrs, writes


def run_sim(workload: Workload, backend: SimBackend | None = None, *, policy: str = "faults",
            prefetch_chunk: int | str = "256MiB", device_memory: int | str | None = None,
            platform: str | Platform = "x86-pcie5", initial: str = "host") -> list[PhaseResult]:
    """Run ``workload`` on a simulated device and return one result per pass of each phase.

    Parameters
    ----------
    workload
        What to run.
    backend
        A :class:`SimBackend` to run on; by default a new one with ``device_memory`` on ``platform``
        publishing to a private bus (so that long runs do not fill the process's history).
    policy
        One of :data:`POLICIES`, or "prefetch" and an advice joined by "+" (:func:`parse_policy`).
    prefetch_chunk
        The chunk the ``"prefetch"`` policy moves ahead of each part of a kernel.
    platform
        A profile name or a :class:`~uvm_lab.backends.sim.platform.Platform` (say, one with fitted costs).
    initial
        Where the buffers' pages start: ``"host"`` (written by the host, as the published measurements
        start) or ``"nowhere"`` (never touched).

    Raises
    ------
    InvalidArgumentError
        For an unknown policy or initial placement, or a non-simulated backend.
    """
    prefetching, advice = parse_policy(policy)
    if initial not in ("host", "nowhere"):
        raise InvalidArgumentError(f"initial must be 'host' or 'nowhere', got {initial!r}", value=initial,
                                   expected="host, nowhere")
    chunk = parse_size(prefetch_chunk, name="prefetch_chunk", allow_zero=False)
    if backend is None:
        backend = SimBackend(device_memory=device_memory if device_memory is not None else "16GiB",
                             platform=platform, bus=EventBus())
    elif not isinstance(backend, SimBackend):
        raise InvalidArgumentError(f"run_sim needs a SimBackend, got {type(backend).__name__}", value=backend,
                                   expected="uvm_lab.backends.sim.SimBackend")
    gpu, host = Location.device(0), Location.host()
    ptrs = {name: backend.allocate(size, MemoryKind.MANAGED) for name, size in workload.buffers.items()}
    counter = None
    try:
        for name, ptr in ptrs.items():
            if initial == "host":
                backend.prefetch(ptr, workload.buffers[name], host)
            _advise(backend, ptr, workload.buffers[name], advice, gpu)
        counter = MigrationCounter(backend.bus)
        results = []
        for phase in workload.phases:
            for i, one in enumerate(_passes(phase)):
                counter.take()
                results.append(_run_pass(backend, workload, one, i, ptrs, prefetching, chunk, counter))
        return results
    finally:
        if counter is not None:
            counter.close()
        for ptr in ptrs.values():
            backend.free(ptr)


def _advise(backend: Any, ptr: int, size: int, advice: str | None, gpu: Location) -> None:
    """The advice of a policy (:func:`parse_policy`) set on a buffer (the same calls on either backend)."""
    if advice == "read_mostly":
        backend.advise(ptr, size, Advice.SET_READ_MOSTLY, None)
    elif advice == "remote":
        backend.advise(ptr, size, Advice.SET_PREFERRED_LOCATION, Location.host())
        backend.advise(ptr, size, Advice.SET_ACCESSED_BY, gpu)


def swept_bytes(workload: Workload, phase: Phase) -> int:
    """The bytes a pass of ``phase`` sweeps: its buffers, or for a gather the bytes its warps read."""
    sizes = workload.buffers
    if phase.pattern == "gather":
        return int(phase.param("count", sizes[phase.buffers[0]] // PAGE_SIZE)) * int(
            phase.param("bytes_per_access", 128))
    return sum(sizes[b] for b in dict.fromkeys(phase.buffers))


def pass_steps(workload: Workload, phase: Phase, ptrs: dict[str, int], prefetching: bool, chunk: int
               ) -> Iterator[tuple[str, Any, Any, Any]]:
    """A pass as the simulator runs it: ``("prefetch", ptr, size, None)`` and ``("access", addresses, writes,
    launch)`` steps, in order. ``prefetching`` (a policy's prefetch strategy), a GPU pass moves each chunk of what
    it touches ahead of the part of the kernel that touches it; the kernel is launched once, before its first
    access."""
    launched = False
    sizes = workload.buffers
    prefetched: set[tuple[str, int]] = set()
    step = max(1, chunk // PAGE_SIZE) if prefetching and phase.processor == "gpu" else CHUNK
    for batch, batch_writes in _batched(phase_stream(workload, phase), ptrs):
        for lo in range(0, len(batch), step):
            addrs, writes = batch[lo:lo + step], batch_writes[lo:lo + step]
            if step != CHUNK:
                for name, ptr in ptrs.items():
                    inside = addrs[(addrs >= ptr) & (addrs < ptr + sizes[name])]
                    if not len(inside):
                        continue
                    first, last = (int(inside.min()) - ptr) // chunk, (int(inside.max()) - ptr) // chunk
                    for c in range(first, last + 1):
                        if (name, c) not in prefetched:
                            prefetched.add((name, c))
                            yield "prefetch", ptr + c * chunk, min(chunk, sizes[name] - c * chunk), None
            launch = phase.processor == "gpu" and not launched
            launched = launched or launch
            yield "access", addrs, writes, launch


def _run_pass(backend: SimBackend, workload: Workload, phase: Phase, index: int, ptrs: dict[str, int],
              prefetching: bool, chunk: int, counter: MigrationCounter) -> PhaseResult:
    where = Location.host() if phase.processor == "host" else Location.device(0)
    shape = stream_shape(phase)
    start = backend.now_ns()
    faults = remote = 0
    for what, a, b, launch in pass_steps(workload, phase, ptrs, prefetching, chunk):
        if what == "prefetch":
            backend.prefetch(a, b, where)
        else:
            r = backend.access_stream(a, where, b, launch=launch, **shape)
            faults += r.faults or 0
            remote += r.bytes_remote or 0
    moved = counter.take()
    return PhaseResult(phase.pattern, index, (backend.now_ns() - start) / 1e9, swept_bytes(workload, phase), faults,
                       moved.htod, moved.dtoh, remote, moved.records, moved.evicted)
