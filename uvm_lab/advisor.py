"""The advisor: what a trace shows going wrong, the change to make, and what replaying the trace with it gains.

>>> import uvm_lab as ul
>>> _ = ul.use_backend("sim", device_memory="1GiB")
>>> with ul.record(accesses=True) as trace:
...     buf = ul.DeviceBuffer(size="64MiB", label="weights")
...     _ = ul.touch(buf, on="host", mode="write")
...     _ = ul.touch(buf, on="gpu")
>>> advice = ul.advise(trace)
>>> advice[0].pattern, advice[0].code
('gpu_first_touch', 'weights.prefetch("gpu")   # before the kernel')

Each pattern is looked for per allocation (an ``alloc`` record's buffer, or a ``segment_alloc``'s memory where no
buffer was made in it), over its life (from the record that made it to the one that freed it: a pool hands the
same addresses out again), from the trace's records alone:

``gpu_first_touch``
    A GPU faulted the allocation's pages in: prefetch it to the GPU before the kernel.
``ping_pong``
    Its pages moved to the GPU and back to the host on demand, more than once over: keep them in one place and
    map them for the other processor (PreferredLocation and AccessedBy), or duplicate them (ReadMostly) where the
    GPU only reads.
``thrashing``
    The driver reported thrashing in it: the same remedies.
``read_mostly_written``
    ReadMostly was set and the allocation was written while it held: every write collapses the copies.
``larger_than_device``
    Its pages were evicted to make room: leave it on the host and map it for the GPU.
``prefetch_adaptor_not_outermost``
    A pool's memory was prefetched whole as it grew, and the buffers it handed out never were: a
    ``PrefetchResourceAdaptor`` under the pool, where it prefetches the pool's growth, not each buffer.
``prefetch_moved_nothing``
    A prefetch of it found every page already where it sent them.

Where several buffers show one pattern, their changes together are one more candidate. Every candidate change is
replayed (:func:`uvm_lab.replay`) and kept only where it saves at least
:data:`MIN_GAIN` of the time: the expected gain is
the replay's, against the trace replayed as recorded, on the same simulated GPU. A trace recorded with
``accesses=True`` replays exactly; any other replays its faults, and a recommendation's gain is then a lower
bound's (each says so in ``note``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from .buffer import find_buffer
from .errors import InvalidArgumentError, shown
from .events.schema import ACCESS_RUN, ACCESS_STREAM, AccessType, Advice, EventKind, MigrationCause
from .events.sources import texts
from .events.trace import Trace
from .trace_replay import Replayed, replay
from .units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MIN_GAIN", "PATTERNS", "Recommendation", "Recommendations", "advise"]

#: What the advisor looks for, in the order it reports ties.
PATTERNS = ("read_mostly_written", "thrashing", "ping_pong", "larger_than_device", "gpu_first_touch",
            "prefetch_adaptor_not_outermost", "prefetch_moved_nothing")

#: The least share of the time a change must save to be recommended: less is within what a real GPU's runs vary.
MIN_GAIN = 0.01

_DEMANDED = (int(MigrationCause.COHERENCE), int(MigrationCause.PREFETCH))
_WRITES = (int(AccessType.WRITE), int(AccessType.ATOMIC))


@dataclass(frozen=True)
class Recommendation:
    """One change, the evidence for it, and what replaying the trace with it measured."""

    pattern: str        #: one of :data:`PATTERNS`
    alloc_id: int       #: the allocation, as the trace names it (the first, where the change is to several)
    name: str           #: the buffer's label where it is alive, else ``buffer <alloc_id>`` (comma-separated, several)
    allocated_at: str   #: the line that allocated it ("" where unknown)
    source: str         #: the line where the pattern shows (the first fault, the advice set ...)
    evidence: str       #: what the trace shows, in numbers
    code: str           #: the change, as code
    change: dict[str, Any] = field(repr=False)   #: the change, as :func:`uvm_lab.replay`'s options
    before: Replayed = field(repr=False)         #: the trace replayed as recorded
    after: Replayed = field(repr=False)          #: the trace replayed with the change

    @property
    def gain(self) -> float:
        """The share of the time the change saves: 0.25 is a quarter faster."""
        return 1 - self.after.seconds / self.before.seconds if self.before.seconds else 0.0

    @property
    def note(self) -> str:
        return self.after.note


class Recommendations(Sequence[Recommendation]):
    """The advisor's recommendations, the largest gain first."""

    def __init__(self, items: list[Recommendation], baseline: Replayed) -> None:
        self._items = items
        self.baseline = baseline   #: the trace replayed as recorded

    @overload
    def __getitem__(self, index: int) -> Recommendation: ...
    @overload
    def __getitem__(self, index: slice) -> list[Recommendation]: ...
    def __getitem__(self, index: int | slice) -> Recommendation | list[Recommendation]:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Recommendation]:
        return iter(self._items)

    def to_pandas(self) -> pd.DataFrame:
        """One row per recommendation: what, where, the change as code, and the replay's figures."""
        import pandas as pd

        return pd.DataFrame([{
            "rank": i + 1, "pattern": r.pattern, "buffer": r.name, "alloc_id": r.alloc_id, "source": r.source,
            "evidence": r.evidence, "code": r.code, "seconds_before": r.before.seconds,
            "seconds_after": r.after.seconds, "gain": r.gain, "bytes_moved_before": r.before.bytes_htod +
            r.before.bytes_dtoh, "bytes_moved_after": r.after.bytes_htod + r.after.bytes_dtoh, "note": r.note,
        } for i, r in enumerate(self._items)])

    def __repr__(self) -> str:
        if not self._items:
            return "<Recommendations: none; the replays found no change that gains>"
        lines = [f"{i + 1}. {r.pattern} in {r.name}: {r.gain:.0%} faster "
                 f"({r.before.seconds * 1e3:,.1f} -> {r.after.seconds * 1e3:,.1f} ms)\n"
                 f"   {r.evidence}{f' at {r.source}' if r.source else ''}\n   " + "\n   ".join(r.code.splitlines())
                 for i, r in enumerate(self._items)]
        return "\n".join(lines)


