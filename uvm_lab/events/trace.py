"""Recorded traces: ``with record() as trace:`` keeps every event published inside the block."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidArgumentError
from .bus import EventBus, get_bus
from .schema import (
    EVENT_DTYPE,
    AccessType,
    Advice,
    EventKind,
    MemoryKind,
    MigrationCause,
    RemoteMapCause,
    UnobservedCause,
    is_inferred,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Trace", "record"]

_FAULTS = (EventKind.GPU_PAGE_FAULT, EventKind.CPU_PAGE_FAULT)
_MIGRATIONS = [int(EventKind.HTOD), int(EventKind.DTOH), int(EventKind.DTOD)]


def _decode_flags(kind: int, flags: int) -> tuple[str, str]:
    """``(cause, detail)``: CUPTI's flags mean a different enum for each kind."""
    try:
        k = EventKind(kind)
        if k.is_migration:
            return MigrationCause(flags).name.lower(), ""
        if k in _FAULTS:
            return "", AccessType(flags).name.lower()
        if k is EventKind.REMOTE_MAP:
            return RemoteMapCause(flags).name.lower(), ""
        if k is EventKind.ADVICE:
            return "", Advice(flags).name.lower()
        if k in (EventKind.SEGMENT_ALLOC, EventKind.SEGMENT_FREE):
            return "", MemoryKind(flags).name.lower()
        if k is EventKind.UNOBSERVED:
            return UnobservedCause(flags).name.lower(), ""
        if k is EventKind.PREFETCH:
            return ("user_inferred" if flags else "user"), ""
    except ValueError:
        pass
    return "", str(flags) if flags else ""


def _processor(p: int) -> str:
    return "host" if p == -1 else ("" if p < -1 else f"gpu:{p}")


class Trace:
    """The events of a recording, as one ``EVENT_DTYPE`` array."""

    def __init__(self, events: np.ndarray | None = None, *, bus: EventBus | None = None) -> None:
        self._chunks: list[np.ndarray] = [] if events is None else [events]
        self._events: np.ndarray | None = None
        self._bus = bus   # while recording: flushed before reading, so queued records are in

    def _add(self, records: np.ndarray) -> None:
        self._chunks.append(records.copy())
        self._events = None

    @property
    def events(self) -> np.ndarray:
        """All records, in the order they were published."""
        if self._bus is not None:
            self._bus.flush()
        if self._events is None:
            self._events = np.concatenate(self._chunks) if self._chunks else np.zeros(0, dtype=EVENT_DTYPE)
            self._chunks = [self._events]
        return self._events

    def __len__(self) -> int:
        return len(self.events)

    def of_kind(self, *kinds: EventKind) -> np.ndarray:
        ev = self.events
        return ev[np.isin(ev["kind"], [int(k) for k in kinds])]

    def to_pandas(self) -> pd.DataFrame:
        """One row per event: kind, start/end/duration (ns), address, bytes, value, src, dst, cause, detail,
        alloc_id, stream."""
        import pandas as pd

        ev = self.events
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
        })

    def summary(self) -> dict[str, Any]:
        """Counts per kind, bytes migrated each way (and of those, the inferred ones), faults taken, and the
        time the trace spans."""
        ev = self.events
        kinds = ev["kind"]
        counts = {EventKind(int(k)).name.lower(): int(n) for k, n in zip(*np.unique(kinds, return_counts=True),
                                                                          strict=True)}
        faults = ev[np.isin(kinds, [int(k) for k in _FAULTS])]
        span = int(ev["end"].max() - ev["start"].min()) if len(ev) else 0
        return {
            "events": len(ev),
            "counts": counts,
            "bytes_htod": int(ev["bytes"][kinds == EventKind.HTOD].sum()),
            "bytes_dtoh": int(ev["bytes"][kinds == EventKind.DTOH].sum()),
            "bytes_dtod": int(ev["bytes"][kinds == EventKind.DTOD].sum()),
            # Of the three, the bytes no driver record reported: a completed prefetch's, or the host's page tables'.
            "bytes_inferred": int(ev["bytes"][np.isin(kinds, _MIGRATIONS) & is_inferred(ev["flags"])].sum()),
            "gpu_faults": int(faults["value"][faults["kind"] == EventKind.GPU_PAGE_FAULT].sum()),
            "cpu_faults": int(faults["value"][faults["kind"] == EventKind.CPU_PAGE_FAULT].sum()),
            "seconds": span / 1e9,
        }

    def save(self, path: str | Path) -> None:
        """Write the trace to ``path`` (NumPy ``.npy``), exactly: :meth:`load` gives back every field of
        every record.

        Raises
        ------
        InvalidArgumentError
            ``path`` is not a path, or cannot be written.
        """
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise InvalidArgumentError(f"path must be a file path, got {path!r}", value=path,
                                       expected="a str or os.PathLike")
        try:
            with open(path, "wb") as f:
                np.save(f, self.events, allow_pickle=False)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot write a trace to {os.fspath(path)!r}: {exc}", value=path,
                                       expected="a writable file path") from exc

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace written by :meth:`save`.

        Raises
        ------
        InvalidArgumentError
            ``path`` cannot be read, or does not hold uvm_lab events (another array, or not a ``.npy``).
        """
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise InvalidArgumentError(f"path must be a file path, got {path!r}", value=path,
                                       expected="a str or os.PathLike")
        try:
            events = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise InvalidArgumentError(f"cannot read a trace from {os.fspath(path)!r}: {exc}", value=path,
                                       expected="a file written by Trace.save") from exc
        if not isinstance(events, np.ndarray) or events.dtype != EVENT_DTYPE:
            raise InvalidArgumentError(f"{os.fspath(path)} does not hold uvm_lab events "
                                       f"(dtype {getattr(events, 'dtype', type(events).__name__)})", value=path,
                                       expected="a file written by Trace.save")
        return cls(events)

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
def record(bus: EventBus | None = None) -> Iterator[Trace]:
    """Record every event published while the block runs::

        with ul.record() as trace:
            ul.touch(buf, on="gpu")
        trace.to_pandas()
    """
    bus = bus or get_bus()
    trace = Trace(bus=bus)
    with bus.subscribe(trace._add):
        try:
            yield trace
        finally:
            bus.flush()
    trace._bus = None
