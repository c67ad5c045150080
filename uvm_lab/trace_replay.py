"""Replay: a recorded trace, run again on a fresh simulated GPU, as it was or with other choices.

>>> import uvm_lab as ul
>>> _ = ul.use_backend("sim", device_memory="1GiB")
>>> with ul.record(accesses=True) as trace:
...     buf = ul.DeviceBuffer(size="64MiB")
...     _ = ul.touch(buf, on="host", mode="write")
...     _ = ul.touch(buf, on="gpu")
>>> same = ul.replay(trace, device_memory="1GiB")
>>> same.bytes_htod == trace.summary()["bytes_htod"], same.exact
(True, True)
>>> ul.replay(trace, device_memory="1GiB", prefetch="on_access").gpu_faults
0

What the trace holds decides what a replay can tell:

- **A recording made with** ``accesses=True`` holds what the program touched (ACCESS records): on the simulator,
  every modelled access; on a GPU, those of ``ul.touch`` and of the catalog's runs
  (:func:`uvm_lab.workloads.run_gpu`), whose kernels uvm_lab knows. A replay runs the same calls in the same
  order, so a simulator trace replayed under the configuration it was recorded with moves the same bytes and takes
  the same time, and a GPU trace replays to the GPU's bytes (:attr:`Replayed.exact`: the trace held the accesses,
  which is not to say the GPU's own records were complete).
- **Any other trace** (one recorded without accesses, or kernels of CuPy or torch on a GPU, which say nothing of
  what they touch) holds only faults and migrations. Each fault's range, and each migration an access demanded,
  becomes an access by that processor. Accesses that found their pages in place left no record, so they are not
  replayed: under less memory, what they would have faulted and moved is missing, and the bytes are a lower bound;
  the time is the faults' alone, not the program's. :attr:`Replayed.note` says so.

The changes a replay can make: the device's memory and the platform's profile; the prefetches (those recorded,
none, or one before each GPU access, or one at each allocation); the advice (as recorded, or none) and advice
set on chosen allocations, by the ``alloc_id`` the trace gives them.
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backends.base import AccessMode
from .backends.sim import SimBackend
from .backends.sim.platform import get_platform
from .errors import InvalidArgumentError, shown
from .events.bus import EventBus
from .events.schema import (
    ACCESS_PART,
    ACCESS_RUN,
    ACCESS_STREAM,
    ACCESS_UNIFORM,
    NO_PROCESSOR,
    Advice,
    EventKind,
    MemoryKind,
    MigrationCause,
)
from .events.trace import Trace, record
from .location import HOST_ID, Location
from .units import PAGE_SIZE, format_bytes, parse_size

__all__ = ["PREFETCH_CHOICES", "Replayed", "replay"]

#: What ``prefetch=`` takes: the prefetches recorded; those of them that find a page not yet where they send it
#: (a prefetch of what is all there already is left out); none; the recorded ones and, before every GPU access, its
#: range to that GPU; the recorded ones and, at every allocation, all of it to the GPU (as a
#: ``PrefetchResourceAdaptor`` does).
PREFETCH_CHOICES = ("recorded", "needed", "none", "on_access", "on_allocate")
#: What ``advice=`` takes: the advice recorded, or none of it (advice set with ``set_advice`` is applied either way).
ADVICE_CHOICES = ("recorded", "none")
#: The advice ``set_advice`` may set on an allocation, and how each value reads.
ADVICE_NAMES = ("read_mostly", "preferred_location", "accessed_by")

_MODES: dict[int, AccessMode] = {1: "read", 2: "write", 3: "atomic"}
_FAULTS = (int(EventKind.GPU_PAGE_FAULT), int(EventKind.CPU_PAGE_FAULT))
_MIGRATIONS = (int(EventKind.HTOD), int(EventKind.DTOH))
#: The causes of a migration that an access asked for: to satisfy a fault, or the driver's prefetch around one.
_DEMANDED = (int(MigrationCause.COHERENCE), int(MigrationCause.PREFETCH))


@dataclass(frozen=True)
class Replayed:
    """What a replay measured, counted as :func:`measured` counts a trace."""

    seconds: float
    bytes_htod: int
    bytes_dtoh: int
    bytes_evicted: int
    gpu_faults: int
    cpu_faults: int
    exact: bool    #: the trace held every access (True), or only the faults (a lower bound)
    note: str      #: what the replay could not do, or ""
    trace: Trace | None = None   #: the replay's events, where ``keep_trace`` asked for them

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "bytes_htod": self.bytes_htod, "bytes_dtoh": self.bytes_dtoh,
                "bytes_evicted": self.bytes_evicted, "gpu_faults": self.gpu_faults, "cpu_faults": self.cpu_faults,
                "exact": self.exact, "note": self.note}


class _Tally:
    """The measures of records as they come: the span they cover, bytes each way, evicted bytes, faults."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.last: int | None = None
        self.counts = dict.fromkeys(("bytes_htod", "bytes_dtoh", "bytes_evicted", "gpu_faults", "cpu_faults"), 0)

    def add(self, records: np.ndarray) -> None:
        if not len(records):
            return
        kind = records["kind"]
        first, last = int(records["start"].min()), int(records["end"].max())
        self.first = first if self.first is None else min(self.first, first)
        self.last = last if self.last is None else max(self.last, last)
        nbytes, value = records["bytes"], records["value"]
        dtoh = kind == EventKind.DTOH
        for name, rows, column in (("bytes_htod", kind == EventKind.HTOD, nbytes), ("bytes_dtoh", dtoh, nbytes),
                                   ("bytes_evicted", dtoh & (records["flags"] == MigrationCause.EVICTION), nbytes),
                                   ("gpu_faults", kind == EventKind.GPU_PAGE_FAULT, value),
                                   ("cpu_faults", kind == EventKind.CPU_PAGE_FAULT, value)):
            self.counts[name] += int(column[rows].sum())

    def result(self) -> dict[str, Any]:
        span = self.last - self.first if self.first is not None and self.last is not None else 0
        return {"seconds": span / 1e9, **self.counts}


