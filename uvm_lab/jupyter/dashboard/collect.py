"""Collectors: what the dashboard and ``%uvm status`` show, as plain data.

Nothing here imports a widget or a plotting library. :func:`collect_snapshot` reads the kernel-side
API (``ul.live_buffers()``, ``ul.residency()``, each GPU's memory (``gpu_memory``), the event bus) and returns a
dict of builtins and numpy arrays; the components in this package only render such a dict. The
snapshot's shape::

    {
      "backend": "sim", "device_count": 1, "time_ns": 123456,
      "memory": {"free": int, "total": int, "used": int,            # the current GPU's: backend.mem_info()
                 "devices": [{"device": d, "free": int, "total": int, "used": int}, ...]},   # each GPU's, by ordinal
      "events": {"published": int, "dropped": int},                 # the bus's counters
      "totals": {...} | None,                                       # EventTotals.snapshot()
      "resource": ["PrefetchResourceAdaptor", "PoolMemoryResource", ...],
      "resource_stats": {"current_bytes": ..., ...} | None,         # a StatisticsResourceAdaptor in the chain
      "allocations": [                                              # ul.live_buffers(), oldest first
        {"id", "label", "size", "address", "is_managed", "page_size",
         "states": uint8 array (one entry per page, ul.residency's encoding),
         "category_pages": {"nowhere": n, "host": n, ..., "gpu:5": n},  # pages per category, every one
         "advice": {"read_mostly": bool, "preferred_location": str | None, "accessed_by": (str, ...)} | None},
      ],
    }

Views never decode a page state's bits: they draw and count its category
(:func:`uvm_lab.page_states.categories`, named by :data:`~uvm_lab.page_states.CATEGORY_NAMES`).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
from numba import njit, types

import uvm_lab as ul
from uvm_lab.backends.base import gpu_memory
from uvm_lab.buffer import live_generation
from uvm_lab.errors import BufferClosedError, InvalidArgumentError
from uvm_lab.events import HistoryReader, Subscription, get_bus
from uvm_lab.events.staged import StagedRecords
from uvm_lab.page_states import CATEGORY_NAMES, MAX_GPUS, categories, count_states
from uvm_lab.residency_map import get_tracker

__all__ = ["EventTotals", "LiveAllocations", "bin_pages", "bin_states", "category_pages", "category_table",
           "collect_snapshot", "describe_buffer", "rebin", "shown_categories"]

class EventTotals:
    """Running totals of ``Trace.summary()`` over every batch the bus delivers: events, counts per kind,
    bytes migrated each way, faults.

    Fed the bus's history first (a live dashboard's reader starts with it), so it counts from the start of the
    session as far as the history ring reaches. ``feed`` may be called from any thread: it only stages the records
    (:class:`~uvm_lab.events.staged.StagedRecords`), and :meth:`snapshot` sums what was staged, at once. Past
    ``STAGED`` records staged, ``feed`` sums them, so nothing piles up unread.
    """

    _SUMMED = ("events", "bytes_htod", "bytes_dtoh", "gpu_faults", "cpu_faults")
    #: The most records staged before ``feed`` sums them itself.
    STAGED = 1 << 16

    def __init__(self, history: np.ndarray | None = None) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, int] = dict.fromkeys(self._SUMMED, 0)
        self._counts: dict[str, int] = {}
        self._staged = StagedRecords()
        if history is not None and len(history):
            self.feed(history)

    def feed(self, records: np.ndarray) -> None:
        if not len(records):
            return
        with self._lock:
            self._staged.add(records)
            if len(self._staged) >= self.STAGED:
                self._sum_staged()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            self._sum_staged()
            return {**self._totals, "counts": dict(self._counts)}

    def _sum_staged(self) -> None:
        records = self._staged.take()
        if not len(records):
            return
        part = ul.Trace(records).summary()
        for key in self._SUMMED:
            self._totals[key] += part[key]
        for name, n in part["counts"].items():
            self._counts[name] = self._counts.get(name, 0) + n


def describe_buffer(buf: Any, *, earlier: Mapping[str, Any] | None = None,
                    advice_current: bool = False) -> dict[str, Any]:
    """One allocation as plain data: identity, residency (page states, pages per category), advice.

    ``earlier``: an earlier description of the same buffer. Whether it is managed never changes, so it is kept
    rather than asked of the backend again; and so is its advice where ``advice_current`` says it is still in force
    (:attr:`~uvm_lab.residency_map.ResidencyTracker.advice_changes` has not moved since it was read)."""
    res = ul.residency(buf)
    managed = bool(buf.is_managed) if earlier is None else earlier["is_managed"]
    return {
        "id": int(buf.id),
        "label": str(buf.label or ""),
        "size": int(buf.size),
        "address": int(buf.ptr),
        "is_managed": managed,
        "page_size": int(res.page_size),
        "states": np.asarray(res.states, dtype=np.uint8),   # the map's own copy, read once
        "category_pages": _category_pages(res.pages_by_state),   # the map's one pass over its pages
        # One query for all three, where it may have changed.
        "advice": earlier["advice"] if earlier is not None and advice_current else buf.advice if managed else None,
    }


class LiveAllocations:
    """The live buffers, described (:func:`describe_buffer`), kept current at the cost of what changed.

    Each :meth:`refresh` asks the residency tracker where pages or advice changed since the last one
    (:meth:`~uvm_lab.residency_map.ResidencyTracker.changes`) and describes again only the buffers there and
    the new ones; every other buffer keeps the very same description object, so a view can tell by identity
    what it need not redraw. The list of buffers is read again only when one was made or freed
    (:func:`~uvm_lab.buffer.live_generation`). A view at 1,000 allocations and 16 M pages then costs what a
    loop changes, not what the device holds. Not thread-safe: one reader each.
    """

    def __init__(self) -> None:
        self._cursor: int | None = None
        self._generation: int | None = None
        self._buffers: dict[int, weakref.ref[Any]] = {}   # by id, oldest first
        self._by_address = _ByAddress.of([])
        self._described: dict[int, dict[str, Any]] = {}   # by id, in the order of _buffers
        # By id: the tracker's advice_changes when that description's advice was read; kept while it holds.
        self._advice_read: dict[int, int] = {}
        # Per buffer of _by_address: the refresh at which its pages changed and it waited to be described again, or
        # -1. As an array: a loop changes a hundred maps between two refreshes, each kept at array speed.
        self._waiting = np.zeros(0, np.int64)
        self._refreshes = 0
        self._changed: frozenset[int] = frozenset()
        self._relisted = False
        self._managed_bytes = 0

    @property
    def managed_bytes(self) -> int:
        """The bytes of every live managed buffer, as of the last :meth:`refresh`."""
        return self._managed_bytes

    @property
    def described(self) -> Mapping[int, dict[str, Any]]:
        """Every live buffer's description as of the last :meth:`refresh`, by id, oldest first."""
        return MappingProxyType(self._described)

    @property
    def relisted(self) -> bool:
        """Whether the last :meth:`refresh` listed the buffers again: only then can one have gone."""
        return self._relisted

    @property
    def changed(self) -> frozenset[int]:
        """The buffers the last :meth:`refresh` described again (the new ones among them)."""
        return self._changed

    def refresh(self, first: Collection[int] | None = None, others: int | None = None) -> Mapping[int, dict[str, Any]]:
        """Every live buffer's description, by id, oldest first: :attr:`described`, a read-only view that later
        refreshes may change, not a copy (a live view's updates read it 20 times a second, and a list of a thousand
        would be made for nothing); ``dict()`` of it keeps this refresh's.

        A view that shows only some maps names them in ``first``: those are described again whenever they
        change, and at most ``others`` other changed buffers a refresh (None: every one); the rest keep their
        last description until a later refresh reaches them. A new buffer is always described.
        """
        tracker = get_tracker()
        if self._cursor is None:
            cursor, ranges = tracker.changes(0)[0], None   # the first time: everything
        else:
            cursor, ranges = tracker.changes(self._cursor)
        # Before any advice is read: advice that changes meanwhile is read again at the next refresh.
        advice = tracker.advice_changes
        generation = live_generation()
        if generation != self._generation:   # made or freed since: list them again (before the cursor moves on)
            self._relist(cursor, ranges, generation, first, others, advice)
        else:
            self._update(cursor, ranges, first, others, advice)
        return self.described

    def _update(self, cursor: int, ranges: np.ndarray | None, first: Collection[int] | None,
                others: int | None, advice: int) -> None:
        """:meth:`refresh` for the same buffers as last time: only the changed ones are visited, and nothing is
        noted until all are described, so a refresh that fails part way reports the same changes again."""
        by_address = self._by_address
        waiting = by_address.wait(ranges, self._waiting, self._refreshes)
        ids = by_address.ids
        if first is None or others is None:
            todo = [ids[p] for p in _longest_waiting(waiting, len(waiting))]
        else:   # the favoured ones and the `others` that waited longest: not the whole backlog
            todo = [i for i in first if (p := by_address.position.get(i)) is not None and waiting[p] >= 0]
            if others > 0:   # of the longest waiting, enough that `others` of them are not favoured
                oldest = (ids[p] for p in _longest_waiting(waiting, others + len(todo)))
                todo += itertools.islice((i for i in oldest if i not in first), others)
        fresh = self._describe(todo, first, others, advice)
        for alloc_id, plain in fresh.items():
            waiting[by_address.position[alloc_id]] = -1
            if plain is None:
                self._described.pop(alloc_id, None)   # freed since it was listed (the list is read again once it is)
                self._advice_read.pop(alloc_id, None)
            else:
                self._described[alloc_id] = plain
                self._advice_read[alloc_id] = advice
        self._waiting, self._refreshes = waiting, self._refreshes + 1
        self._cursor, self._changed, self._relisted = cursor, frozenset(i for i, p in fresh.items() if p), False

    def _relist(self, cursor: int, ranges: np.ndarray | None, generation: int, first: Collection[int] | None,
                others: int | None, advice: int) -> None:
        """:meth:`refresh` when buffers were made or freed: the list read again, every new one described."""
        live = ul.live_buffers()
        buffers = {buf.id: weakref.ref(buf) for buf in live}
        by_address = _ByAddress.of([buf for buf in live if buf.size])   # an empty one holds no page
        # Those waiting still, in the order they wait, then those changed since, in address order.
        before = self._by_address.ids
        pending = {before[p]: int(self._waiting[p]) for p in np.flatnonzero(self._waiting >= 0).tolist()}
        changed = by_address.wait(ranges, np.full(len(by_address.ids), -1, np.int64), self._refreshes)
        for p in np.flatnonzero(changed >= 0).tolist():
            pending.setdefault(by_address.ids[p], self._refreshes)
        # A description is kept unless its buffer was renamed meanwhile (renaming bumps the generation too).
        kept = {i: plain for i in buffers if (plain := self._described.get(i)) is not None
                and (buf := buffers[i]()) is not None and plain["label"] == str(buf.label or "")}
        todo = [i for i in sorted(pending, key=pending.__getitem__) if i in buffers]
        fresh = self._describe(todo + [i for i in buffers if i not in kept and i not in pending], first, others,
                               advice, buffers, kept)
        described = {i: plain for i in buffers if (plain := fresh[i] if i in fresh else kept.get(i)) is not None}
        waiting = np.full(len(by_address.ids), -1, np.int64)
        for alloc_id, at in pending.items():
            where = by_address.position.get(alloc_id)
            if where is not None and alloc_id in described and alloc_id not in fresh:
                waiting[where] = at
        # Only now: a refresh that failed part way reports the same changes again next time.
        self._described, self._cursor, self._changed = described, cursor, frozenset(i for i, p in fresh.items() if p)
        self._advice_read = {i: advice if i in fresh else self._advice_read.get(i, -1) for i in described}
        self._buffers, self._by_address, self._generation, self._relisted = buffers, by_address, generation, True
        self._waiting, self._refreshes = waiting, self._refreshes + 1
        self._managed_bytes = sum(plain["size"] for plain in described.values() if plain["is_managed"])

    def _describe(self, todo: list[int], first: Collection[int] | None, others: int | None, advice: int,
                  buffers: Mapping[int, weakref.ref[Any]] | None = None,
                  described: Mapping[int, Any] | None = None) -> dict[int, dict[str, Any] | None]:
        """Descriptions of ``todo``, in order: all of those in ``first`` (None: every one), and at most ``others``
        of the rest that have one already (None: every one); None for one freed since it was listed. A
        description's advice is read again only where it was read before ``advice`` (the tracker's
        ``advice_changes`` now)."""
        buffers = self._buffers if buffers is None else buffers
        described = self._described if described is None else described
        allowance = others
        fresh: dict[int, dict[str, Any] | None] = {}
        for alloc_id in todo:
            favoured = first is None or alloc_id in first
            if alloc_id in described and not favoured and allowance is not None:
                if allowance <= 0:
                    continue   # keeps its last description: a later refresh reaches it
                allowance -= 1
            buf = buffers[alloc_id]()
            try:
                if buf is None:
                    raise BufferClosedError(f"buffer {alloc_id} was collected")
                fresh[alloc_id] = describe_buffer(buf, earlier=described.get(alloc_id),
                                                  advice_current=self._advice_read.get(alloc_id) == advice)
            except (BufferClosedError, InvalidArgumentError):
                fresh[alloc_id] = None
        return fresh


