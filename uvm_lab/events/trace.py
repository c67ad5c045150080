"""Recorded traces: ``with record() as trace:`` keeps every event published inside the block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import deferred
from ..errors import InvalidArgumentError, shown
from .bus import PENDING_LIMIT, EventBus, Subscription, get_bus
from .causes import decode_flags
from .schema import (
    EVENT_DTYPE,
    EventKind,
    is_inferred,
)
from .sources import TOTALS, get_sources, totals
from .trace_file import read_events, write_events

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Trace", "record"]

_FAULTS = (EventKind.GPU_PAGE_FAULT, EventKind.CPU_PAGE_FAULT)
_MIGRATIONS = [int(EventKind.HTOD), int(EventKind.DTOH), int(EventKind.DTOD)]
_IS_MIGRATION = np.zeros(256, dtype=bool)
_IS_MIGRATION[_MIGRATIONS] = True


def _decode_flags(kind: int, flags: int) -> tuple[str, str]:
    """``(cause, detail)`` as ``to_pandas`` spells them: the enum members' names (:func:`.causes.decode_flags`),
    or the number itself where its kind's enum lacks it."""
    cause, detail = decode_flags(kind, flags)
    if cause is None and detail is None:
        return "", str(flags) if flags else ""
    return (cause.name.lower() if cause is not None else ""), (detail.name.lower() if detail is not None else "")


def _processor(p: int) -> str:
    return "host" if p == -1 else ("" if p < -1 else f"gpu:{p}")


class Trace:
    """The events of a recording, as one ``EVENT_DTYPE`` array."""

    def __init__(self, events: np.ndarray | None = None, *, bus: EventBus | None = None) -> None:
        self._chunks: list[np.ndarray] = [] if events is None else [events]
        self._events: np.ndarray | None = None
        self._bus = bus   # while recording: flushed before reading, so queued records are in
        self._subscription: Subscription | None = None   # while recording, and after: what it missed

    def _add(self, records: np.ndarray) -> None:
        self._chunks.append(records.copy())
        self._events = None

    @property
    def events(self) -> np.ndarray:
        """All records, in the order they were published."""
        if self._bus is not None:
            self._bus.flush(wait=False)
            if self._subscription is not None:
                self._subscription.drain()
        if self._events is None:
            self._events = np.concatenate(self._chunks) if self._chunks else np.zeros(0, dtype=EVENT_DTYPE)
            self._chunks = [self._events]
        return self._events

    @property
    def missed(self) -> int:
        """Events published while it recorded that it never got: the bus dropped them while the recording was
        too far behind (see :mod:`uvm_lab.events.bus`). 0 for a trace that was not recorded."""
        return self._subscription.dropped if self._subscription is not None else 0

    def __len__(self) -> int:
        return len(self.events)

    def of_kind(self, *kinds: EventKind) -> np.ndarray:
        ev = self.events
        return ev[np.isin(ev["kind"], [int(k) for k in kinds])]

    def to_pandas(self) -> pd.DataFrame:
        """One row per event: kind, start/end/duration (ns), address, bytes, value, src, dst, cause, detail,
        alloc_id, stream, and where it came from: ``cell`` (the notebook cell's execution count, or missing) and
        ``source`` (``"In [3], line 5"``, ``"train.py:42"``; ``"In [3]"`` for the driver's events during a cell;
        ``""`` where unknown). A notebook's cells are named so once ``%load_ext uvm_lab`` ran; before, a line of
        a cell reads as the file IPython compiled it from (``3870601278.py:7``). Faults' ``bytes`` are the range a
        fault record names, not bytes moved: sum the migrations' for those."""
        import pandas as pd

        ev = self.events
        table = get_sources()
        names = {int(k): k.name.lower() for k in EventKind}
        decoded = [_decode_flags(k, f) for k, f in zip(ev["kind"].tolist(), ev["flags"].tolist(), strict=True)]
        return pd.DataFrame({
            "kind": pd.Categorical([names.get(k, str(k)) for k in ev["kind"].tolist()]),
            "start": ev["start"].astype(np.int64),
            "end": ev["end"].astype(np.int64),
            "duration": (ev["end"] - ev["start"]).astype(np.int64),
            "address": ev["address"],
            "bytes": ev["bytes"].astype(np.int64),
            "value": ev["value"].astype(np.int64),
            "src": [_processor(p) for p in ev["src"].tolist()],
            "dst": [_processor(p) for p in ev["dst"].tolist()],
            "cause": [c for c, _ in decoded],
            "detail": [d for _, d in decoded],
            "alloc_id": ev["alloc_id"].astype(np.int64),
            "stream": ev["stream"],
            "cell": pd.array(table.cells(ev["source"]), dtype="Int64"),
            "source": table.texts(ev["source"]),
        })

    def by_source(self) -> pd.DataFrame:
        """What each line of user code caused, one row per source, most bytes moved first.

        Columns: ``source`` (as in :meth:`to_pandas`), ``cell``, ``events``, ``gpu_faults``, ``cpu_faults``
        (faults counted as CUPTI counts them, a record's ``value``), ``bytes_htod``, ``bytes_dtoh``, ``bytes_dtod``
        and ``bytes_moved`` (their sum).
        """
        import pandas as pd

        ev = self.events
        ids, table = totals(ev["source"], ev["kind"], ev["value"], ev["bytes"])
        names = get_sources()
        out = pd.DataFrame({
            "source": names.texts(ids),
            "cell": pd.array(names.cells(ids), dtype="Int64"),
            **{name: table[:, i] for i, name in enumerate(TOTALS)},
        })
        out["bytes_moved"] = out["bytes_htod"] + out["bytes_dtoh"] + out["bytes_dtod"]
        return out.sort_values(["bytes_moved", "events"], ascending=False, kind="stable").reset_index(drop=True)

    def summary(self) -> dict[str, Any]:
        """Counts per kind, bytes migrated each way (and of those, the inferred ones), faults taken, the time
        the trace spans, and the events it missed while recording (:attr:`missed`)."""
        ev = self.events
        kinds = ev["kind"]
        n = np.bincount(kinds, minlength=256)   # which kinds are there: sums only for those (small batches)

        def total(kind: EventKind, column: str) -> int:
            return int(ev[column][kinds == kind].sum()) if n[kind] else 0

        migrations = n[_MIGRATIONS].any()
        inferred = (is_inferred(ev["flags"]) & _IS_MIGRATION[kinds]) if migrations else None
        span = int(ev["end"].max() - ev["start"].min()) if len(ev) else 0
        return {
            "events": len(ev),
            "counts": {EventKind(k).name.lower(): int(n[k]) for k in np.flatnonzero(n).tolist()},
            "bytes_htod": total(EventKind.HTOD, "bytes"),
            "bytes_dtoh": total(EventKind.DTOH, "bytes"),
            "bytes_dtod": total(EventKind.DTOD, "bytes"),
            # Of the three, the bytes no driver record reported: a completed prefetch's, or the host's page tables'.
            "bytes_inferred": int(ev["bytes"][inferred].sum()) if inferred is not None else 0,
            "gpu_faults": total(EventKind.GPU_PAGE_FAULT, "value"),
            "cpu_faults": total(EventKind.CPU_PAGE_FAULT, "value"),
            "seconds": span / 1e9,
            "missed": self.missed,
        }

    def save(self, path: str | Path) -> None:
        """Write the trace to ``path`` (:mod:`uvm_lab.events.trace_file`'s versioned format), exactly:
        :meth:`load` gives back every field of every record.

        Raises
        ------
        InvalidArgumentError
            ``path`` is not a path, or cannot be written.
        """
        write_events(path, self.events)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace written by :meth:`save` (or, as a ``.npy`` array, by an earlier release).

        Raises
        ------
        TraceFileError
            ``path`` cannot be read, or is not such a trace: cut short, corrupted, another array, records of
            unknown kinds. The message says which.
        """
        return cls(read_events(path))   # a trace saved before events carried their source: sources unknown

    def to_chrome_trace(self, path: str | Path | None = None) -> dict[str, Any]:
        """Chrome/Perfetto trace JSON, returned or streamed to ``path``: see
        :func:`uvm_lab.tracing.export.to_chrome_trace`."""
        from ..tracing.export import to_chrome_trace

        return to_chrome_trace(self, path)

    def to_perfetto(self, path: str | Path) -> int:
        """Perfetto's protobuf trace, for ui.perfetto.dev: see :func:`uvm_lab.tracing.export.to_perfetto`."""
        from ..tracing.export import to_perfetto

        return to_perfetto(self, path)

    def to_rmm_csv(self, path: str | Path | None = None, **options: Any) -> str:
        """RMM's allocation-log CSV: see :func:`uvm_lab.tracing.export.to_rmm_csv`."""
        from ..tracing.export import to_rmm_csv

        return to_rmm_csv(self, path, **options)

    def __repr__(self) -> str:
        s = self.summary()
        return (f"<Trace {s['events']} events, {s['bytes_htod']} B HtoD, {s['bytes_dtoh']} B DtoH, "
                f"{s['gpu_faults']} GPU / {s['cpu_faults']} CPU faults, {s['seconds'] * 1e3:.3f} ms>")


