"""What a worker sends its client each interval: one small binary delta, the same for every backend.

A delta is a header and one row per GPU of the worker, packed little-endian with numpy::

    header  (HEADER)   version, seq, the GPUs that follow, the backend's clock, the worker's wall clock when it
                       read what it sends, and when the oldest event counted in it was seen; then what the interval
                       counted across the worker (events, CPU faults) and what it holds (bytes allocated, live
                       buffers, pages on the host, pages whose GPU copies are unknown), and what it could not count
                       (events its subscription dropped, ever)
    rows    (ROW)      per GPU: memory used and total; bytes moved in the interval from the host, to the host and
                       from a peer GPU; GPU faults and bytes evicted in the interval; pages the GPU holds now

Counts are of the interval (the client sums them); memory and pages are what was read at its end. ``seq``
counts a worker's deltas from 1, so a client tells a lost one from a quiet interval. A header is 88 bytes and a
row 64: a worker with one GPU sends 152 bytes a delta.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from ..errors import ProtocolError

__all__ = ["HEADER", "ROW", "VERSION", "Delta", "decode", "encode"]

VERSION: Final = 1

HEADER: Final = np.dtype([
    ("version", "<u2"), ("gpus", "<u2"), ("seq", "<u4"),
    ("time_ns", "<u8"),         # the backend's clock at the read (simulated time on the simulator)
    ("wall_ms", "<f8"),         # the worker's wall clock at the read, ms since the epoch
    ("oldest_ms", "<f8"),       # when the first event counted in this delta reached the reporter (0: none)
    ("events", "<u8"), ("cpu_faults", "<u8"),
    ("allocated", "<u8"), ("buffers", "<u8"), ("host_pages", "<u8"), ("unknown_pages", "<u8"),
    ("dropped", "<u8"),
])

ROW: Final = np.dtype([
    ("used", "<u8"), ("total", "<u8"),
    ("htod_bytes", "<u8"), ("dtoh_bytes", "<u8"), ("dtod_bytes", "<u8"),
    ("gpu_faults", "<u8"), ("evicted_bytes", "<u8"),
    ("pages", "<u8"),           # pages this GPU holds a copy of
])

_HEADER_NAMES: Final = HEADER.names or ()

#: The most GPUs a delta carries: more than any host has.
MAX_ROWS: Final = 64


@dataclass(frozen=True)
class Delta:
    """One decoded delta: its header as a dict of ints and floats, and its rows (a ``ROW`` array)."""

    header: dict[str, int | float]
    rows: np.ndarray

    @property
    def seq(self) -> int:
        return int(self.header["seq"])


def encode(header: dict[str, int | float], rows: np.ndarray) -> bytes:
    """Pack ``header`` (every field of ``HEADER`` but ``version`` and ``gpus``) and ``rows`` (a ``ROW`` array)."""
    if rows.dtype != ROW or rows.ndim != 1 or len(rows) > MAX_ROWS:
        raise ProtocolError(f"rows must be a 1-D ROW array of at most {MAX_ROWS}, got {rows.dtype} {rows.shape}",
                            command=None)
    head = np.zeros(1, dtype=HEADER)
    head["version"], head["gpus"] = VERSION, len(rows)
    for name, value in header.items():
        head[name] = value
    return head.tobytes() + rows.tobytes()


def decode(data: bytes) -> Delta:
    """The delta ``data`` holds.

    Raises
    ------
    ProtocolError
        ``data`` is not a delta of this version: too short, another version, or a length its header does not
        account for.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < HEADER.itemsize:
        raise ProtocolError(f"a delta is at least {HEADER.itemsize} bytes, got {_length(data)}", command=None)
    head = np.frombuffer(data, dtype=HEADER, count=1)[0]
    if int(head["version"]) != VERSION:
        raise ProtocolError(f"delta version {int(head['version'])}; this uvm_lab reads version {VERSION}",
                            command=None)
    gpus = int(head["gpus"])
    if gpus > MAX_ROWS or len(data) != HEADER.itemsize + gpus * ROW.itemsize:
        raise ProtocolError(f"a delta of {gpus} GPUs is {HEADER.itemsize + gpus * ROW.itemsize} bytes, got "
                            f"{len(data)}", command=None)
    rows = np.frombuffer(data, dtype=ROW, count=gpus, offset=HEADER.itemsize).copy()
    return Delta(header={name: head[name].item() for name in _HEADER_NAMES}, rows=rows)


def _length(data: object) -> str:
    return f"{len(data)} bytes" if isinstance(data, (bytes, bytearray, memoryview)) else type(data).__name__
