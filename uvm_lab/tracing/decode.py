"""CUPTI's unified-memory activity records, decoded in bulk into :data:`~uvm_lab.events.EVENT_DTYPE`.

A CUPTI activity buffer is a run of C structs. With only ``CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER``
enabled every struct is a ``CUpti_ActivityUnifiedMemoryCounter3`` (104 bytes, 8-byte aligned), so the
whole buffer is one NumPy structured array (:data:`CUPTI_UM_COUNTER3_DTYPE`) and decoding is a
handful of vectorised column operations, not one Python object per record.

What each CUPTI field becomes (CUPTI's documentation says which fields to ignore for which kind):

============== ============================================================================
counter kind   event
============== ============================================================================
HtoD/DtoH/DtoD ``bytes`` = ``value`` = bytes moved, ``flags`` = cause; ``src``/``dst`` from srcId/dstId,
               the host side of HtoD/DtoH from the kind (CUPTI 13 gives both ids as the GPU's)
GPU fault      ``src`` = ``dst`` = the faulting GPU (srcId), ``value`` = fault groups, ``flags`` = access
CPU fault      ``src`` = ``dst`` = host, ``value`` = 1 (CUPTI's value is the faulting instruction's
               program counter, which is dropped), ``flags`` = 0 (CUPTI gives no access type), no end
thrashing      ``bytes`` = the region, ``src`` = ``dst`` = none (CUPTI's srcId is a mask of devices)
throttling     ``src`` = ``dst`` = the throttled processor
remote map     ``src``/``dst``, ``bytes`` = the region, ``flags`` = the remote-map cause, no end
============== ============================================================================

A fault record names one faulting page but not the range the driver serviced, so ``bytes`` is 0 for
faults ("range unknown"); the residency tracker then applies the driver's first-touch rule itself.
CUPTI's host id (``0xFFFFFFFF``) becomes :data:`~uvm_lab.location.HOST_ID` (-1). Timestamps move onto
the backend's clock by adding ``clock_offset`` (see :func:`clock_offset`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..events.schema import EVENT_DTYPE, NO_PROCESSOR, EventKind
from ..location import HOST_ID

__all__ = [
    "CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER",
    "CUPTI_HOST_ID",
    "CUPTI_UM_COUNTER3_DTYPE",
    "clock_offset",
    "decode_buffer",
    "decode_records",
    "encode_records",
]

#: ``CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER``.
CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER = 25
#: ``CUPTI_UNIFIED_MEMORY_CPU_DEVICE_ID``: srcId/dstId of the host.
CUPTI_HOST_ID = 0xFFFFFFFF

#: ``CUpti_ActivityUnifiedMemoryCounter3``, field for field (CUPTI 12.8 and later; 104 bytes).
CUPTI_UM_COUNTER3_DTYPE = np.dtype({
    "names": ["kind", "counter_kind", "value", "start", "end", "address", "src_id", "dst_id", "stream_id",
              "process_id", "flags", "pad", "processors"],
    "formats": ["<i4", "<i4", "<u8", "<u8", "<u8", "<u8", "<u4", "<u4", "<u4", "<u4", "<u4", "<u4", ("<u8", (5,))],
    "offsets": [0, 4, 8, 16, 24, 32, 40, 44, 48, 52, 56, 60, 64],
    "itemsize": 104,
})

_MIGRATIONS = (EventKind.HTOD, EventKind.DTOH, EventKind.DTOD)
_SIZED = np.zeros(256, dtype=bool)          # counter kinds whose value is a size in bytes
_SIZED[[*_MIGRATIONS, EventKind.THRASHING, EventKind.REMOTE_MAP]] = True
_NO_END = np.zeros(256, dtype=bool)         # kinds whose end CUPTI says to ignore
_NO_END[[EventKind.CPU_PAGE_FAULT, EventKind.THRASHING, EventKind.REMOTE_MAP]] = True
_KNOWN = np.zeros(256, dtype=bool)
_KNOWN[1:9] = True


def decode_records(records: np.ndarray, *, clock_offset: int = 0) -> np.ndarray:
    """Decode an array of :data:`CUPTI_UM_COUNTER3_DTYPE` into events.

    Parameters
    ----------
    records
        CUPTI unified-memory counter records (any other activity kind in it is an error).
    clock_offset
        Nanoseconds added to CUPTI's timestamps to put them on the backend's clock.

    Returns
    -------
    numpy.ndarray
        One :data:`~uvm_lab.events.EVENT_DTYPE` record per input record whose counter kind is one of
        CUPTI's eight (records of an unknown counter kind are left out; compare lengths to count them).
        ``alloc_id`` is 0: see :mod:`uvm_lab.tracing.attribution`.

    Raises
    ------
    InvalidArgumentError
        ``records`` is not an array of that dtype, or holds records of another activity kind.
    """
    if not isinstance(records, np.ndarray) or records.dtype != CUPTI_UM_COUNTER3_DTYPE:
        raise InvalidArgumentError(
            f"records must be a numpy array of CUPTI_UM_COUNTER3_DTYPE, got "
            f"{getattr(records, 'dtype', type(records).__name__)}", value=records,
            expected="an array of CUpti_ActivityUnifiedMemoryCounter3 records")
    if isinstance(clock_offset, bool) or not isinstance(clock_offset, (int, np.integer)):
        raise InvalidArgumentError(f"clock_offset must be an int (nanoseconds), got {clock_offset!r}",
                                   value=clock_offset, expected="an int")
    records = records.reshape(-1)
    if len(records) and not (records["kind"] == CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER).all():
        bad = int(records["kind"][records["kind"] != CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER][0])
        raise InvalidArgumentError(
            f"the records hold activity kind {bad}, not only the unified-memory counter "
            f"({CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER})", value=bad,
            expected=f"activity kind {CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER}")
    ck = records["counter_kind"]
    known = (ck >= 0) & (ck < 256)
    known[known] = _KNOWN[ck[known]]
    if not known.all():
        records, ck = records[known], ck[known]
    n = len(records)
    out = np.zeros(n, dtype=EVENT_DTYPE)
    if not n:
        return out
    kind = ck.astype(np.uint8)
    out["kind"] = kind
    value = records["value"]
    # Whole columns, no masked assignments (each would be a pass of its own). CUPTI's uint32 ids cast to
    # int16 wrap 0xFFFFFFFF to -1, the host's id; device ordinals are small.
    src = records["src_id"].astype(np.int16)
    dst = records["dst_id"].astype(np.int16)
    host = np.int16(HOST_ID)
    # The direction is the counter kind's: CUPTI 13 reports srcId = dstId = the GPU for both HtoD and
    # DtoH (seen on an H100, driver 580), older releases the host as 0xFFFFFFFF. Both decode alike.
    htod, dtoh = kind == EventKind.HTOD, kind == EventKind.DTOH
    gpu_side_in = np.where(dst == host, src, dst)       # HtoD's destination
    gpu_side_out = np.where(src == host, dst, src)      # DtoH's source
    src, dst = np.where(htod, host, np.where(dtoh, gpu_side_out, src)), np.where(htod, gpu_side_in,
                                                                                   np.where(dtoh, host, dst))
    gpu_fault = kind == EventKind.GPU_PAGE_FAULT
    cpu_fault = kind == EventKind.CPU_PAGE_FAULT
    maskless = gpu_fault | (kind == EventKind.THROTTLING)          # only srcId means anything
    dst = np.where(maskless, src, dst)
    src = np.where(cpu_fault, host, src)
    dst = np.where(cpu_fault, host, dst)
    thrashing = kind == EventKind.THRASHING
    src = np.where(thrashing, np.int16(NO_PROCESSOR), src)
    dst = np.where(thrashing, np.int16(NO_PROCESSOR), dst)
    out["src"] = src
    out["dst"] = dst
    out["flags"] = np.where(cpu_fault, 0, records["flags"] & 0xFF)
    start = records["start"].astype(np.int64) + np.int64(clock_offset)
    end = records["end"].astype(np.int64) + np.int64(clock_offset)
    end = np.where(_NO_END[kind] | (end < start), start, end)
    out["start"] = np.maximum(start, 0)
    out["end"] = np.maximum(end, 0)
    out["address"] = records["address"]
    out["bytes"] = np.where(_SIZED[kind], value, 0)
    out["value"] = np.where(cpu_fault, 1, value)
    return out


def decode_buffer(buffer: Any, valid_size: int | None = None, *, clock_offset: int = 0) -> np.ndarray:
    """Decode the bytes of a CUPTI activity buffer that holds only unified-memory counter records.

    Parameters
    ----------
    buffer
        Anything that exposes the buffer protocol (``bytes``, ``memoryview``, a NumPy array).
    valid_size
        How many leading bytes hold records (CUPTI's ``validSize``); all of them by default.
    clock_offset
        Nanoseconds added to CUPTI's timestamps (see :func:`decode_records`).

    Raises
    ------
    InvalidArgumentError
        ``valid_size`` is out of range or not a whole number of records, or the buffer holds other
        activity kinds (decode those records with CUPTI's own record walk instead).
    """
    try:
        raw = np.frombuffer(buffer, dtype=np.uint8)
    except TypeError as exc:
        raise InvalidArgumentError(f"buffer must support the buffer protocol, got {type(buffer).__name__}",
                                   value=buffer, expected="bytes, a memoryview or a NumPy array") from exc
    if valid_size is None:
        valid_size = raw.nbytes
    if isinstance(valid_size, bool) or not isinstance(valid_size, (int, np.integer)) \
            or not 0 <= valid_size <= raw.nbytes:
        raise InvalidArgumentError(f"valid_size must be 0..{raw.nbytes}, got {valid_size!r}", value=valid_size,
                                   expected=f"an int in 0..{raw.nbytes}")
    itemsize = CUPTI_UM_COUNTER3_DTYPE.itemsize
    if valid_size % itemsize:
        raise InvalidArgumentError(
            f"valid_size {valid_size} is not a whole number of {itemsize}-byte unified-memory records",
            value=valid_size, expected=f"a multiple of {itemsize}")
    raw = raw[:valid_size]
    if raw.ctypes.data % 8:   # structured views need no alignment, but copying once keeps field reads fast
        raw = raw.copy()
    return decode_records(raw.view(CUPTI_UM_COUNTER3_DTYPE), clock_offset=clock_offset)


def encode_records(events: np.ndarray, *, clock_offset: int = 0, process_id: int = 0) -> np.ndarray:
    """The inverse of :func:`decode_records` for migration and fault events: CUPTI records.

    Used to build synthetic activity buffers (tests, benchmarks). Host ids become ``0xFFFFFFFF``;
    ``value`` is written as CUPTI has it (for CPU faults, 0 in place of the program counter).
    """
    if not isinstance(events, np.ndarray) or events.dtype != EVENT_DTYPE:
        raise InvalidArgumentError("events must be an EVENT_DTYPE array", value=events,
                                   expected="a numpy array of uvm_lab.events.EVENT_DTYPE")
    out = np.zeros(len(events), dtype=CUPTI_UM_COUNTER3_DTYPE)
    out["kind"] = CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER
    out["counter_kind"] = events["kind"]
    out["value"] = np.where(events["kind"] == EventKind.CPU_PAGE_FAULT, 0, events["value"])
    out["start"] = (events["start"].astype(np.int64) - clock_offset).astype(np.uint64)
    out["end"] = (events["end"].astype(np.int64) - clock_offset).astype(np.uint64)
    out["address"] = events["address"]
    out["src_id"] = np.where(events["src"] == HOST_ID, CUPTI_HOST_ID, events["src"].astype(np.int64) & 0xFFFFFFFF)
    out["dst_id"] = np.where(events["dst"] == HOST_ID, CUPTI_HOST_ID, events["dst"].astype(np.int64) & 0xFFFFFFFF)
    out["flags"] = events["flags"]
    out["process_id"] = process_id
    out["stream_id"] = 0xFFFFFFFF   # CUPTI: invalid for unified-memory records
    return out


def clock_offset(cupti_now: Any, backend_now: Any = time.perf_counter_ns, samples: int = 5) -> int:
    """Nanoseconds to add to ``cupti_now()``'s clock to read ``backend_now()``'s.

    Each sample reads the backend clock on both sides of a CUPTI reading; the tightest pair wins.
    """
    best: tuple[int, int] | None = None
    for _ in range(max(1, samples)):
        before = backend_now()
        theirs = int(cupti_now())
        after = backend_now()
        if best is None or after - before < best[0]:
            best = (after - before, (before + after) // 2 - theirs)
    assert best is not None
    return best[1]
