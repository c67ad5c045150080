"""Where in the user's code each event came from: the ``source`` field of every record.

An event that uvm_lab's API causes (an allocation, a free, a prefetch, advice, a simulated kernel's faults)
carries the id of the line of user code that called in: the notebook cell and line, or ``file:line`` outside a
notebook. :func:`capture` finds that line by walking the call stack outward past uvm_lab's own frames, the
standard library's and installed packages' (so a call made through CuPy or PyTorch is charged to the line that
called them), and interns it in the process-wide :class:`SourceTable`; a record holds only the id.

Events from the driver (CUPTI's faults and migrations, migrations the host's page tables show) have no caller:
the bus stamps them with the notebook cell running when they are published (:func:`stamp`), or the last one to
run, since work a cell started may finish after it. The end of a cell flushes the bus, so what the driver has
already reported by then is charged to that cell.

Ids are small integers, 0 meaning "unknown". The table is bounded (:data:`CAPACITY` lines); past it, new lines
get 0 and :attr:`SourceTable.dropped` counts them.

Examples
--------
>>> with ul.record() as trace:
...     buf.prefetch("gpu")
>>> trace.to_pandas()[["kind", "cell", "source"]]
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator
from types import CodeType
from typing import NamedTuple

import numpy as np

from ..errors import InvalidArgumentError
from .schema import EventKind

__all__ = ["CAPACITY", "TOTALS", "Source", "SourceTable", "acting_for", "begin_cell", "capture", "capturing",
           "end_cells", "get_sources", "python_capture", "running_cell", "set_capturing", "set_cell_namer", "stamp",
           "texts", "totals"]

#: The most distinct lines the table keeps.
CAPACITY = 1 << 16


class Source(NamedTuple):
    """One line of user code: its file, line (0: the cell as a whole), notebook cell, and function."""

    file: str
    line: int
    cell: int | None
    function: str

    @property
    def text(self) -> str:
        """``"In [3], line 5"`` in a notebook (``"In [3]"`` for the cell as a whole), ``"train.py:42"`` outside."""
        if self.cell is not None:
            return f"In [{self.cell}], line {self.line}" if self.line else f"In [{self.cell}]"
        name = os.path.basename(self.file)
        return f"{name}:{self.line}" if self.line else name   # no line: a tool acting for the user


class SourceTable:
    """Interned source lines, by id (0 is "unknown"). Thread-safe; at most ``capacity`` lines."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise InvalidArgumentError(f"capacity must be a whole number of lines >= 1, got {capacity!r}",
                                       value=capacity, expected="an int >= 1")
        self.capacity = capacity
        self._ids: dict[Source, int] = {}
        self._sources: list[Source | None] = [None]   # by id; id 0 is "unknown"
        self._texts: list[str] = [""]
        self._lock = threading.Lock()
        self.dropped = 0   #: lines that found the table full (their events carry 0)

    def __len__(self) -> int:
        return len(self._sources) - 1

    def intern(self, source: Source) -> int:
        """The id of ``source``, added if new (0 if the table is full)."""
        found = self._ids.get(source)
        if found is not None:
            return found
        with self._lock:
            found = self._ids.get(source)
            if found is not None:
                return found
            if len(self._sources) > self.capacity:
                self.dropped += 1
                return 0
            new = len(self._sources)
            self._sources.append(source)
            self._texts.append(source.text)
            self._ids[source] = new
            return new

    def describe(self, source_id: int) -> Source | None:
        """The line behind ``source_id`` (None for 0, "unknown")."""
        if isinstance(source_id, bool) or not isinstance(source_id, (int, np.integer)) or \
                not 0 <= source_id < len(self._sources):
            raise InvalidArgumentError(f"no source has id {source_id!r}; ids run from 0 to {len(self)}",
                                       value=source_id, expected=f"an int from 0 to {len(self)}")
        return self._sources[int(source_id)]

    def texts(self, ids: np.ndarray) -> list[str]:
        """Each id's line as text (:attr:`Source.text`; "" for 0 and for ids this table never gave out)."""
        return self._column(ids, self._texts, "")

    def cells(self, ids: np.ndarray) -> list[int | None]:
        """Each id's notebook cell (its execution count), None outside a notebook or for 0."""
        sources = self._sources
        return self._column(ids, [s.cell if s is not None else None for s in sources], None)

    @staticmethod
    def _column(ids: np.ndarray, by_id: list, missing: object) -> list:
        ids = np.asarray(ids)
        if ids.dtype.kind not in "ui":
            raise InvalidArgumentError(f"ids must be an integer array, got dtype {ids.dtype}", value=ids,
                                       expected="an array of source ids")
        # Few distinct lines, many events: look each one up once.
        unique, inverse = np.unique(ids, return_inverse=True)
        values = [by_id[u] if 0 <= u < len(by_id) else missing for u in unique.tolist()]
        return [values[i] for i in inverse.reshape(-1).tolist()]