def advise(trace: Trace, *, device_memory: int | str | None = None, platform: str | None = None,
           top: int | None = None) -> Recommendations:
    """Look for the :data:`PATTERNS` in ``trace``, replay each candidate change on a simulated GPU of
    ``device_memory`` and ``platform`` (:func:`uvm_lab.replay`'s defaults: the current backend's), and return the
    changes that gain, ranked by the time they save; at most ``top`` of them.

    Raises
    ------
    InvalidArgumentError
        ``trace`` is not a Trace, or ``top`` is not a positive int; and what :func:`uvm_lab.replay` refuses.
    """
    if not isinstance(trace, Trace):
        raise InvalidArgumentError(f"advise needs a uvm_lab Trace, got {shown(trace)}", value=trace,
                                   expected="a Trace (ul.record(accesses=True), Trace.load)")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise InvalidArgumentError(f"top must be a positive int or None, got {shown(top)}", value=top,
                                   expected="an int >= 1, or None for all")
    options: dict[str, Any] = {"device_memory": device_memory, "platform": platform}
    baseline = replay(trace, **options)
    found = []
    for candidate in _candidates(trace.events):
        best = None
        for change in candidate.pop("changes"):
            after = replay(trace, **options, **change["replay"])
            if after.seconds < baseline.seconds * (1 - MIN_GAIN) and (best is None or after.seconds < best[1].seconds):
                best = (change, after)
        if best is not None:
            found.append(Recommendation(**candidate, code=best[0]["code"], change=best[0]["replay"], before=baseline,
                                        after=best[1]))
    found += _together(trace, options, baseline, found)
    found.sort(key=lambda r: (-(baseline.seconds - r.after.seconds), PATTERNS.index(r.pattern)))
    return Recommendations(found[:top], baseline)


