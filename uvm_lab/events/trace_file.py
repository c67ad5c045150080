"""The trace file: event records on disk, versioned, and checked before anything is believed.

Layout, little-endian::

    magic     8 bytes   b"UVMTRACE"
    version   uint32    FORMAT_VERSION
    itemsize  uint32    bytes a record: the version's EVENT_DTYPE
    records   uint64    how many records follow
    records   records * itemsize bytes, EVENT_DTYPE rows

A file is read only once its header agrees with itself and with its length, so a truncated file, or one that
claims 10**15 records, is refused before any memory is set aside for it; then every record's kind must be one
uvm_lab knows. Files written as NumPy ``.npy`` arrays by earlier releases (``EVENT_DTYPE``, or the dtype before
events carried their source) are read too, through the same checks. Nothing is ever unpickled.

Every problem with a file is one :class:`~uvm_lab.errors.TraceFileError` that names the file and the problem.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from ..errors import InvalidArgumentError, TraceFileError, shown
from ..paths import file_path
from .schema import EVENT_DTYPE, EVENT_DTYPE_WITHOUT_SOURCE, EventKind, as_events

__all__ = ["FORMAT_VERSION", "MAGIC", "read_events", "write_events"]

MAGIC = b"UVMTRACE"
#: The layout written now; a file of another version is refused by name.
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIIQ")
_NPY_MAGIC = b"\x93NUMPY"
_KNOWN_KINDS = np.zeros(256, dtype=bool)
_KNOWN_KINDS[[int(kind) for kind in EventKind]] = True


def write_events(path: str | os.PathLike[str], events: np.ndarray) -> None:
    """Write ``events`` (``EVENT_DTYPE``) to ``path`` in the current format."""
    target = Path(file_path(path))
    events = np.ascontiguousarray(events, dtype=EVENT_DTYPE)
    if (first := _first_unknown_kind(events)) is not None:   # a file load() would refuse is never written
        raise InvalidArgumentError(f"record {first} has kind {int(events['kind'][first])}, which no uvm_lab event "
                                   f"has: the trace cannot be saved", value=events, expected="uvm_lab event records")
    try:
        with open(target, "wb") as f:
            f.write(_HEADER.pack(MAGIC, FORMAT_VERSION, EVENT_DTYPE.itemsize, len(events)))
            f.write(events.tobytes())
    except OSError as exc:
        raise InvalidArgumentError(f"cannot write a trace to {os.fspath(target)!r}: {exc}", value=path,
                                   expected="a writable file path") from exc


def read_events(path: str | os.PathLike[str]) -> np.ndarray:
    """The records of the trace file at ``path``, as ``EVENT_DTYPE``; TraceFileError for anything else."""
    source = Path(file_path(path))
    try:
        with open(source, "rb") as f:
            length = os.fstat(f.fileno()).st_size
            start = f.read(len(MAGIC))
            if start == MAGIC:
                events = _read_current(f, source, length)
            elif start.startswith(_NPY_MAGIC):
                f.seek(0)
                events = _read_npy(f, source, length)
            else:
                raise _bad(source, f"it does not start with {MAGIC!r} (nor is it a .npy array of an earlier release)")
    except OSError as exc:
        raise TraceFileError(f"cannot read a trace from {os.fspath(source)!r}: {exc}", path=source) from exc
    if (first := _first_unknown_kind(events)) is not None:
        raise _bad(source, f"record {first} has kind {int(events['kind'][first])}, which no uvm_lab event has")
    return events


def _first_unknown_kind(events: np.ndarray) -> int | None:
    unknown = np.flatnonzero(~_KNOWN_KINDS[events["kind"]])
    return int(unknown[0]) if len(unknown) else None


def _read_current(f: object, source: Path, length: int) -> np.ndarray:
    rest = f.read(_HEADER.size - len(MAGIC))  # type: ignore[attr-defined]
    if len(rest) < _HEADER.size - len(MAGIC):
        raise _bad(source, f"its header is cut short ({len(MAGIC) + len(rest)} of {_HEADER.size} bytes)")
    _, version, itemsize, records = _HEADER.unpack(MAGIC + rest)
    if version != FORMAT_VERSION:
        raise _bad(source, f"it is format version {version}; this uvm_lab reads version {FORMAT_VERSION}")
    if itemsize != EVENT_DTYPE.itemsize:
        raise _bad(source, f"its records are {itemsize} bytes each; version {version}'s are {EVENT_DTYPE.itemsize}")
    return _records(f, source, length - _HEADER.size, records, EVENT_DTYPE)


def _read_npy(f: object, source: Path, length: int) -> np.ndarray:
    try:
        major, _ = np.lib.format.read_magic(f)  # type: ignore[arg-type]
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)  # type: ignore[arg-type]
    except Exception as exc:   # numpy's header parser raises ValueError, SyntaxError, tokenize's errors ...
        raise _bad(source, f"its .npy header cannot be read ({type(exc).__name__}: {shown(str(exc))})") from exc
    if dtype not in (EVENT_DTYPE, EVENT_DTYPE_WITHOUT_SOURCE):
        raise _bad(source, f"it holds {shown(str(dtype))} values, not uvm_lab events")
    if len(shape) != 1 or fortran:
        raise _bad(source, f"its array has shape {shape}; a trace is one row of records")
    return as_events(_records(f, source, length - f.tell(), shape[0], dtype))  # type: ignore[attr-defined]


def _records(f: object, source: Path, left: int, records: int, dtype: np.dtype) -> np.ndarray:
    """``records`` rows of ``dtype``, once the bytes ``left`` in the file are exactly that many."""
    if records * dtype.itemsize != left:
        raise _bad(source, f"its header says {records:,} records ({records * dtype.itemsize:,} bytes) but "
                           f"{left:,} bytes follow: the file is cut short or was changed")
    data = f.read(left)  # type: ignore[attr-defined]
    if len(data) != left:
        raise _bad(source, f"{left - len(data):,} bytes could not be read")
    return np.frombuffer(data, dtype=dtype).copy()


def _bad(source: Path, problem: str) -> TraceFileError:
    return TraceFileError(f"{os.fspath(source)!r} is not a trace uvm_lab can read: {problem}", path=source)