class _ByAddress:
    """The live buffers that hold pages, sorted by address (they do not overlap): which ones a range of addresses
    meets is then a slice, found by two searches."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray, ids: list[int]) -> None:
        self.starts, self.ends, self.ids = starts, ends, ids
        self.position = {alloc_id: p for p, alloc_id in enumerate(ids)}

    @classmethod
    def of(cls, buffers: Iterable[Any]) -> _ByAddress:
        order = sorted(buffers, key=lambda buf: buf.ptr)
        return cls(np.array([b.ptr for b in order], dtype=np.int64),
                   np.array([b.ptr + b.size for b in order], dtype=np.int64), [b.id for b in order])

    def wait(self, ranges: np.ndarray | None, waiting: np.ndarray, now: int) -> np.ndarray:
        """A copy of ``waiting`` (per buffer, the refresh since which it waits, or -1) where each buffer that
        overlaps one of ``ranges`` (sorted, disjoint ``[start, end)``; None: every one) and was not waiting waits
        since ``now``."""
        if ranges is None:
            waiting = waiting.copy()
            waiting[waiting < 0] = now
            return waiting
        return _waited(self.starts, self.ends, np.ascontiguousarray(ranges, dtype=np.int64).reshape(-1, 2), waiting,
                       now)


@njit(types.int64[::1](types.int64[::1], types.int64[::1], types.int64[:, ::1], types.int64[::1], types.int64),
      cache=True)
def _waited(starts: np.ndarray, ends: np.ndarray, ranges: np.ndarray, waiting: np.ndarray, now: int) -> np.ndarray:
    # Per range, the buffers it meets are a slice of those sorted by address: from the first that ends past its
    # start to the last that starts before its end. Compiled, the copy too (see .throttle): a loop changes a hundred
    # maps between two refreshes.
    waiting = waiting.copy()
    for r in range(len(ranges)):
        p = np.searchsorted(ends, ranges[r, 0], side="right")
        stop = np.searchsorted(starts, ranges[r, 1], side="left")
        while p < stop:
            if waiting[p] < 0:
                waiting[p] = now
            p += 1
    return waiting


def _longest_waiting(waiting: np.ndarray, k: int) -> list[int]:
    """The positions of the ``k`` buffers (at most) that waited longest (``waiting``: since when, or -1), in order;
    of two that wait since one refresh, the first by address."""
    return _longest(waiting, k).tolist()


@njit(types.int64[::1](types.int64[::1], types.int64), cache=True)
def _longest(waiting: np.ndarray, k: int) -> np.ndarray:
    # Compiled (see .throttle). The k least keys are found without sorting the backlog: a partition gives the k-th.
    queue = np.flatnonzero(waiting >= 0)
    keys = waiting[queue] * len(waiting) + queue   # distinct: since when, then where
    if 0 <= k < len(queue):
        if k == 0:
            return queue[:0].copy()
        kth = np.partition(keys, k - 1)[k - 1]
        keep = keys <= kth
        queue, keys = queue[keep], keys[keep]
    return queue[np.argsort(keys)]


def collect_snapshot(totals: EventTotals | None = None, live: LiveAllocations | None = None, *,
                     first: Collection[int] | None = None, others: int | None = None) -> dict[str, Any]:
    """Everything a view shows, read through the public API (see the module docstring for the shape).

    With ``live``, allocations whose pages did not change since its last refresh keep their descriptions, and
    ``first`` and ``others`` say which changed ones to describe again (:meth:`LiveAllocations.refresh`).
    """
    backend = ul.get_backend()
    free, total = backend.mem_info()
    devices = [{"device": d, "free": int(f), "total": int(t), "used": int(t - f)}
               for d, (f, t) in enumerate(gpu_memory(backend))]
    bus = get_bus()
    allocations = list((live or LiveAllocations()).refresh(first, others).values())
    chain = ul.mr.resource_chain(ul.mr.get_current_device_resource())
    stats = next((dict(r.allocation_counts) for r in chain if hasattr(r, "allocation_counts")), None)
    # What reads the bus behind it, each alike: threaded subscriptions (inline ones never wait) and history readers.
    behind: list[Subscription | HistoryReader] = [*(s for s in bus.subscriptions() if not s.inline), *bus.readers()]
    return {
        "backend": backend.name,
        "device_count": int(backend.device_count()),
        "time_ns": int(backend.now_ns()),
        "memory": {"free": int(free), "total": int(total), "used": int(total - free), "devices": devices},
        "events": {"published": int(bus.published), "dropped": int(bus.dropped),
                   "subscriptions": [{"name": r.name, "waiting": r.waiting, "dropped": r.dropped} for r in behind]},
        "totals": totals.snapshot() if totals is not None else None,
        "resource": [type(r).__name__ for r in chain],
        "resource_stats": stats,
        "allocations": allocations,
    }


def category_pages(states: np.ndarray) -> dict[str, int]:
    """Pages in each category (:data:`~uvm_lab.page_states.CATEGORY_NAMES`, every one, in order) of ``states``."""
    # Pages by state first (256 counters), then each state's pages to its category: one pass over the pages.
    return _category_pages(count_states(_page_states(states)))


def category_table(allocations: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Each allocation's pages in each category, as an ``(allocations, categories)`` int64 array whose columns follow
    :data:`~uvm_lab.page_states.CATEGORY_NAMES`: a view of a thousand rows reads it in one step."""
    # A description's category_pages lists every category, in that order (_category_pages).
    counts = itertools.chain.from_iterable(alloc["category_pages"].values() for alloc in allocations)
    k = len(CATEGORY_NAMES)
    return np.fromiter(counts, dtype=np.int64, count=len(allocations) * k).reshape(len(allocations), k)