def _together(trace: Trace, options: dict[str, Any], baseline: Replayed, found: list[Recommendation]
              ) -> list[Recommendation]:
    """Where several buffers show one pattern, their changes made together: one recommendation more, kept where it
    gains more than the best of them alone (a kernel that reads two buffers waits for both)."""
    out = []
    for pattern in PATTERNS:
        alike = [r for r in found if r.pattern == pattern]
        if len(alike) < 2:
            continue
        change: dict[str, Any] = {}
        for r in alike:
            for option, by_alloc in r.change.items():
                change.setdefault(option, {}).update(by_alloc)
        after = replay(trace, **options, **change)
        if after.seconds < min(r.after.seconds for r in alike):
            out.append(Recommendation(
                pattern=pattern, alloc_id=alike[0].alloc_id, name=", ".join(r.name for r in alike),
                allocated_at=alike[0].allocated_at, source=alike[0].source,
                evidence=f"{len(alike)} buffers: " + "; ".join(f"{r.name}: {r.evidence}" for r in alike),
                code="\n".join(r.code for r in alike), change=change, before=baseline, after=after))
    return out


def _candidates(events: np.ndarray) -> Iterator[dict[str, Any]]:
    """Each pattern found, per allocation, with the changes that might mend it."""
    kind, flags = events["kind"], events["flags"]
    allocations = _allocations(events)
    yield from _inner_prefetches(events, allocations)
    for allocation in (a for a in allocations if a.leaf):
        alloc_id, size, allocated_at = allocation.alloc_id, allocation.size, allocation.allocated_at
        inside = allocation.holds(events)
        mine = events[inside]
        k, f = kind[inside], flags[inside]
        name = _name(alloc_id)
        var = name if name.isidentifier() else "buf"
        # Where "buf" stands for a buffer with no usable name, the code's comment says which.
        which = "" if var == name else f"buf: {name}" + (f", allocated at {allocated_at}" if allocated_at else "")

        def code(text: str, comment: str = "", which: str = which) -> str:
            said = "; ".join(c for c in (comment, which) if c)
            return f"{text}   # {said}" if said else text

        def found(pattern: str, source_rows: np.ndarray, evidence: str, changes: list[dict[str, Any]],
                  alloc_id: int = alloc_id, name: str = name, allocated_at: str = allocated_at,
                  mine: np.ndarray = mine) -> dict[str, Any]:
            rows = mine[source_rows]
            source = texts(rows["source"][:1])[0] if len(rows) else ""
            return {"pattern": pattern, "alloc_id": alloc_id, "name": name, "allocated_at": allocated_at,
                    "source": source, "evidence": evidence, "changes": changes}

        def nbytes(rows: np.ndarray, mine: np.ndarray = mine) -> int:
            return int(mine["bytes"][rows].sum())

        htod = (k == EventKind.HTOD) & np.isin(f, _DEMANDED)
        dtoh = (k == EventKind.DTOH) & np.isin(f, _DEMANDED)
        gpu_faults = k == EventKind.GPU_PAGE_FAULT
        evicted = (k == EventKind.DTOH) & (f == MigrationCause.EVICTION)
        thrashing = k == EventKind.THRASHING
        set_read_mostly = (k == EventKind.ADVICE) & (f == Advice.SET_READ_MOSTLY)
        # A range access or a stream's run (not the stream's header) that writes; a GPU fault on a write.
        writes = ((k == EventKind.ACCESS) & ((f & ACCESS_STREAM) == 0) & np.isin(f & 0x07, _WRITES)) \
            | (gpu_faults & np.isin(f, _WRITES))
        written = writes | (k == EventKind.INVALIDATE)
        gpu_only_reads = not (writes & (mine["src"] >= 0)).any()
        keep_on_host = {"set_advice": {alloc_id: {"preferred_location": "host", "accessed_by": "gpu"}}}
        keep = {"replay": keep_on_host, "code": code(f'{var}.preferred_location = "host"; {var}.accessed_by = "gpu"')}
        remedies = [dict(keep)]
        if gpu_only_reads:
            remedies.append({"replay": {"set_advice": {alloc_id: {"read_mostly": True}}},
                             "code": code(f"{var}.read_mostly = True", "the GPU only reads it")})

        if set_read_mostly.any() and written[np.argmax(set_read_mostly):].any():
            yield found("read_mostly_written", set_read_mostly,
                        f"ReadMostly set, then written: {int(written.sum()):,} writes or collapses",
                        [{"replay": {"set_advice": {alloc_id: {}}},
                          "code": code(f"{var}.read_mostly = False")}])
        if thrashing.any():
            yield found("thrashing", thrashing, f"{_count(int(thrashing.sum()), 'thrashing report')} from the driver",
                        remedies)
        if nbytes(htod) > size and nbytes(dtoh) > 0:
            yield found("ping_pong", htod, f"{format_bytes(nbytes(htod))} to the GPU and {format_bytes(nbytes(dtoh))} "
                        f"back on demand, of {format_bytes(size)}", remedies)
        if evicted.any():
            yield found("larger_than_device", evicted, f"{format_bytes(nbytes(evicted))} evicted, of "
                        f"{format_bytes(size)}", [keep])
        if gpu_faults.any() and htod.any():
            yield found("gpu_first_touch", gpu_faults, f"{int(mine['value'][gpu_faults].sum()):,} GPU faults moved "
                        f"{format_bytes(nbytes(htod))} in", [
                            {"replay": {"prefetch": {alloc_id: "on_access"}},
                             "code": code(f'{var}.prefetch("gpu")', "before the kernel")}])
        idle = _idle_prefetches(mine)
        if idle.any():
            yield found("prefetch_moved_nothing", idle,
                        f"{_count(int(idle.sum()), 'prefetch')} found every page in place",
                        [{"replay": {"prefetch": {alloc_id: "needed"}},
                          "code": code(f"# drop {var}.prefetch(...) at {texts(mine['source'][idle][:1])[0]}",
                                       "its pages are already there")}])


