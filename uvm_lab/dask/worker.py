"""The worker's side: a Dask worker plugin that puts uvm_lab under the worker's memory and reports it.

:class:`UvmLab` is what a user registers (``client.register_plugin(UvmLab(...))``). On each worker it picks the
backend (a simulated GPU where asked), builds the resource chain with the options dask-cuda users know
(``managed_memory``, ``pool_size``, ``prefetch``), points CuPy, Numba and torch at it where they are present and
the backend is real, and starts a :class:`Reporter`: every ``interval`` it sends one binary delta
(:mod:`.wire`) to the clients subscribed to :data:`TOPIC`, and a quiet worker one a second, so that its lanes
stay current.

The client reaches a worker only through the fixed functions at the end of this module, run there with
``client.run``: a command is checked by the same parser as the panel's (:func:`~uvm_lab.jupyter.protocol
.parse_command`) and carried out by the same code (:func:`~uvm_lab.jupyter.commands.carry_out`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
from distributed.diagnostics.plugin import WorkerPlugin

from .. import backends, mr
from ..backends.base import gpu_memory
from ..errors import InvalidArgumentError, shown
from ..events import get_bus
from ..jupyter.protocol import ROUTED_COMMANDS
from ..jupyter.timeline import follow
from ..page_states import MAX_GPUS
from ..residency_map import ResidencyMap, residency
from ..units import parse_size
from . import wire

__all__ = ["ALLOCATORS", "TOPIC", "Reporter", "UvmLab"]

#: The Dask event topic the deltas travel on (``worker.log_event`` to ``client.subscribe_topic``).
TOPIC: Final = "uvm_lab"
#: The libraries whose allocations the plugin can route through uvm_lab.
ALLOCATORS: Final = ("cupy", "numba", "torch")
#: Seconds between two deltas of a worker where nothing happened.
QUIET_INTERVAL: Final = 1.0
#: The least and most seconds between two deltas.
INTERVAL_LIMITS: Final = (0.01, 10.0)


class UvmLab(WorkerPlugin):
    """A Dask worker plugin: uvm_lab's resource chain on every worker, and its events streamed to the client.

    Parameters
    ----------
    backend
        ``"sim"`` for simulated GPUs, ``"cuda"`` for the worker's own, or None to keep what uvm_lab picks there.
    devices, device_memory, platform
        The simulated GPUs of each worker (``backend="sim"`` only), as :func:`uvm_lab.use_backend` takes them.
    managed_memory, pool_size, maximum_pool_size
        The chain, as dask-cuda's ``rmm_managed_memory``, ``rmm_pool_size`` and ``rmm_maximum_pool_size``.
    prefetch
        Prefetch every allocation to the worker's GPU as it is made (:class:`~uvm_lab.mr.PrefetchResourceAdaptor`).
    allocators
        The libraries to point at the chain, of :data:`ALLOCATORS`, where each is installed and the backend is
        real. None: every one that is.
    cupti
        On a real GPU, stream the driver's migrations (and CPU faults) from CUPTI's unified-memory counters
        (:class:`~uvm_lab.tracing.CuptiCollector`; needs ``cupti-python``). The simulator makes its own.
    interval
        Seconds between two deltas while events come.
    """

    name = "uvm_lab"
    idempotent = False

    def __init__(self, *, backend: str | None = None, devices: int | None = None,
                 device_memory: int | str | None = None, platform: str | None = None, managed_memory: bool = True,
                 pool_size: int | str | None = None, maximum_pool_size: int | str | None = None, prefetch: bool = False,
                 allocators: Sequence[str] | None = None, cupti: bool = False, interval: float = 0.25) -> None:
        if backend not in (None, "sim", "cuda"):
            raise InvalidArgumentError(f"backend must be 'sim', 'cuda' or None, got {shown(backend)}", value=backend,
                                       expected="'sim', 'cuda' or None")
        simulated = {"devices": devices, "device_memory": device_memory, "platform": platform}
        if backend != "sim" and (given := [k for k, v in simulated.items() if v is not None]):
            raise InvalidArgumentError(f"{', '.join(given)} describe simulated GPUs: pass backend='sim' as well",
                                       value=given, expected="backend='sim'")
        for flag, value in (("managed_memory", managed_memory), ("prefetch", prefetch), ("cupti", cupti)):
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"{flag} must be True or False, got {shown(value)}", value=value,
                                           expected="True or False")
        for size in (pool_size, maximum_pool_size):
            if size is not None:
                parse_size(size)   # a bad size is the caller's error now, not each worker's later
        if maximum_pool_size is not None and pool_size is None:
            raise InvalidArgumentError("maximum_pool_size sizes a pool: give pool_size as well",
                                       value=maximum_pool_size, expected="pool_size")
        if allocators is not None and (isinstance(allocators, str) or not isinstance(allocators, Sequence)
                                       or any(a not in ALLOCATORS for a in allocators)):
            raise InvalidArgumentError(f"allocators must be a list of {', '.join(ALLOCATORS)}, got {shown(allocators)}",
                                       value=allocators, expected=f"a list of {', '.join(ALLOCATORS)}, or None")
        low, high = INTERVAL_LIMITS
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not low <= interval <= high:
            raise InvalidArgumentError(f"interval must be from {low} to {high} seconds, got {shown(interval)}",
                                       value=interval, expected=f"a number of seconds from {low} to {high}")
        self.backend = backend
        self.simulated = {k: v for k, v in simulated.items() if v is not None}
        self.managed_memory, self.prefetch, self.cupti = managed_memory, prefetch, cupti
        self.pool_size, self.maximum_pool_size = pool_size, maximum_pool_size
        self.allocators = tuple(ALLOCATORS if allocators is None else allocators)
        self.interval = float(interval)
        self.reporter: Reporter | None = None
        self.collector: Any = None

    def __repr__(self) -> str:
        options = {"backend": self.backend, **self.simulated, "managed_memory": self.managed_memory,
                   "pool_size": self.pool_size, "prefetch": self.prefetch}
        return f"UvmLab({', '.join(f'{k}={v!r}' for k, v in options.items() if v is not None)})"

    # -- WorkerPlugin ---------------------------------------------------------------------------------------

    def setup(self, worker: Any) -> None:
        if self.backend is not None:
            backends.use_backend(self.backend, **self.simulated)  # type: ignore[arg-type]
        pool = self.pool_size is not None
        mr.reinitialize(managed_memory=self.managed_memory, pool_allocator=pool, initial_pool_size=self.pool_size,
                        maximum_pool_size=self.maximum_pool_size)
        if self.prefetch:
            mr.set_current_device_resource(mr.PrefetchResourceAdaptor(mr.get_current_device_resource()))
        routed = _route_allocators(self.allocators)
        if self.cupti and not backends.get_backend().is_simulated:
            from ..tracing import CuptiCollector

            self.collector = CuptiCollector(cpu_faults=True, required=True).start()   # after the chain: a context
            routed["cupti"] = "streaming"
        self.reporter = Reporter(worker.log_event, address=worker.address, name=str(worker.name),
                                 interval=self.interval, routed=routed)

    def teardown(self, worker: Any) -> None:
        if self.collector is not None:
            self.collector.stop()
            self.collector = None
        if self.reporter is not None:
            self.reporter.close()
            self.reporter = None


def _route_allocators(wanted: Sequence[str]) -> dict[str, str]:
    """Point each of ``wanted`` that is installed at the current resource; say what was done with each."""
    done: dict[str, str] = {}
    if backends.get_backend().is_simulated:
        return dict.fromkeys(wanted, "not routed: the simulator's addresses are not memory")
    for library in wanted:
        try:
            if library == "cupy":
                import cupy

                from ..allocators.cupy import uvm_lab_cupy_allocator
                cupy.cuda.set_allocator(uvm_lab_cupy_allocator)
            elif library == "numba":
                from numba import cuda

                from ..allocators.numba import UvmLabNumbaManager
                cuda.set_memory_manager(UvmLabNumbaManager)
            else:
                import torch

                from ..allocators.torch import torch_allocator
                torch.cuda.memory.change_current_allocator(torch_allocator())
            done[library] = "routed"
        except ImportError:
            done[library] = "not installed"
        except Exception as err:   # installed but refused (torch after its first CUDA tensor): said, not fatal
            done[library] = f"not routed: {type(err).__name__}: {err}"
    return done


class Reporter:
    """Counts what uvm_lab publishes on this worker and sends it as a delta every ``interval`` seconds.

    ``send(topic, message)`` is the worker's ``log_event``: thread-safe, and batched by the worker's stream to
    the scheduler, which passes it to every client subscribed to the topic. Its timeline window (seeded with the
    bus's history) is what a client's timeline query reads.
    """

    def __init__(self, send: Any, *, address: str, name: str, interval: float, routed: dict[str, str] | None = None,
                 start: bool = True) -> None:
        from ..jupyter.dashboard.collect import LiveAllocations
        from ..jupyter.timeline import DeviceSeries, EventWindow

        self._send, self.address, self.interval = send, address, interval
        self._lock = threading.Lock()
        # Its own series, closed at every delta, so that a delta's counts and its pages are of the same moment; and
        # its own window, which a client's timeline query reads.
        self._window, self._series = EventWindow(), DeviceSeries(capacity=64, interval=0.0)
        self._live = LiveAllocations()
        self._pages: dict[int, tuple[dict[str, Any], np.ndarray]] = {}   # by buffer: its description, its pages
        self._held = np.zeros(0, dtype=np.int64)   # pages per processor, summed over _pages: host, gpu 0, 1, ...
        self._events = 0
        self._oldest_ms = 0.0
        self._seq = 0
        self._next_sample = 0
        self._last_sent = -float("inf")
        self._stop = threading.Event()
        self._subscription = follow(get_bus(), self._window, self._count, "uvm_lab.dask reporter")
        backend = backends.get_backend()
        self._send(TOPIC, {"worker": address, "joined": {
            "name": name, "pid": os.getpid(), "backend": str(backend.name), "gpus": int(backend.device_count()),
            "routed": routed or {}}})
        self._thread = threading.Thread(target=self._run, name="uvm_lab.dask reporter", daemon=True)
        if start:
            self._thread.start()

    def _count(self, records: np.ndarray) -> None:
        # In the publisher's thread (inline): queue for the window and the series, count, and once an interval
        # read the clock; a thread woken for it would cost more.
        self._window.feed(records)
        self._series.feed(records)
        with self._lock:
            if not self._events:
                self._oldest_ms = time.time() * 1000
            self._events += len(records)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.report()

    def report(self, *, force: bool = False) -> bool:
        """Send what changed since the last delta (on a quiet worker, once every ``QUIET_INTERVAL`` only).
        Returns whether a delta went."""
        get_bus().flush(wait=True)   # what was published before now is counted in this delta
        with self._lock:
            events, oldest, self._events, self._oldest_ms = self._events, self._oldest_ms, 0, 0.0
        now = time.monotonic()
        if not events and not force and now - self._last_sent < QUIET_INTERVAL:
            return False
        backend = backends.get_backend()
        gpus = backend.device_count()
        memory = gpu_memory(backend)
        # Pages first, then the counts: a move made between the two is counted in this delta and seen in the pages
        # of the next, never seen in the pages before the bytes that made it are counted.
        held = self._refresh_pages()
        self._series.close_interval(backend.now_ns(), [total - free for free, total in memory],
                                    [total for _, total in memory], self._live.managed_bytes)
        samples, self._next_sample = self._series.since(self._next_sample)
        rows = np.zeros(gpus, dtype=wire.ROW)
        rows["total"] = [total for _, total in memory]
        rows["used"] = [total - free for free, total in memory]
        for sample in samples:   # one: the series closes at every delta
            for field in ("htod_bytes", "dtoh_bytes", "dtod_bytes", "gpu_faults", "evicted_bytes"):
                rows[field] += np.asarray(sample[field][:gpus], dtype=np.uint64)   # type: ignore[literal-required]
        named = min(gpus, MAX_GPUS)   # a page state names MAX_GPUS GPUs; copies past them read as unknown
        rows["pages"][:named] = held[1:1 + named]
        self._seq += 1
        header = {"seq": self._seq, "time_ns": backend.now_ns(), "wall_ms": time.time() * 1000, "oldest_ms": oldest,
                  "events": events, "cpu_faults": sum(int(s["cpu_faults"]) for s in samples),
                  "allocated": self._live.managed_bytes, "buffers": len(self._live.described),
                  "host_pages": int(held[0]), "unknown_pages": int(held[-1]),
                  "dropped": self._subscription.dropped}
        self._send(TOPIC, {"worker": self.address, "delta": wire.encode(header, rows)})
        self._last_sent = now
        return True

    def _refresh_pages(self) -> np.ndarray:
        """Pages per processor over the live buffers (host, each GPU, then unknown), kept by what changed."""
        self._live.refresh()
        if not len(self._held):
            self._held = np.zeros(MAX_GPUS + 2, dtype=np.int64)
        described = self._live.described
        for alloc_id in [i for i in self._pages if i not in described]:
            self._held -= self._pages.pop(alloc_id)[1]
        for alloc_id, plain in described.items():
            known = self._pages.get(alloc_id)
            if known is not None and known[0] is plain:
                continue   # the same description: its pages did not change
            pages = _held_pages(plain)
            if known is not None:
                self._held -= known[1]
            self._pages[alloc_id] = (plain, pages)
            self._held += pages
        return self._held

    def close(self) -> None:
        """Send a last delta, say the worker leaves, and let go of what was taken."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            self.report(force=True)
            self._send(TOPIC, {"worker": self.address, "left": True})
        finally:
            self._subscription.close()

    @property
    def window(self) -> Any:
        return self._window


def _held_pages(plain: dict[str, Any]) -> np.ndarray:
    """One buffer's pages per processor: the host, each GPU (:meth:`ResidencyMap.copies`), then unknown."""
    where = ResidencyMap(plain["address"], plain["size"], plain["states"], plain["page_size"])
    copies = where.copies()
    return np.array([copies.get("host", 0), *(copies.get(f"gpu:{d}", 0) for d in range(MAX_GPUS)),
                     where.counts()["unknown"]], dtype=np.int64)


# -- what a client may run on a worker (client.run): fixed functions, each checking what it is given ----------------

#: The commands a client may route to a worker: those that act on one of its buffers (the protocol's list).
ROUTED: Final = ROUTED_COMMANDS


def run_command(command: object) -> None:
    """Check ``command`` as the panel does (one of :data:`ROUTED`) and carry it out on this worker.

    Raises
    ------
    ProtocolError
        ``command`` is not a valid command, or not one a worker carries out.
    UvmLabError
        Whatever the entry point raises for it (a freed buffer, a GPU that is not there).
    """
    from ..errors import ProtocolError
    from ..jupyter.commands import change_buffer
    from ..jupyter.protocol import parse_command

    parsed = parse_command(command)
    if parsed["type"] not in ROUTED:
        raise ProtocolError(f"a worker carries out {' and '.join(ROUTED)}, not {parsed['type']}", command=command)
    change_buffer(parsed)  # type: ignore[arg-type]


def answer_timeline(query: object, dask_worker: Any = None) -> tuple[dict[str, Any], list[bytes]]:
    """This worker's answer to a timeline query (checked as the panel's): the rows, and one buffer a column.

    Raises
    ------
    ProtocolError
        ``query`` is not a valid ``timeline`` command.
    InvalidStateError
        uvm_lab's plugin is not on this worker.
    """
    from ..errors import InvalidStateError, ProtocolError
    from ..jupyter.commands import answer_timeline as answer
    from ..jupyter.protocol import parse_command

    parsed = parse_command(query)
    if parsed["type"] != "timeline":
        raise ProtocolError(f"expected a timeline query, got {parsed['type']}", command=query)
    reporter = _reporter(dask_worker)
    if reporter is None:
        raise InvalidStateError("uvm_lab's plugin is not on this worker: register uvm_lab.dask.UvmLab first")
    get_bus().flush(wait=True)
    rows, columns = answer(reporter.window, parsed)  # type: ignore[arg-type]
    return dict(rows), [np.ascontiguousarray(c).tobytes() for c in columns]


def describe_buffers(limit: int = 1000) -> list[dict[str, Any]]:
    """This worker's live buffers, oldest first (at most ``limit``): id, label, size, managed, and pages per place."""
    from ..buffer import live_buffers

    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgumentError(f"limit must be a whole number >= 1, got {shown(limit)}", value=limit,
                                   expected="an int >= 1")
    out = []
    for buf in live_buffers()[:limit]:
        where = residency(buf)
        out.append({"id": int(buf.id), "label": str(buf.label or ""), "size": int(buf.size),
                    "is_managed": bool(buf.is_managed), "copies": where.copies(),
                    "unknown": where.counts()["unknown"]})
    return out


def _reporter(worker: Any) -> Reporter | None:
    plugin = getattr(worker, "plugins", {}).get(UvmLab.name)
    return getattr(plugin, "reporter", None)