@contextlib.contextmanager
def record(bus: EventBus | None = None, *, limit: int = PENDING_LIMIT, accesses: bool = False) -> Iterator[Trace]:
    """Record every event published while the block runs::

        with ul.record() as trace:
            ul.touch(buf, on="gpu")
        trace.to_pandas()

    The recording takes the events on a thread of its own. Should it fall more than ``limit`` records behind,
    what arrives meanwhile is dropped from it, and counted: :attr:`Trace.missed`, and ``summary()["missed"]``.
    Frees that garbage collection asked for before the block (:mod:`uvm_lab.deferred`) are done before it begins,
    so they are not in the recording.

    With ``accesses``, the recording also holds the simulator's modelled accesses (ACCESS records: every
    ``touch`` and access stream, page runs and all), so that :func:`uvm_lab.replay` replays it exactly; they
    are many, and the simulator publishes them only while a recording asks.
    """
    if bus is None:
        bus = get_bus()
    elif not isinstance(bus, EventBus):
        raise InvalidArgumentError(f"bus must be a uvm_lab EventBus or None, got {shown(bus)}", value=bus,
                                   expected="an EventBus, or None for the process's bus")
    if not isinstance(accesses, bool):
        raise InvalidArgumentError(f"accesses must be True or False, got {shown(accesses)}", value=accesses,
                                   expected="True or False")
    trace = Trace(bus=bus)
    # Frees that garbage collection already asked for belong before the recording, not in it.
    deferred.run()
    kinds = list(EventKind) if accesses else None
    with bus.subscribe(trace._add, kinds, limit=limit, name="ul.record()") as subscription:
        trace._subscription = subscription
        try:
            yield trace
        finally:
            bus.flush(wait=False)   # what the block's work queued is the recording's (leaving, it is delivered)
    trace._bus = None