def _inner_prefetches(events: np.ndarray, allocations: list[_Allocation]) -> Iterator[dict[str, Any]]:
    """A prefetch adaptor that is not outermost: the memory a pool (or another suballocator) took was prefetched
    whole as it grew, and the buffers it handed out never were (RMM's PrefetchResourceAdaptor prefetches what its
    upstream gives it: under a pool, the pool's growth)."""
    kind = events["kind"]
    prefetches = np.flatnonzero(kind == EventKind.PREFETCH)
    reported: set[int] = set()
    # The innermost first (made last): a pool's memory sits in the segment that was mapped for it, both prefetched
    # by the one record, which is the pool's.
    for outer in sorted((a for a in allocations if not a.leaf), key=lambda a: -a.first):
        whole = prefetches[(events["address"][prefetches] == outer.start) & (events["bytes"][prefetches] == outer.size)
                           & (prefetches > outer.first) & (prefetches <= outer.last)]
        whole = np.array([i for i in whole.tolist() if i not in reported], dtype=np.int64)
        if not len(whole):
            continue
        reported.update(whole.tolist())
        inside = [a for a in allocations if a.leaf and outer.start <= a.start < outer.start + outer.size
                  and outer.first < a.first <= outer.last]
        bare = [a for a in inside if not (a.holds(events) & (kind == EventKind.PREFETCH)).any()]
        if not bare:
            continue
        name = _name(outer.alloc_id)
        yield {"pattern": "prefetch_adaptor_not_outermost", "alloc_id": outer.alloc_id, "name": name,
               "allocated_at": outer.allocated_at, "source": texts(events["source"][whole[:1]])[0],
               "evidence": f"{_count(len(whole), 'prefetch')} of the {format_bytes(outer.size)} it took, as it grew; "
                           f"none of the {_count(len(bare), 'buffer')} handed out of it",
               # Each buffer prefetched as it is handed out, and the pool's growth not.
               "changes": [{"replay": {"prefetch": {outer.alloc_id: "none",
                                                    **{a.alloc_id: "on_allocate" for a in bare}}},
                            "code": "mr = ul.mr.PrefetchResourceAdaptor(ul.mr.PoolMemoryResource(...))   # the "
                                    "prefetch adaptor outermost: each buffer prefetched as it is handed out"
                                    + (f"; in place of the one at {outer.allocated_at}" if outer.allocated_at
                                       else "")}]}


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 'es' if noun.endswith('h') else 's'}"