_table = SourceTable()


def get_sources() -> SourceTable:
    """The process-wide table that every record's ``source`` refers to."""
    return _table


def texts(ids: np.ndarray) -> list[str]:
    """Each id's source line as text, from the process-wide table ("" for 0)."""
    return _table.texts(ids)


# -- which frame is the user's --------------------------------------------------------------------------------

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# The standard library's and installed packages' folders: a call made through them (contextlib, CuPy) is
# charged to the user's line that made it.
_LIBRARIES = tuple(sorted({os.path.realpath(p) + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")
                           if (p := sysconfig.get_paths().get(key))} | {_PACKAGE}))
_INTERNAL = -1

_cell_namer: Callable[[str], int | None] | None = None


def _not_users(filename: str) -> bool:
    if filename.startswith("<") and not filename.startswith("<ipython-input-"):
        return True   # <frozen runpy>, <string>: nowhere a user could look
    return filename.startswith(_LIBRARIES) or os.path.realpath(filename).startswith(_LIBRARIES)


def _resolve(code: CodeType, line: int) -> int:
    """The source id of a frame running ``code`` at ``line``, or -1 for a frame that is not the user's."""
    filename = code.co_filename
    if _not_users(filename):
        return _INTERNAL
    cell = _cell_namer(filename) if _cell_namer is not None else None
    return _table.intern(Source(filename, line or 0, cell, code.co_qualname))


# Code objects that are not the user's, and the answers for user lines by (code, instruction offset): keyed by
# id (a code object's own hash reads its whole body), holding the code object so that its id is not reused.
_not_users_code: dict[int, CodeType] = {}
_walked: dict[tuple[int, int], tuple[CodeType, int]] = {}
_walk_enabled = True


def python_capture() -> int:
    """:func:`capture`'s walk, in Python: what runs where the compiled one was not built (same answers)."""
    if not _walk_enabled:
        return 0
    if _acting:
        return _acting
    f = sys._getframe(1)   # the caller: this frame is ours, and its offset moves as it runs
    while f is not None:
        code = f.f_code
        if id(code) not in _not_users_code:
            key = (id(code), f.f_lasti)
            held = _walked.get(key)
            if held is None:
                if len(_walked) >= 4096:
                    _walked.clear()
                answer = _resolve(code, f.f_lineno or 0)
                if answer == _INTERNAL:
                    if len(_not_users_code) >= 4096:
                        _not_users_code.clear()
                    _not_users_code[id(code)] = code
                    f = f.f_back   # type: ignore[assignment]
                    continue
                held = _walked[key] = (code, answer)
            return held[1]
        f = f.f_back   # type: ignore[assignment]
    return 0


try:
    from . import _sources as _compiled  # type: ignore[attr-defined]
except ImportError:   # built without a C compiler
    _compiled = None

#: The source id of the user's line that is calling (0 if none): compiled where it was built.
capture: Callable[[], int] = _compiled.capture if _compiled is not None else python_capture
if _compiled is not None:
    _compiled.set_resolver(_resolve)


def _set_enabled(on: bool) -> None:
    global _walk_enabled
    _walk_enabled = on
    if _compiled is not None:
        _compiled.set_enabled(on)


def _forget() -> None:
    _walked.clear()
    _not_users_code.clear()
    if _compiled is not None:
        _compiled.clear()


_capturing = True


def capturing() -> bool:
    """Whether events capture the user's line (on by default)."""
    return _capturing