def _category_pages(by_state: np.ndarray) -> dict[str, int]:
    """:func:`category_pages` from the pages in each of the 256 states."""
    by_category = _fold(np.ascontiguousarray(by_state, dtype=np.int64), _STATE_CATEGORY, len(CATEGORY_NAMES))
    return dict(zip(CATEGORY_NAMES, by_category.tolist(), strict=True))


@njit(types.int64[::1](types.Array(types.int64, 1, "C", readonly=True), types.uint8[::1], types.int64), cache=True)
def _fold(by_state: np.ndarray, category: np.ndarray, k: int) -> np.ndarray:
    # Each state's pages added to its category's, compiled: np.bincount's weights go through floats, and a live view
    # counts every map on screen that changed.
    out = np.zeros(k, np.int64)
    for state in range(len(by_state)):
        out[category[state]] += by_state[state]
    return out


_STATE_CATEGORY = categories(np.arange(256, dtype=np.uint8))   # the category of every page state


def shown_categories(device_count: int, present: Iterable[str] = ()) -> tuple[str, ...]:
    """The categories a view lists for a device of ``device_count`` GPUs, in the order views list them.

    Each GPU of the device, "gpus" where there are two or more, then host, both, unknown and nowhere; and
    any other category named in ``present`` (one that holds pages, say), in its place.
    """
    if isinstance(device_count, bool) or not isinstance(device_count, (int, np.integer)) or device_count < 0:
        raise InvalidArgumentError(f"device_count must be a whole number >= 0, got {device_count!r}",
                                   value=device_count, expected="a whole number >= 0")
    present = set(present)
    if strangers := present - set(CATEGORY_NAMES):
        raise InvalidArgumentError(f"no page category is named {', '.join(map(repr, sorted(strangers)))}; the "
                                   f"categories are {', '.join(CATEGORY_NAMES)}", value=sorted(strangers),
                                   expected="names from uvm_lab.page_states.CATEGORY_NAMES")
    gpus = min(int(device_count), MAX_GPUS)
    wanted = {*(f"gpu:{d}" for d in range(gpus)), *(("gpus",) if gpus > 1 else ()), "host", "both", "unknown",
              "nowhere", *present}
    return tuple(name for name in _DISPLAY_ORDER if name in wanted)