def measured(trace: Trace) -> dict[str, Any]:
    """A trace's time (the span of its records), bytes each way, evicted bytes and faults: what a
    :class:`Replayed` holds, for the original."""
    tally = _Tally()
    tally.add(trace.events)
    return tally.result()


def replay(trace: Trace, *, device_memory: int | str | None = None, platform: str | None = None,
           prefetch: str | Mapping[int, str] = "recorded", advice: str = "recorded",
           set_advice: Mapping[int, Mapping[str, Any]] | None = None, keep_trace: bool = False) -> Replayed:
    """Run ``trace`` again on a fresh simulated GPU of ``device_memory`` (the current backend's memory where None)
    and ``platform`` (the current simulator's, or ``"x86-pcie5"``), with the prefetches and advice chosen.

    ``set_advice`` maps an allocation's ``alloc_id`` in the trace (its ``alloc`` or ``segment_alloc`` record's) to
    its advice, set when it is allocated in place of any the trace sets on it: ``{"read_mostly": True,
    "preferred_location": "gpu", "accessed_by": "gpu"}``, any of them (False, None or left out: not set).

    ``keep_trace`` keeps the replay's own events (:attr:`Replayed.trace`, with its accesses: replayable in turn);
    what it measures is counted as the records are published, whether kept or not.

    Raises
    ------
    InvalidArgumentError
        For a bad size, platform, choice or advice, an ``alloc_id`` the trace does not allocate, or a trace that
        missed records while it was recorded. Nothing has run when it is raised.
    """
    if not isinstance(trace, Trace):
        raise InvalidArgumentError(f"replay needs a uvm_lab Trace, got {shown(trace)}", value=trace,
                                   expected="a Trace (ul.record(), Trace.load)")
    if trace.missed:
        raise InvalidArgumentError(f"the trace missed {trace.missed:,} records while it was recorded: what it holds "
                                   f"is not all that happened, so it cannot be replayed", value=trace.missed,
                                   expected="a trace that missed nothing (a larger record(limit=))")
    if advice not in ADVICE_CHOICES:
        raise InvalidArgumentError(f"advice must be one of {', '.join(ADVICE_CHOICES)}, got {shown(advice)}",
                                   value=advice, expected=", ".join(ADVICE_CHOICES))
    memory = _device_memory(device_memory)
    profile = get_platform(platform if platform is not None else _current_platform())
    events = trace.events
    allocations = _allocations(events)
    choices = _checked_prefetch(prefetch, allocations)
    wanted = _checked_advice(set_advice, allocations)
    exact = bool((events["kind"] == EventKind.ACCESS).any())
    if not exact:   # the driver's records come late and out of order: by time
        events = events[np.argsort(events["start"], kind="stable")]

    bus = EventBus()
    sim = SimBackend(memory, profile, bus=bus)
    runner = _Runner(sim, prefetch=choices, advice=advice, set_advice=wanted, exact=exact,
                     replaced=[allocations[a] for a in wanted])
    if not isinstance(keep_trace, bool):
        raise InvalidArgumentError(f"keep_trace must be True or False, got {shown(keep_trace)}", value=keep_trace,
                                   expected="True or False")
    tally = _Tally()
    # Counted inline, as published: nothing dropped however fast the replay runs. With the accesses, so that it
    # spans what an exact original spans.
    with bus.subscribe(tally.add, list(EventKind), inline=True, name="ul.replay()"), \
            (record(bus, accesses=True) if keep_trace else contextlib.nullcontext()) as out:
        runner.run(events)
    notes = []
    if not exact:
        notes.append("the trace holds faults, not accesses: accesses that hit resident pages are not replayed, so "
                     "the bytes are a lower bound and the time is the faults' alone")
    if runner.unallocated:
        notes.append(f"{runner.unallocated:,} records touched memory allocated before the recording began and were "
                     f"not replayed")
    return Replayed(**tally.result(), exact=exact and not runner.unallocated, note="; ".join(notes), trace=out)