def set_capturing(on: bool) -> None:
    """Turn the capture of user lines on or off (off: API events carry the running cell, if any, only)."""
    global _capturing
    if not isinstance(on, bool):
        raise InvalidArgumentError(f"on must be True or False, got {on!r}", value=on, expected="a bool")
    _capturing = on
    _set_enabled(on)


def set_cell_namer(namer: Callable[[str], int | None] | None) -> None:
    """Name notebook cells: ``namer(filename)`` gives the execution count of the cell compiled under that name,
    or None. Installed by ``%load_ext uvm_lab``; lines captured from then on carry their cell."""
    global _cell_namer
    if namer is not None and not callable(namer):
        raise InvalidArgumentError(f"namer must be callable or None, got {namer!r}", value=namer,
                                   expected="a callable taking a filename, or None")
    _cell_namer = namer
    _forget()   # answers given without the namer name no cell


# -- the running cell ----------------------------------------------------------------------------------------

_running = 0
_acting = 0


@contextlib.contextmanager
def acting_for(name: str) -> Iterator[int]:
    """Charge what happens inside to ``name``, a tool acting for the user (the lab view's controls), not to
    the line or cell that happens to be on the stack or to have run last. Yields its source id.

    Records stamped after the block are the running cell's again: flush the bus inside it."""
    global _acting
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError(f"a tool's name must be a non-empty string, got {name!r}", value=name,
                                   expected="a name such as 'UVM Lab view'")
    with _acting_lock:
        before = _acting
        _acting = _table.intern(Source(name, 0, None, ""))
        if _compiled is not None:
            _compiled.set_acting(_acting)
        try:
            yield _acting
        finally:
            _acting = before
            if _compiled is not None:
                _compiled.set_acting(before)


_acting_lock = threading.RLock()   # one tool at a time acts


def begin_cell(number: int) -> int:
    """Note that notebook cell ``number`` (its execution count) has started; returns its source id."""
    global _running
    if isinstance(number, bool) or not isinstance(number, int) or number < 0:
        raise InvalidArgumentError(f"a cell's number is its execution count, a whole number >= 0; got {number!r}",
                                   value=number, expected="an int >= 0")
    _running = _table.intern(Source("", 0, number, ""))
    return _running


def end_cells() -> None:
    """No cell runs any more (uvm_lab was unloaded): the driver's events are no longer charged to one."""
    global _running
    _running = 0


def running_cell() -> int:
    """The source id of the cell running now, or of the last one that ran (0 outside a notebook)."""
    return _running


def stamp(records: np.ndarray) -> np.ndarray:
    """``records`` with the acting tool's id (:func:`acting_for`), or else the running cell's, where their
    ``source`` is 0 (a copy where any changed)."""
    cell = _acting or _running
    if not cell:
        return records
    unknown = records["source"] == 0
    if not unknown.any():
        return records
    records = records.copy()
    records["source"][unknown] = cell
    return records


#: What :func:`totals` counts for each line, its columns in order.
TOTALS = ("events", "gpu_faults", "cpu_faults", "bytes_htod", "bytes_dtoh", "bytes_dtod")

_TOTALLED = {  # column of TOTALS -> (the kind of record it sums, whether it sums the record's value or bytes)
    1: (EventKind.GPU_PAGE_FAULT, "value"), 2: (EventKind.CPU_PAGE_FAULT, "value"),
    3: (EventKind.HTOD, "bytes"), 4: (EventKind.DTOH, "bytes"), 5: (EventKind.DTOD, "bytes"),
}


def totals(source: np.ndarray, kind: np.ndarray, value: np.ndarray,
           nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What each line caused: ``(ids, table)``, the distinct source ids (ascending) and an ``(n, 6)`` int64
    table of :data:`TOTALS` per id. Faults are counted as CUPTI counts them (a record's ``value``)."""
    ids, inverse = np.unique(source, return_inverse=True)
    table = np.zeros((len(ids), len(TOTALS)), dtype=np.int64)
    table[:, 0] = np.bincount(inverse, minlength=len(ids))
    for column, (event_kind, field) in _TOTALLED.items():
        mine = kind == event_kind
        if mine.any():
            weights = (value if field == "value" else nbytes)[mine].astype(np.float64)
            table[:, column] = np.bincount(inverse[mine], weights=weights, minlength=len(ids))
    return ids, table