# GPUs first, one by one and then together; then the host, both, and the two that hold no known copy.
_DISPLAY_ORDER = (*(f"gpu:{d}" for d in range(MAX_GPUS)), "gpus", "host", "both", "unknown", "nowhere")


def bin_states(states: np.ndarray, n_bins: int, *, bins: tuple[int, int] | None = None,
               counts: bool = True) -> dict[str, np.ndarray]:
    """Group pages into at most ``n_bins`` equal runs; per bin: page range, pages per category, majority category.

    ``states`` is ``ResidencyMap.states``. Returns columns ``first``, ``last`` (page indices, inclusive),
    one per name of :data:`~uvm_lab.page_states.CATEGORY_NAMES` (the bin's pages in that category) and
    ``category`` (the code of the category most of the bin's pages are in; ties go to the lower code).
    Every bin but the last holds the same number of pages.

    ``bins=(first, stop)`` bins only those bins of the map's binning, reading only their pages: a view that
    keeps the bins of an earlier map re-bins where pages changed. ``counts=False`` leaves out the columns
    per category (``category`` is all some views send).
    """
    states = _page_states(states)
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise InvalidArgumentError(f"n_bins must be a whole number >= 1, got {n_bins!r}", value=n_bins,
                                   expected="a whole number >= 1")
    n, k = len(states), len(CATEGORY_NAMES)
    per_bin = bin_pages(n, n_bins)           # every bin but the last holds per_bin pages
    total = -(-n // per_bin)
    first_bin, stop_bin = (0, total) if bins is None else bins
    if not 0 <= first_bin <= stop_bin <= total:
        raise InvalidArgumentError(f"bins must be (first, stop) within the map's {total} bins, got {bins!r}",
                                   value=bins, expected=f"0 <= first <= stop <= {total}")
    starts = np.arange(first_bin * per_bin, min(stop_bin * per_bin, n), per_bin, dtype=np.int64)
    out = {"first": starts, "last": np.minimum(starts + per_bin, n) - 1}
    pages = states[first_bin * per_bin: stop_bin * per_bin]
    category = _rebin(pages, pages[:0], np.zeros(len(starts), np.uint8), per_bin, _STATE_CATEGORY, k)[0]
    if not counts:
        return {**out, "category": category}
    codes = categories(pages)
    if per_bin == 1:   # a page a bin: each bin's counts are one-hot
        return {**out, **{name: (codes == i).astype(np.int64) for i, name in enumerate(CATEGORY_NAMES)},
                "category": category}
    # One pass per category present (a map mostly holds two or three), over the full bins as rows.
    table = np.zeros((len(starts), k), dtype=np.int64)
    full = len(codes) // per_bin
    rows = codes[: full * per_bin].reshape(full, per_bin)
    for code in np.flatnonzero(np.bincount(codes, minlength=k)).tolist():
        table[:full, code] = np.count_nonzero(rows == code, axis=1)
    if full < len(starts):
        table[full] = np.bincount(codes[full * per_bin:], minlength=k)
    return {**out, **{name: table[:, i] for i, name in enumerate(CATEGORY_NAMES)}, "category": category}


def rebin(states: np.ndarray, n_bins: int, since: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[
        np.ndarray, np.ndarray]:
    """Each bin's majority category (:func:`bin_states`' ``category`` column: ties go to the lower code), and the
    pages each category gained, less those it lost, by code.

    ``since=(states, cells)`` is an earlier map of the same pages and what this gave for it: then only the bins
    holding a page whose state changed are binned again, ``cells`` itself comes back where none did, and the gains
    are the changed pages'. Without it, every bin, and the gains are every page's category.
    """
    states = _page_states(states)
    per_bin = bin_pages(len(states), n_bins)
    bins = -(-len(states) // per_bin)
    if since is None:
        before, cells = states[:0], np.zeros(bins, np.uint8)
    else:
        before, cells = _page_states(since[0]), _page_states(since[1])
        if len(before) != len(states) or len(cells) != bins:
            raise InvalidArgumentError(f"since must be a map of the same {len(states)} pages and its "
                                       f"{bins} bins, got {len(before)} and {len(cells)}",
                                       value=(len(before), len(cells)), expected="the same map's earlier states")
    out, gained = _rebin(states, before, cells, per_bin, _STATE_CATEGORY, len(CATEGORY_NAMES))
    if since is not None and out is cells and isinstance(since[1], np.ndarray):
        out = since[1]   # nothing changed: the caller's very cells (an empty map's were made anew above)
    return out, gained


@njit((types.uint8[::1], types.uint8[::1], types.bool_[::1], types.int64, types.uint8[::1], types.int64),
      cache=True)
def _majorities(states: np.ndarray, out: np.ndarray, dirty: np.ndarray, per_bin: int, category: np.ndarray,
                k: int) -> None:
    # The category of each dirty bin: the one most of its pages are in, ties to the lower code.
    n = len(states)
    if per_bin == 1:
        for c in range(len(out)):
            if dirty[c]:
                out[c] = category[states[c]]
        return
    tally = np.zeros(k, np.int64)
    for c in range(len(out)):
        if not dirty[c]:
            continue
        tally[:] = 0
        for i in range(c * per_bin, min(c * per_bin + per_bin, n)):
            tally[category[states[i]]] += 1
        best = 0
        for j in range(1, k):
            if tally[j] > tally[best]:
                best = j
        out[c] = best


@njit((types.uint8[::1], types.uint8[::1], types.uint8[::1], types.int64, types.uint8[::1], types.int64),
      cache=True)
def _rebin(states: np.ndarray, before: np.ndarray, cells: np.ndarray, per_bin: int, category: np.ndarray,
           k: int) -> tuple[np.ndarray, np.ndarray]:
    # Compiled (rebin): a live view bins every map it shows that changed. Pages are counted by state (256 counters)
    # and turned into categories once, and the dirty bins are binned in a pass of their own (_majorities): kept
    # apart, each loop stays short and cheap.
    n = len(states)
    gone, came = np.zeros(256, np.int64), np.zeros(256, np.int64)   # pages that left, and came to, each state
    dirty = np.zeros(len(cells), np.bool_)
    if len(before) == 0:   # everything
        for i in range(n):
            came[states[i]] += 1
        dirty[:] = True
    else:
        for i in range(n):
            was, now = before[i], states[i]
            if was != now:
                gone[was] += 1
                came[now] += 1
                dirty[i if per_bin == 1 else i // per_bin] = True   # a division costs more than the test
    gained = np.zeros(k, np.int64)
    changed = False
    for state in range(256):
        gained[category[state]] += came[state] - gone[state]
        changed |= came[state] > 0
    if not changed:
        return cells, gained
    out = cells.copy()
    _majorities(states, out, dirty, per_bin, category, k)
    return out, gained


def bin_pages(pages: int, n_bins: int) -> int:
    """The pages each bin of :func:`bin_states` holds (the last may hold fewer): ``n_bins`` at most."""
    return max(1, -(-pages // int(n_bins)))


def _page_states(states: Any) -> np.ndarray:
    """``states`` as a 1-D uint8 array, or InvalidArgumentError: page states are bytes, one per page."""
    array = np.asarray(states)
    if array.ndim == 1 and not len(array):
        return np.zeros(0, dtype=np.uint8)
    if array.ndim != 1 or not (array.dtype == np.uint8 or (array.dtype.kind in "iu" and
                                                           int(array.min()) >= 0 and int(array.max()) <= 255)):
        raise InvalidArgumentError("page states must be a 1-D array of bytes (0..255), one per page; got "
                                   f"{array.ndim}-D {array.dtype}", value=states, expected="a 1-D uint8 array")
    return np.ascontiguousarray(array, dtype=np.uint8)   # as the compiled passes (_rebin) take it