def _idle_prefetches(records: np.ndarray) -> np.ndarray:
    """Which PREFETCH records (of one allocation) no migration followed before the next call's records (the
    simulator publishes a call's records together, in order), once something had touched it: a prefetch of memory
    nothing touched yet makes its pages where it sends them, which moves nothing and is not idle."""
    kind = records["kind"]
    calls = np.flatnonzero(np.isin(kind, (EventKind.PREFETCH, EventKind.ACCESS, EventKind.ADVICE, EventKind.ALLOC,
                                          EventKind.SEGMENT_ALLOC, EventKind.FREE, EventKind.SEGMENT_FREE))
                           & ~((kind == EventKind.ACCESS) & ((records["flags"] & ACCESS_RUN) != 0)))
    # Migrations up to each record, counted once: a call moved something where the count grew over its records.
    moved = np.concatenate(([0], np.cumsum(np.isin(kind, (EventKind.HTOD, EventKind.DTOH)))))
    touched = np.isin(kind, (EventKind.PREFETCH, EventKind.ACCESS, EventKind.HTOD, EventKind.DTOH,
                             EventKind.GPU_PAGE_FAULT, EventKind.CPU_PAGE_FAULT))
    first_touch = int(np.argmax(touched)) if touched.any() else len(records)
    ends = np.append(calls[1:], len(records))
    idle = np.zeros(len(records), dtype=bool)
    prefetch = (kind[calls] == EventKind.PREFETCH) & (calls > first_touch)
    idle[calls[prefetch]] = moved[ends[prefetch]] == moved[calls[prefetch]]
    return idle


@dataclass(frozen=True)
class _Allocation:
    """An allocation of the trace: where, from which record to which (its life), and whether it is a leaf."""

    alloc_id: int
    start: int
    size: int
    first: int          # the index of the record that made it
    last: int           # the index of the record that freed it (the trace's end where none did)
    allocated_at: str
    leaf: bool          # no allocation was made inside it in its life (a pool's memory holds what it hands out)

    def holds(self, events: np.ndarray) -> np.ndarray:
        """Which records concern it: in its range, in its life."""
        index = np.arange(len(events))
        return (events["address"] >= self.start) & (events["address"] < self.start + self.size) \
            & (index >= self.first) & (index <= self.last)


def _allocations(events: np.ndarray) -> list[_Allocation]:
    """Every buffer and segment the trace allocates, with its life."""
    kind, ids, address = events["kind"], events["alloc_id"], events["address"]
    made = np.flatnonzero((kind == EventKind.ALLOC) | (kind == EventKind.SEGMENT_ALLOC))
    freed = np.flatnonzero((kind == EventKind.FREE) | (kind == EventKind.SEGMENT_FREE))
    freed_at = {int(ids[i]): int(i) for i in freed[::-1]}   # each id's first free
    buffers = np.flatnonzero(kind == EventKind.ALLOC)
    out = []
    for i, line in zip(made.tolist(), texts(events["source"][made]), strict=True):
        start, size = int(address[i]), int(events["bytes"][i])
        last = freed_at.get(int(ids[i]), len(events) - 1)
        inside = buffers[(buffers > i) & (buffers <= last) & (address[buffers] >= start)
                         & (address[buffers] < start + size)]
        out.append(_Allocation(int(ids[i]), start, size, i, last, line, leaf=not len(inside)))
    return out


def _name(alloc_id: int) -> str:
    try:
        return find_buffer(alloc_id).label
    except InvalidArgumentError:
        return f"buffer {alloc_id}"