class _Runner:
    """The trace's calls, made again on ``sim``: each allocation where the original was, by offset."""

    def __init__(self, sim: SimBackend, *, prefetch: list[tuple[int, int, str]], advice: str,
                 set_advice: dict[int, dict[Advice, Location | None]],
                 exact: bool, replaced: list[tuple[int, int]]) -> None:
        self.sim, self.advice, self.set_advice, self.exact = sim, advice, set_advice, exact
        self.replaced = replaced   # the original ranges whose recorded advice set_advice replaces
        self.choices = prefetch    # (address, size, choice): the first range holding an address says; the last all
        self.segments: dict[int, tuple[int, int, int]] = {}   # original address -> (size, new address, kind)
        self._starts: list[int] = []   # the segments' original addresses, sorted
        self.unallocated = 0

    def _segment(self, address: int) -> tuple[int, tuple[int, int, int]] | None:
        """The live segment (its original address, and its entry) holding the original ``address``."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0:
            return None
        start = self._starts[i]
        entry = self.segments[start]
        return (start, entry) if address < start + entry[0] else None

    def new_address(self, address: int) -> int | None:
        """Where the byte at the original ``address`` is in the replay, or None outside every segment it made."""
        found = self._segment(address)
        return None if found is None else found[1][1] + address - found[0]

    def run(self, events: np.ndarray) -> None:
        rows = iter(range(len(events)))
        for i in rows:
            ev = events[i]
            kind, flags, size, stream = int(ev["kind"]), int(ev["flags"]), int(ev["bytes"]), int(ev["stream"])
            if kind == EventKind.SEGMENT_ALLOC:
                new = self.sim.allocate(size, MemoryKind(flags), device=max(0, int(ev["dst"])))
                if int(ev["address"]) not in self.segments:   # (a trace missing a free maps the address again)
                    bisect.insort(self._starts, int(ev["address"]))
                self.segments[int(ev["address"])] = (size, new, flags)
                self._allocated(ev, managed=flags == MemoryKind.MANAGED)
            elif kind == EventKind.ALLOC:
                self._allocated(ev, managed=self._kind_at(int(ev["address"])) == MemoryKind.MANAGED)
            elif kind == EventKind.SEGMENT_FREE:
                entry = self.segments.pop(int(ev["address"]), None)
                if entry is not None:
                    self._starts.remove(int(ev["address"]))
                    self.sim.free(entry[1])
            elif kind == EventKind.PREFETCH and self.prefetch(int(ev["address"]), size) != "none":
                if (ptr := self._at(ev)) is not None and (self.prefetch(int(ev["address"]), size) != "needed"
                                                          or not self._in_place(ptr, size, int(ev["dst"]))):
                    self.sim.prefetch(ptr, size, _location(int(ev["dst"])), stream=stream)
            elif kind == EventKind.ADVICE and self.advice == "recorded" and not any(
                    a <= int(ev["address"]) < a + n for a, n in self.replaced):
                dst = int(ev["dst"])
                if (ptr := self._at(ev)) is not None:
                    self.sim.advise(ptr, size, Advice(flags), None if dst == NO_PROCESSOR else _location(dst))
            elif kind == EventKind.ACCESS and flags & ACCESS_STREAM:
                runs = []
                while i + 1 < len(events) and events[i + 1]["kind"] == EventKind.ACCESS \
                        and events[i + 1]["flags"] & ACCESS_RUN:
                    i = next(rows)
                    runs.append(i)
                self._stream(ev, events[runs])
            elif kind == EventKind.ACCESS and not flags & ACCESS_RUN:
                processor = _location(int(ev["src"]))
                self._before_access(ev, processor)
                if (ptr := self._at(ev)) is not None:
                    self.sim.access(ptr, size, processor, _MODES[flags & 0x07], stream=stream)
            elif not self.exact and (kind in _FAULTS or (kind in _MIGRATIONS and flags in _DEMANDED)):
                # Without the accesses: each fault, and each migration that an access demanded, as an access by the
                # processor that faulted (or that the pages moved to) of the range it names (a fault's page where
                # CUPTI names no range).
                processor = _location(HOST_ID if kind == EventKind.CPU_PAGE_FAULT else int(ev["src"])
                                      if kind == EventKind.GPU_PAGE_FAULT else int(ev["dst"]))
                self._before_access(ev, processor)
                if (ptr := self._at(ev)) is not None:
                    self.sim.access(ptr, max(size, PAGE_SIZE) if kind in _FAULTS else size, processor,
                                    "write" if kind in _FAULTS and flags in (2, 3) else "read")

    def _in_place(self, ptr: int, size: int, dst: int) -> bool:
        """Whether every page of the range is already at ``dst`` in the replay (a prefetch there moves nothing)."""
        where = 1 if dst == HOST_ID else 1 << (dst + 1)   # the simulator's residency bits: host 1, GPU n 2 << n
        return bool(size) and bool((self.sim.page_states(ptr, size) & where).all())

    def prefetch(self, address: int, size: int = 1) -> str:
        """The prefetch choice for the smallest allocation that holds the original range (a pool's growth, prefetched
        whole, is the pool's memory's, not the first buffer's at the same address)."""
        end = address + max(size, 1)
        return next(choice for start, n, choice in self.choices if start <= address and end <= start + n)

    def _kind_at(self, address: int) -> int | None:
        found = self._segment(address)
        return None if found is None else found[1][2]

    def _allocated(self, ev: np.void, *, managed: bool) -> None:
        """After an allocation: advice chosen for it, and the prefetch of ``on_allocate``."""
        ptr, size = self._at(ev), int(ev["bytes"])
        if ptr is None:
            return
        for advice, where in self.set_advice.get(int(ev["alloc_id"]), {}).items():
            self.sim.advise(ptr, size, advice, where)
        if managed and self.prefetch(int(ev["address"]), size) == "on_allocate":
            self.sim.prefetch(ptr, size, Location.device(0))

    def _before_access(self, ev: np.void, processor: Location, end: int | None = None) -> None:
        """``on_access``: what an access by a GPU is about to touch (its range; for a stream, from its lowest page to
        its highest, ``end``), prefetched to that GPU first, unless it is all there already."""
        address = int(ev["address"])
        if self.prefetch(address) != "on_access" or processor.is_host or self._kind_at(address) != MemoryKind.MANAGED:
            return
        ptr = self.new_address(address)
        size = (end if end is not None else address + int(ev["bytes"])) - address
        if ptr is not None and not self._in_place(ptr, size, processor.id):
            self.sim.prefetch(ptr, size, processor)

    def _at(self, ev: np.void) -> int | None:
        """Where a record's address is in the replay; None (and counted) outside every segment it made."""
        ptr = self.new_address(int(ev["address"]))
        if ptr is None:
            self.unallocated += 1
        return ptr

    def _stream(self, header: np.void, runs: np.ndarray) -> None:
        """An access stream: its parts, from its runs, as the simulator ran them."""
        processor = _location(int(header["src"]))
        flags = int(header["flags"])
        addresses: list[list[np.ndarray]] = []
        writes: list[list[np.ndarray]] = []
        for run in runs:
            ptr = self.new_address(int(run["address"]))
            if ptr is None:
                self.unallocated += 1
                return
            pages = ptr + np.arange(int(run["bytes"]) // PAGE_SIZE, dtype=np.uint64) * np.uint64(PAGE_SIZE)
            if run["flags"] & ACCESS_PART or not addresses:
                addresses.append([])
                writes.append([])
            addresses[-1].append(pages)
            writes[-1].append(np.full(len(pages), run["flags"] & 0x07 != 1))
        if not processor.is_host:   # on_access: per allocation, the span of what the stream touches
            for start, (size, _, _) in list(self.segments.items()):
                mine = runs[(runs["address"] >= start) & (runs["address"] < start + size)]
                if len(mine):
                    self._before_access(mine[np.argmin(mine["address"])], processor,
                                        end=int((mine["address"] + mine["bytes"]).max()))
        parts = [np.concatenate(a) for a in addresses]
        mode: Any = _MODES[flags & 0x07] if flags & ACCESS_UNIFORM else [np.concatenate(w) for w in writes]
        self.sim.access_stream(parts, processor, mode, in_flight=int(header["address"]),
                               bytes_per_access=int(header["bytes"]), warps=int(header["value"]) or None,
                               stream=int(header["stream"]), launch=bool(header["dst"]))


def _location(processor: int) -> Location:
    return Location.host() if processor == HOST_ID else Location.device(processor)


def _allocations(events: np.ndarray) -> dict[int, tuple[int, int]]:
    """Every allocation the trace makes, by ``alloc_id``: its address and size."""
    made = (events["kind"] == EventKind.ALLOC) | (events["kind"] == EventKind.SEGMENT_ALLOC)
    rows = events[made]
    return {int(a): (int(p), int(n)) for a, p, n in zip(rows["alloc_id"], rows["address"], rows["bytes"], strict=True)}


def _checked_prefetch(prefetch: str | Mapping[int, str], allocations: dict[int, tuple[int, int]]
                      ) -> list[tuple[int, int, str]]:
    """``prefetch`` as ranges and their choices: one choice for all, or one for each allocation named (the rest
    as recorded), the smallest range first so that a buffer inside a pool's segment has its own."""
    if isinstance(prefetch, str) or not isinstance(prefetch, Mapping):
        if prefetch not in PREFETCH_CHOICES:
            raise InvalidArgumentError(f"prefetch must be one of {', '.join(PREFETCH_CHOICES)}, or a dict of them by "
                                       f"alloc_id, got {shown(prefetch)}", value=prefetch,
                                       expected=", ".join(PREFETCH_CHOICES))
        return [(0, 1 << 64, prefetch)]
    out = []
    for alloc_id, choice in prefetch.items():
        _check_alloc_id(alloc_id, allocations, "prefetch")
        if choice not in PREFETCH_CHOICES:
            raise InvalidArgumentError(f"prefetch for alloc_id {alloc_id} must be one of "
                                       f"{', '.join(PREFETCH_CHOICES)}, got {shown(choice)}", value=choice,
                                       expected=", ".join(PREFETCH_CHOICES))
        out.append((*allocations[int(alloc_id)], choice))
    return [*sorted(out, key=lambda r: r[1]), (0, 1 << 64, "recorded")]


def _check_alloc_id(alloc_id: object, allocations: dict[int, tuple[int, int]], option: str) -> None:
    if isinstance(alloc_id, bool) or not isinstance(alloc_id, (int, np.integer)) or int(alloc_id) not in allocations:
        made = ", ".join(map(str, sorted(allocations))) or "none"
        raise InvalidArgumentError(f"{option} names alloc_id {shown(alloc_id)}, which the trace does not allocate "
                                   f"(it allocates {made})", value=alloc_id,
                                   expected="an alloc_id of the trace's alloc or segment_alloc records")


def _checked_advice(set_advice: Mapping[int, Mapping[str, Any]] | None, allocations: dict[int, tuple[int, int]]
                    ) -> dict[int, dict[Advice, Location | None]]:
    """``set_advice`` as the backend's advice calls for each allocation, every key and value checked."""
    if set_advice is None:
        return {}
    if not isinstance(set_advice, Mapping):
        raise InvalidArgumentError(f"set_advice must map an alloc_id to advice, got {shown(set_advice)}",
                                   value=set_advice, expected='{alloc_id: {"read_mostly": True, ...}}')
    out: dict[int, dict[Advice, Location | None]] = {}
    for alloc_id, chosen in set_advice.items():
        _check_alloc_id(alloc_id, allocations, "set_advice")
        if not isinstance(chosen, Mapping) or not set(chosen) <= set(ADVICE_NAMES):
            raise InvalidArgumentError(f"the advice for alloc_id {alloc_id} must be a dict of "
                                       f"{', '.join(ADVICE_NAMES)}, got {shown(chosen)}", value=chosen,
                                       expected=f"a dict with keys among {', '.join(ADVICE_NAMES)}")
        calls: dict[Advice, Location | None] = {}
        for name, value in chosen.items():
            if name == "read_mostly":
                if not isinstance(value, bool):
                    raise InvalidArgumentError(f"read_mostly must be True or False, got {shown(value)}", value=value,
                                               expected="True or False")
                if value:
                    calls[Advice.SET_READ_MOSTLY] = None
            elif value is not None:
                calls[Advice.SET_PREFERRED_LOCATION if name == "preferred_location" else Advice.SET_ACCESSED_BY] = \
                    Location.parse(value, device_count=1, name=name)
        out[int(alloc_id)] = calls
    return out


def _device_memory(device_memory: int | str | None) -> int:
    if device_memory is not None:
        return parse_size(device_memory, name="device_memory", allow_zero=False)
    from .backends import get_backend

    total = int(get_backend().mem_info()[1])
    if total <= 0:
        raise InvalidArgumentError(f"the current backend reports {format_bytes(total)} of memory: give "
                                   f"device_memory", value=device_memory, expected="a size, such as '16GiB'")
    return total


def _current_platform() -> str:
    from .backends import get_backend

    backend = get_backend()
    return backend.platform.name if isinstance(backend, SimBackend) else "x86-pcie5"

