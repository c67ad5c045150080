"""Real page faults and migrations: CUPTI's unified-memory counters, through cupti-python.

:class:`CuptiCollector` enables ``CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER`` for the chosen counters,
decodes every activity buffer CUPTI completes in bulk (:mod:`uvm_lab.tracing.decode`), attributes each
record to its allocation (:mod:`uvm_lab.tracing.attribution`), and publishes the records on the event bus,
where residency maps, statistics and traces pick them up like the simulator's.

Records are lost if they are not drained fast enough: in a fault storm CUPTI can hand over a full queue of
:data:`CUPTI_UM_QUEUE_RECORDS` unified-memory migration records and lose what did not fit, without counting
them as dropped (seen on an H100 and an H200, CUPTI 13.0). So the buffer-completed callback only queues
the buffer (it hands CUPTI a fresh one from a pool), and a drain thread asks CUPTI for its records every
``drain_interval`` (``cuptiActivityFlushAll``, called without the GIL), then decodes, attributes and publishes them. The
collector is also the bus's flush hook, so reading a map or a trace drains CUPTI first. A drain that
brings exactly the queue's capacity is the signature of that loss; :meth:`CuptiCollector.status` then
says the record is incomplete rather than let a map look exact. The signature is empirical, and GPU fault
capture defeats it: with that counter on, the catalog's workloads at 1 GiB on an H200 lost up to 31 % of their
HtoD bytes under faults and up to 66 % under ReadMostly, with no full drain and nothing counted as dropped
(``benchmarks/sim_records.py``). :meth:`CuptiCollector.check_host` still finds such losses on the host's side.

Two ways to receive buffers, the first that works is used:

``"raw"``
    CUPTI's buffer callbacks registered on libcupti directly (ctypes), so a completed buffer reaches
    Python as bytes and no per-record object is ever made. (The same callbacks in C, which never take
    the GIL, were measured and changed neither the loss nor the overhead: ``benchmarks/README.md``.)
``"objects"``
    cupti-python's callbacks, which hand over one Python object per record. Where the objects sit
    back to back in CUPTI's buffer (the usual case), their bytes are still read in one piece; otherwise
    each object's fields are read.

Rules CUPTI imposes, handled here: the CUDA context must exist before the counters are enabled (else
``CUPTI_ERROR_NOT_READY``); buffer callbacks can be registered once per process, so one collector runs
at a time; and where unified-memory profiling is unavailable (MPS, vGPU, no cupti-python, another
profiler attached) the collector says why once, stays inert, and the rest of uvm_lab keeps working.

This is the only module of uvm_lab that imports ``cupti``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import sys
import threading
import time
import warnings
from collections import deque
from typing import Any

import numpy as np

from ..errors import BackendError, InvalidArgumentError, InvalidStateError
from ..events.bus import EventBus, get_bus
from ..events.schema import EventKind
from .attribution import AllocationIndex, attribute
from .decode import (
    CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER,
    CUPTI_UM_COUNTER3_DTYPE,
    clock_offset,
    decode_records,
)
from .reconcile import Reconciliation

__all__ = ["CUPTI_UM_QUEUE_RECORDS", "CuptiCollector", "TracingUnavailableWarning", "cupti_status", "measures",
           "running_collector"]

log = logging.getLogger("uvm_lab.tracing")

_FLUSH_FORCED = 1          # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
_CONFIG_DTYPE = np.dtype([("scope", "<i4"), ("kind", "<i4"), ("device_id", "<u4"), ("enable", "<u4")])
_SCOPE_PROCESS_SINGLE_DEVICE = 1
_RECORD = CUPTI_UM_COUNTER3_DTYPE.itemsize

#: The size of CUPTI's unified-memory queue as seen from outside (H100 and H200, driver 580, CUPTI 13.0.85):
#: every drain that lost migration records in a fault storm brought exactly this many, while
#: ``cuptiActivityGetNumDroppedRecords`` said 0. Lossless drains bring any number, more too (a host write
#: of 256 MiB brings 26,791 CPU-fault records in one). A drain of exactly this many marks the record
#: incomplete.
CUPTI_UM_QUEUE_RECORDS = 8191
#: Completed buffers waiting for the drain thread, at most; beyond it CUPTI is refused a new buffer
#: (it then drops records and counts them, which :attr:`CuptiCollector.dropped` reports).
_MAX_QUEUED_BUFFERS = 64

#: CUPTI result codes worth a sentence of their own.
_REASONS = {
    13: "the CUDA context does not exist yet; CUPTI enables unified-memory counters only after it does "
        "(ul.use_backend('cuda') creates it)",
    15: "CUPTI could not initialise (is the NVIDIA driver loaded?)",
    27: "CUPTI does not support this on this system",
    28: "unified-memory profiling is not supported on this system",
    29: "unified-memory profiling is not supported on this device",
    30: "unified-memory profiling is not supported on devices without peer-to-peer access to each other",
    31: "unified-memory profiling is not supported under MPS (the CUDA Multi-Process Service)",
    33: "CUPTI does not support this virtualized GPU (vGPU)",
    35: "profiling needs privileges this process lacks (see NVreg_RestrictProfilingToAdminUsers)",
    39: "another CUPTI client (a profiler such as Nsight) is already attached to this process",
    40: "profiling this virtualized GPU (vGPU) needs privileges this process lacks",
    41: "CUPTI does not support confidential computing mode",
    43: "CUPTI does not support MIG instances",
    45: "CUPTI does not support this GPU under WSL",
}

_COUNTERS = {
    "htod": EventKind.HTOD, "dtoh": EventKind.DTOH, "dtod": EventKind.DTOD,
    "cpu_faults": EventKind.CPU_PAGE_FAULT, "gpu_faults": EventKind.GPU_PAGE_FAULT,
    "thrashing": EventKind.THRASHING, "throttling": EventKind.THROTTLING, "remote_map": EventKind.REMOTE_MAP,
}


class TracingUnavailableWarning(UserWarning):
    """CUPTI's unified-memory counters cannot be used here; the message says why. Shown once per reason."""


_warned: set[str] = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"uvm_lab: no real fault and migration records: {reason}. Everything else keeps working.",
                      TracingUnavailableWarning, stacklevel=3)


def _load_cupti() -> tuple[Any, str]:
    """(cupti-python's ``cupti`` module or None, the reason it is missing)."""
    try:
        from cupti import cupti as module
    except ImportError as exc:
        return None, f"cupti-python is not installed or cannot load ({exc}); pip install 'uvm_lab[cupti]'"
    except Exception as exc:   # a broken install raises anything: say what, don't crash the caller
        return None, f"cupti-python failed to import: {type(exc).__name__}: {exc}"
    return module, ""


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return int(status) if status is not None else None


def _reason_of(exc: BaseException) -> str:
    status = _status_of(exc)
    detail = _REASONS.get(status, "") if status is not None else ""
    return f"{detail} ({exc})" if detail else f"CUPTI refused: {exc}"


def cupti_status() -> dict[str, Any]:
    """Whether real fault and migration records can be had here, without starting anything.

    Returns ``{"installed": bool, "reason": str, "active": bool}``: ``installed`` says cupti-python
    imports; whether the counters can then be enabled is only known by starting a collector.
    """
    module, reason = _load_cupti()
    return {"installed": module is not None, "reason": reason, "active": _active is not None}


#: The counters without which a backend's work on a device is not measured, by what the work is: a
#: prefetch's migrations, or a kernel's (whose first touches on the GPU only GPU faults record).
_MEASURING = {"transfers": {"htod", "dtoh"}, "kernels": {"htod", "dtoh", "gpu_faults"},
              "host": {"htod", "dtoh", "cpu_faults"}}


def running_collector() -> CuptiCollector | None:
    """The collector running in this process, if any (CUPTI takes one at a time)."""
    collector = _active
    return collector if collector is not None and collector.running else None


def measures(what: str, device: int) -> bool:
    """Whether a running collector records ``what`` (``"transfers"``, ``"kernels"`` or ``"host"`` work) on ``device``.

    Where it does not, the CUDA backend publishes what it can infer instead (``uvm_lab.backends.cuda``).
    """
    if what not in _MEASURING:
        raise InvalidArgumentError(f"what must be one of {sorted(_MEASURING)}, got {what!r}", value=what,
                                   expected=", ".join(_MEASURING))
    collector = _active
    return (collector is not None and collector.running and collector._device == device
            and _MEASURING[what] <= set(collector.counters))


# -- one set of CUPTI callbacks per process, routed to the running collector --------------------------
_active: CuptiCollector | None = None
_registered: str | None = None      # which receiver is registered with CUPTI: "raw" or "objects"
_keepalive: list[Any] = []           # ctypes callbacks must outlive every call CUPTI makes
_register_lock = threading.Lock()

_BUFFER_REQUESTED = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                                     ctypes.POINTER(ctypes.c_size_t))
_BUFFER_COMPLETED = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t,
                                     ctypes.c_size_t)


class _RawBuffers:
    """CUPTI's buffers, owned by Python: handed out from a pool, queued whole on completion.

    Both callbacks run on CUPTI's threads and must return fast: no decoding, no publishing, no
    allocation in the common case. A completed buffer goes to the running collector's queue as it
    is and comes back to the pool once the drain thread has decoded it.
    """

    def __init__(self) -> None:
        self.size = 8 << 20
        self._held: dict[int, np.ndarray] = {}
        self._pool: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.declined = 0     #: requests refused because the drain thread was too far behind

    def requested(self, buffer: Any, size: Any, max_records: Any) -> None:
        try:
            collector = _active
            if collector is not None and len(collector._inbox) >= _MAX_QUEUED_BUFFERS:
                buffer[0] = None      # CUPTI drops, and counts, rather than memory growing without bound
                size[0] = 0
                self.declined += 1
                return
            with self._lock:
                block = self._pool.pop() if self._pool else None
            if block is None or len(block) != self.size + 8:
                block = np.empty(self.size + 8, dtype=np.uint8)
            address = block.ctypes.data
            aligned = address + (-address) % 8
            with self._lock:
                self._held[aligned] = block
            buffer[0] = aligned
            size[0] = self.size
            max_records[0] = 0
        except BaseException:   # an exception must not unwind into CUPTI's C frames
            buffer[0] = None
            size[0] = 0
            log.exception("allocating a CUPTI activity buffer failed")

    def completed(self, _context: Any, _stream: int, buffer: int | None, _size: int, valid: int) -> None:
        with self._lock:
            block = self._held.pop(buffer or 0, None)
        if block is None or sys.is_finalizing():
            return
        collector = _active
        if collector is not None and valid:
            collector._inbox.append((block, (buffer or 0) - block.ctypes.data, valid))
        else:
            self.release(block)

    def release(self, block: np.ndarray) -> None:
        """A block whose records have been read, back to the pool (a few are kept)."""
        with self._lock:
            if len(self._pool) < 8:
                self._pool.append(block)


_raw_buffers = _RawBuffers()
_libcupti: Any = None


def _find_libcupti(cupti: Any) -> ctypes.CDLL | None:
    """The libcupti cupti-python loaded (the same instance, so one set of callbacks), or None."""
    global _libcupti
    if _libcupti is None:
        try:
            cupti.get_timestamp()   # makes cupti-python load the library
            with open("/proc/self/maps") as maps:
                paths = {line.split()[-1] for line in maps if "libcupti.so" in line}
            if len(paths) != 1:
                return None
            lib = ctypes.CDLL(paths.pop())
            lib.cuptiActivityRegisterCallbacks.argtypes = [_BUFFER_REQUESTED, _BUFFER_COMPLETED]
            lib.cuptiActivityRegisterCallbacks.restype = ctypes.c_int
            lib.cuptiActivityGetNextRecord.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                                       ctypes.POINTER(ctypes.c_void_p)]
            lib.cuptiActivityGetNextRecord.restype = ctypes.c_int
            lib.cuptiActivityFlushAll.argtypes = [ctypes.c_uint32]   # ctypes releases the GIL for the call
            lib.cuptiActivityFlushAll.restype = ctypes.c_int
            _libcupti = lib
        except (OSError, AttributeError, ValueError):
            return None
    return _libcupti


def _register(cupti: Any, decoder: str) -> str:
    """Register CUPTI's buffer callbacks once per process; which receiver got registered."""
    global _registered
    with _register_lock:
        if _registered is not None:
            return _registered
        if decoder in ("auto", "raw"):
            lib = _find_libcupti(cupti)
            if lib is not None:
                requested = _BUFFER_REQUESTED(_raw_buffers.requested)
                completed = _BUFFER_COMPLETED(_raw_buffers.completed)
                if lib.cuptiActivityRegisterCallbacks(requested, completed) == 0:
                    _keepalive.extend((requested, completed))
                    _registered = "raw"
                    return _registered
            if decoder == "raw":
                raise BackendError("cannot register CUPTI's buffer callbacks on libcupti directly; "
                                   "use decoder='objects' (cupti-python's callbacks)")

        def requested_objects() -> tuple[int, int]:
            return _raw_buffers.size, 0

        def completed_objects(activities: list[Any]) -> None:
            collector = _active
            if collector is not None and activities and not sys.is_finalizing():
                try:   # the objects die with the buffer: take their bytes now, decode on the drain thread
                    collector._inbox.append((collector._objects_bytes(activities), 0, -1))
                except BaseException:
                    log.exception("reading CUPTI activity records failed")

        cupti.activity_register_callbacks(requested_objects, completed_objects)
        _keepalive.extend((requested_objects, completed_objects))
        _registered = "objects"
        return _registered


class CuptiCollector:
    """Streams CUPTI's unified-memory counter records onto the event bus.

    Parameters
    ----------
    bus
        Where records go; the process-wide bus by default.
    gpu_faults
        Also record GPU page faults. Off by default: servicing faults with fault capture on costs the
        most (Nsight Systems warns of up to 70 % on fault-heavy code), and in a fault storm CUPTI then loses
        migration records without saying so (see above); migrations say where data went.
    cpu_faults
        Record CPU page faults (the host's first touch of managed memory shows up only as these).
    counters
        Instead of the two switches, the exact counters to enable: a collection of ``"htod"``,
        ``"dtoh"``, ``"dtod"``, ``"cpu_faults"``, ``"gpu_faults"``, ``"thrashing"``, ``"throttling"``,
        ``"remote_map"``.
    device
        The device whose counters to configure; the current CUDA backend's by default, else 0.
    flush_interval
        Seconds between the periodic flushes of CUPTI's own worker thread (it returns full buffers).
    drain_interval
        Seconds between the drain thread's requests for every completed record
        (``cuptiActivityFlushAll(0)``). CUPTI loses unified-memory records beyond
        :data:`CUPTI_UM_QUEUE_RECORDS` between drains, so a fault storm needs a few milliseconds at most.
    buffer_size
        Bytes per CUPTI activity buffer (a multiple of 8: records are 8-byte aligned).
    decoder
        How buffers are received: ``"auto"`` (raw buffers where possible), ``"raw"`` or ``"objects"``;
        see the module docstring. CUPTI takes one set of callbacks per process, so the first
        collector's choice holds for every later one.
    attributes
        CUPTI activity attributes to set before the counters are enabled, by the name of
        ``cupti.ActivityAttribute`` (``{"DEVICE_BUFFER_POOL_LIMIT": 64}``); integer values. Names are
        checked when the collector starts. :meth:`attribute_values` reads them back.
    required
        Raise :class:`~uvm_lab.errors.BackendError` where CUPTI cannot be used, rather than warning
        once (:class:`TracingUnavailableWarning`) and staying inert.

    Examples
    --------
    >>> ul.use_backend("cuda")
    >>> with CuptiCollector() as cupti, ul.record() as trace:
    ...     ul.touch(buf, on="gpu")
    ...     cupti.flush()
    >>> trace.summary()["bytes_htod"]
    """

    def __init__(self, *, bus: EventBus | None = None, gpu_faults: bool = False, cpu_faults: bool = True,
                 counters: Any = None, device: int | None = None, flush_interval: float = 0.1,
                 drain_interval: float = 0.001, buffer_size: int = 8 << 20, decoder: str = "auto",
                 attributes: dict[str, int] | None = None, required: bool = False) -> None:
        if bus is not None and not isinstance(bus, EventBus):
            raise InvalidArgumentError(f"bus must be an EventBus, got {type(bus).__name__}", value=bus,
                                       expected="uvm_lab.events.EventBus")
        for name, flag in (("gpu_faults", gpu_faults), ("cpu_faults", cpu_faults), ("required", required)):
            if not isinstance(flag, bool):
                raise InvalidArgumentError(f"{name} must be True or False, got {flag!r}", value=flag,
                                           expected="a bool")
        if counters is None:
            names = ["htod", "dtoh", "dtod", "thrashing", "throttling", "remote_map"]
            names += ["cpu_faults"] if cpu_faults else []
            names += ["gpu_faults"] if gpu_faults else []
        else:
            if isinstance(counters, str) or not hasattr(counters, "__iter__"):
                raise InvalidArgumentError(f"counters must be a collection of names, got {counters!r}",
                                           value=counters, expected=", ".join(_COUNTERS))
            names = list(counters)
            unknown = [c for c in names if c not in _COUNTERS]
            if unknown or not names:
                raise InvalidArgumentError(f"unknown counters {unknown!r}" if unknown else "no counters given",
                                           value=counters, expected=", ".join(_COUNTERS))
        if device is not None and (isinstance(device, bool) or not isinstance(device, int) or device < 0):
            raise InvalidArgumentError(f"device must be a device ordinal, got {device!r}", value=device,
                                       expected="an int >= 0")
        if isinstance(flush_interval, bool) or not isinstance(flush_interval, (int, float)) \
                or not 0.001 <= flush_interval <= 3600:
            raise InvalidArgumentError(f"flush_interval must be 0.001..3600 seconds, got {flush_interval!r}",
                                       value=flush_interval, expected="seconds, 0.001..3600")
        if isinstance(drain_interval, bool) or not isinstance(drain_interval, (int, float)) \
                or not 0.0001 <= drain_interval <= 10:
            raise InvalidArgumentError(f"drain_interval must be 0.0001..10 seconds, got {drain_interval!r}",
                                       value=drain_interval, expected="seconds, 0.0001..10")
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or not 64 << 10 <= buffer_size <= 1 << 30 \
                or buffer_size % 8:
            raise InvalidArgumentError(f"buffer_size must be a multiple of 8 bytes, 64 KiB..1 GiB, got {buffer_size!r}",
                                       value=buffer_size, expected="an int number of bytes, a multiple of 8, "
                                                                   "65536..1073741824")
        if attributes is not None and (not isinstance(attributes, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for k, v in attributes.items())):
            raise InvalidArgumentError(f"attributes must map attribute names to non-negative ints, got {attributes!r}",
                                       value=attributes, expected='{"DEVICE_BUFFER_POOL_LIMIT": 64, ...}')
        if decoder not in ("auto", "raw", "objects"):
            raise InvalidArgumentError(f"decoder must be 'auto', 'raw' or 'objects', got {decoder!r}",
                                       value=decoder, expected="'auto', 'raw' or 'objects'")
        self.bus = bus if bus is not None else get_bus()
        self.counters = tuple(dict.fromkeys(names))
        self.device = device
        self.flush_interval = float(flush_interval)
        self.drain_interval = float(drain_interval)
        self.buffer_size = buffer_size
        self.decoder = decoder
        self.attributes = dict(attributes or {})
        self.required = required
        self.reason = ""                 #: why the collector is inert ("" while it works)
        self.receiver = ""               #: how buffers arrive: "raw" or "objects"
        self.records = 0                 #: records decoded and published
        self.buffers = 0                 #: activity buffers received
        self.dropped = 0                 #: records CUPTI dropped for want of buffer space
        self.unknown = 0                 #: records of a counter kind this version does not know
        self.unattributed = 0            #: records at addresses no known allocation held
        self.drains = 0                  #: times CUPTI was asked for its records
        self.saturated = 0               #: drains that brought a full CUPTI queue: records likely lost
        self.max_per_drain = 0           #: the most unified-memory records one drain brought
        self.unrecorded = 0              #: pages :meth:`check_host` found changed with no record (records lost)
        self._cupti: Any = None
        self._inbox: deque[tuple[Any, int, int]] = deque()   # completed buffers, appended on CUPTI's threads
        self._draining = False
        self._since_drain = 0
        self._drainer: threading.Thread | None = None
        self._stop_drainer = threading.Event()
        self._offset = 0
        self._device: int | None = None   # the device whose counters are on, once started
        self._running = False
        self._index = AllocationIndex("segment")
        self._lock = threading.Lock()

    # -- life cycle ---------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> CuptiCollector:
        """Enable the counters; from now on records flow to the bus.

        Raises
        ------
        InvalidStateError
            Another collector is running in this process (CUPTI has one set of buffer callbacks).
        BackendError
            CUPTI cannot be used here and ``required`` is set (otherwise a warning, once, and the
            collector stays inert: check :attr:`reason`).
        """
        global _active
        if self._running:
            return self
        if _active is not None:
            raise InvalidStateError("another CuptiCollector is running in this process; stop it first")
        cupti, reason = _load_cupti()
        if cupti is None:
            return self._unavailable(reason)
        device = self.device if self.device is not None else _current_cuda_device()
        try:
            self.receiver = _register(cupti, self.decoder)
        except BackendError:
            raise
        except Exception as exc:
            return self._unavailable(_reason_of(exc))
        _raw_buffers.size = self.buffer_size
        try:
            for name, value in self.attributes.items():
                _set_attribute(cupti, name, value)
        except InvalidArgumentError:
            raise
        except Exception as exc:
            return self._unavailable(_reason_of(exc))
        config = np.zeros(len(self.counters), dtype=_CONFIG_DTYPE)
        config["scope"] = _SCOPE_PROCESS_SINGLE_DEVICE
        config["kind"] = [int(_COUNTERS[c]) for c in self.counters]
        config["device_id"] = device
        config["enable"] = 1
        try:
            cupti.activity_configure_unified_memory_counter(config.ctypes.data, len(config))
            _active = self
            cupti.activity_enable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER)
        except Exception as exc:
            _active = None
            return self._unavailable(_reason_of(exc))
        self._cupti = cupti
        self._device = device
        self._offset = clock_offset(cupti.get_timestamp)
        self._index = AllocationIndex("segment")
        self._index.update(self.bus.history())   # allocations made before tracing started
        self._index.follow(self.bus)
        try:
            cupti.activity_flush_period(max(1, int(self.flush_interval * 1000)))
        except Exception as exc:   # without a period, buffers still arrive when full and on flush()
            log.warning("CUPTI would not take a flush period: %s", exc)
        self._running = True
        self.reason = ""
        self.bus.add_flush_hook(self._drain_now)
        self._stop_drainer.clear()
        self._drainer = threading.Thread(target=self._drain_periodically, name="uvm_lab-cupti-drain", daemon=True)
        self._drainer.start()
        return self

    def _unavailable(self, reason: str) -> CuptiCollector:
        self.reason = reason
        if self.required:
            raise BackendError(f"CUPTI's unified-memory counters cannot be used: {reason}")
        _warn_once(reason)
        log.info("CUPTI collector inert: %s", reason)
        return self

    def flush(self) -> None:
        """Deliver every record CUPTI holds now (a forced flush), then the bus's queue.

        The same happens whenever the bus is flushed (reading a map or a trace does it): the
        collector is one of the bus's flush hooks while it runs.
        """
        if self._running:
            self._drain_now()
        self.bus.flush(wait=False)

    def stop(self) -> None:
        """Deliver what is left, disable the counters and release the callbacks to the next collector."""
        global _active
        if not self._running:
            return
        cupti = self._cupti
        self._stop_drainer.set()
        if self._drainer is not None and self._drainer is not threading.current_thread():
            self._drainer.join()
        self._drainer = None
        try:
            self._flush_cupti(_FLUSH_FORCED)
            cupti.activity_disable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER)
            self._flush_cupti(_FLUSH_FORCED)
            cupti.activity_flush_period(0)
            self._count_dropped()
            self._drain()
        finally:
            self._running = False
            self.bus.remove_flush_hook(self._drain_now)
            _active = None
            while self._inbox:   # nothing should be left; never leave a block out of the pool
                block, _, valid = self._inbox.popleft()
                if valid >= 0:
                    _raw_buffers.release(block)
            self._index.close()
            self.bus.flush(wait=False)

    def __enter__(self) -> CuptiCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_host(self, *, repair: bool = True, tracker: Any = None) -> Reconciliation:
        """Check every live managed allocation's map against the host's page tables; repair what records missed.

        Call it with the GPU idle (after a synchronize): a migration under way would look unrecorded.
        A page that left or reached the host with no record means CUPTI lost records, even where it
        counted none as dropped. Those the enabled counters should have carried (HtoD, DtoH, CPU first
        touches; with GPU faults on, read-duplicate host copies a GPU write dropped) are added to
        :attr:`unrecorded`, and :meth:`status` then calls the record incomplete.

        Parameters
        ----------
        repair
            Publish the inferred events (:mod:`uvm_lab.tracing.reconcile`: migrations of cause
            ``INFERRED``), so maps match the host again and byte counts add up.
        tracker
            The :class:`~uvm_lab.ResidencyTracker` whose maps to check: the process-wide one by default,
            which needs the collector to publish on the process-wide bus.

        Returns
        -------
        Reconciliation
            Pages compared and pages unrecorded, by kind, with the inferred events.

        Raises
        ------
        InvalidStateError
            The collector was never started.
        InvalidArgumentError
            ``repair`` is not a bool, or ``tracker`` is not a tracker (or is needed: a bus of one's own).
        """
        from ..residency_map import ResidencyTracker, get_tracker

        if not isinstance(repair, bool):
            raise InvalidArgumentError(f"repair must be True or False, got {repair!r}", value=repair, expected="a bool")
        if tracker is None:
            if self.bus is not get_bus():
                raise InvalidArgumentError("this collector publishes on a bus of its own: pass the tracker that "
                                           "listens to it", value=tracker, expected="a ResidencyTracker")
            tracker = get_tracker()
        elif not isinstance(tracker, ResidencyTracker):
            raise InvalidArgumentError(f"tracker must be a ResidencyTracker, got {type(tracker).__name__}",
                                       value=tracker, expected="a ResidencyTracker")
        if self._device is None:
            raise InvalidStateError("the collector was never started: there are no records to check")
        from ..backends import get_backend
        from .watcher import check_host

        self.flush()
        backend = get_backend()
        gpus = 1 if backend.is_simulated else int(backend.device_count())
        found = check_host(tracker, gpus=gpus, bus=self.bus, now=_now_ns, repair=repair)
        self.account(found)
        return found

    def account(self, found: Reconciliation) -> int:
        """Count, among the pages the host's page tables showed moved with no record, those the enabled
        counters should have recorded (records CUPTI lost): HtoD and DtoH moves, the host's first touches, and
        with GPU faults on, host copies a GPU write dropped. They make :meth:`status` call the record
        incomplete. The host watcher reports each of its rounds here while a collector runs. Returns them."""
        if not isinstance(found, Reconciliation):
            raise InvalidArgumentError(f"found must be a Reconciliation, got {type(found).__name__}", value=found,
                                       expected="what reconcile() or check_host() returned")
        traced = set(self.counters)
        missed = (found.htod * ("htod" in traced) + found.dtoh * ("dtoh" in traced)
                  + found.first_touch * ("cpu_faults" in traced) + found.host_copy_dropped * ("gpu_faults" in traced))
        if missed:
            with self._lock:
                self.unrecorded += missed
            log.warning("%d pages changed place on the host with no CUPTI record: records were lost (%r)",
                        missed, found)
        return missed

    def attribute_values(self) -> dict[str, int | None]:
        """Every CUPTI activity attribute CUPTI reports, by name (None where it would not say)."""
        cupti, _ = _load_cupti()
        if cupti is None or not hasattr(cupti, "ActivityAttribute"):
            return {}
        return {a.name: _get_attribute(cupti, a.name) for a in cupti.ActivityAttribute}

    def status(self) -> dict[str, Any]:
        """What the collector is doing, for a panel or a log line."""
        complete = not (self.dropped or self.saturated or self.unrecorded)
        warning = ""
        if self.dropped:
            warning = f"CUPTI dropped {self.dropped} records for want of buffer space"
        elif self.unrecorded:
            warning = (f"{self.unrecorded} pages changed place on the host with no record (check_host): CUPTI lost "
                       f"records without counting them")
        elif self.saturated:
            warning = (f"{self.saturated} drains brought exactly {CUPTI_UM_QUEUE_RECORDS} records, a full CUPTI "
                       f"unified-memory queue: records were probably lost and maps may be wrong")
        return {"running": self._running, "reason": self.reason, "receiver": self.receiver,
                "counters": list(self.counters), "records": self.records, "buffers": self.buffers,
                "dropped": self.dropped, "unknown": self.unknown, "unattributed": self.unattributed,
                "drains": self.drains, "max_per_drain": self.max_per_drain, "saturated": self.saturated,
                "unrecorded": self.unrecorded,
                "complete": complete, "warning": warning}

    def __repr__(self) -> str:
        state = "running" if self._running else (f"inert: {self.reason}" if self.reason else "stopped")
        lost = "" if not self.saturated else f", {self.saturated} saturated drains (incomplete)"
        lost += "" if not self.unrecorded else f", {self.unrecorded} pages unrecorded (incomplete)"
        return (f"<CuptiCollector {state}, {self.records} records, {self.dropped} dropped{lost}, "
                f"counters={','.join(self.counters)}>")

    def _count_dropped(self) -> None:
        dropped = np.zeros(1, dtype=np.uint64)
        try:
            self._cupti.activity_get_num_dropped_records(0, 0, dropped.ctypes.data)
        except Exception:
            return
        if dropped[0]:
            self.dropped += int(dropped[0])
            log.warning("CUPTI dropped %d unified-memory records (buffers full); raise buffer_size", int(dropped[0]))

    # -- draining -------------------------------------------------------------------------------------
    def _flush_cupti(self, flag: int) -> None:
        """``cuptiActivityFlushAll(flag)``: completed buffers reach the callbacks before it returns."""
        lib = _libcupti if self.receiver == "raw" else None
        if lib is not None:
            status = lib.cuptiActivityFlushAll(flag)   # no GIL held while CUPTI works
            if status:
                log.debug("cuptiActivityFlushAll(%d) returned %d", flag, status)
        else:
            self._cupti.activity_flush_all(flag)

    def _drain_periodically(self) -> None:
        stop = self._stop_drainer
        while not stop.wait(self.drain_interval) and not sys.is_finalizing():
            try:
                self._flush_cupti(0)
                self._drain(count=True)
            except Exception:   # the drain thread must not die silently mid-run
                log.exception("draining CUPTI's records failed")

    def _drain_now(self) -> None:
        """The bus's flush hook: a forced flush, then publish everything received."""
        if not self._running:
            return
        with self._bus_lock():
            if self._draining:   # a subscriber read the bus while this thread publishes: nothing to add
                return
            self._flush_cupti(_FLUSH_FORCED)
            self._count_dropped()
            self._drain(count=True)

    def _drain(self, count: bool = False) -> None:
        """Decode, attribute and publish the queued buffers, in the order CUPTI completed them."""
        with self._bus_lock():
            if self._draining:
                return
            self._draining = True
            try:
                self._drain_inbox()
            finally:
                self._draining = False
            if count:
                self.drains += 1
                got, self._since_drain = self._since_drain, 0
                self.max_per_drain = max(self.max_per_drain, got)
                if got == CUPTI_UM_QUEUE_RECORDS:
                    self.saturated += 1
                    log.warning("one drain brought %d unified-memory records, a full CUPTI queue: records were "
                                "probably lost (drain_interval=%g s)", got, self.drain_interval)

    def _bus_lock(self) -> Any:
        # Draining holds the bus's own (re-entrant) lock: records go out in the order CUPTI completed
        # them, and a subscriber that reads the bus mid-delivery cannot deadlock against the drain thread.
        return self.bus._lock

    def _drain_inbox(self) -> None:
        inbox = self._inbox
        while inbox:
            data, offset, valid = inbox.popleft()
            try:   # valid < 0: cupti-python's objects, already copied out
                self._publish(data if valid < 0 else self._read_raw(data, offset, valid))
            except Exception:
                log.exception("decoding a CUPTI activity buffer failed")
            finally:
                if valid >= 0:   # decoded into new arrays: CUPTI may have the block again
                    _raw_buffers.release(data)

    # -- receiving ------------------------------------------------------------------------------------
    def _read_raw(self, block: np.ndarray, offset: int, valid: int) -> np.ndarray:
        """The unified-memory records of a completed buffer (``valid`` bytes at ``offset`` in ``block``)."""
        data = block[offset:offset + valid]
        try:
            records = data.view(CUPTI_UM_COUNTER3_DTYPE) if valid % _RECORD == 0 else None
            if records is None or not (records["kind"] == CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER).all():
                records = self._walk(data.ctypes.data, valid)   # other activity kinds share the buffer
        except ValueError:
            records = self._walk(data.ctypes.data, valid)
        return records

    def _walk(self, address: int, valid: int) -> np.ndarray:
        """CUPTI's own record walk, keeping the unified-memory records (buffers of mixed kinds)."""
        lib = _libcupti
        record = ctypes.c_void_p(None)
        offsets = []
        while lib.cuptiActivityGetNextRecord(address, valid, ctypes.byref(record)) == 0:
            at = record.value or 0
            if ctypes.c_int32.from_address(at).value == CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER:
                offsets.append(at)
        out = np.empty(len(offsets), dtype=CUPTI_UM_COUNTER3_DTYPE)
        for i, at in enumerate(offsets):
            record_bytes = memoryview((ctypes.c_uint8 * _RECORD).from_address(at))
            out[i] = np.frombuffer(record_bytes, dtype=CUPTI_UM_COUNTER3_DTYPE)[0]
        return out

    @staticmethod
    def _objects_bytes(activities: list[Any]) -> np.ndarray:
        """cupti-python's record objects as records: one copy where they lie back to back in the buffer."""
        n = len(activities)
        first, last = activities[0], activities[-1]
        try:
            p0, p1 = int(first.ptr), int(last.ptr)
            if p1 - p0 == (n - 1) * _RECORD:
                block = memoryview((ctypes.c_uint8 * (n * _RECORD)).from_address(p0))
                raw = np.frombuffer(block, dtype=np.uint8).copy()
                view = raw.view(CUPTI_UM_COUNTER3_DTYPE)
                if (view["kind"] == CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER).all():
                    return view
        except (AttributeError, TypeError, ValueError):
            pass
        mine = [a for a in activities if int(getattr(a, "kind", -1)) == CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER]
        records = np.zeros(len(mine), dtype=CUPTI_UM_COUNTER3_DTYPE)
        for i, a in enumerate(mine):
            records[i] = (a.kind, a.counter_kind, a.value, a.start, a.end, a.address, a.src_id, a.dst_id,
                          a.stream_id, a.process_id, a.flags_, 0, (0, 0, 0, 0, 0))
        return records

    def _publish(self, records: np.ndarray) -> None:
        events = decode_records(records, clock_offset=self._offset)
        events = attribute(events, self._index)
        with self._lock:
            self.buffers += 1
            self.unknown += len(records) - len(events)
            self.records += len(events)
            self._since_drain += len(records)
            self.unattributed += int((events["alloc_id"] == 0).sum())
        self.bus.publish(events)


def _attribute_id(cupti: Any, name: str) -> int:
    members = getattr(cupti, "ActivityAttribute", None)
    if members is None or name not in members.__members__:
        known = sorted(members.__members__) if members is not None else []
        raise InvalidArgumentError(f"unknown CUPTI activity attribute {name!r}", value=name,
                                   expected=", ".join(known) or "a cupti.ActivityAttribute name")
    return int(members[name])


def _set_attribute(cupti: Any, name: str, value: int) -> None:
    """``cuptiActivitySetAttribute``: attributes are ``size_t`` values, except a few ``uint8_t`` switches."""
    attr = _attribute_id(cupti, name)
    lib = _find_libcupti(cupti)
    if lib is None:
        raise BackendError("libcupti could not be found to set activity attributes")
    for ctype in (ctypes.c_size_t, ctypes.c_uint8):
        box, size = ctype(value), ctypes.c_size_t(ctypes.sizeof(ctype))
        status = lib.cuptiActivitySetAttribute(attr, ctypes.byref(size), ctypes.byref(box))
        if status == 0:
            return
    raise BackendError(f"CUPTI refused activity attribute {name}={value} (CUPTI status {status})")


def _get_attribute(cupti: Any, name: str) -> int | None:
    lib = _find_libcupti(cupti)
    if lib is None:
        return None
    for ctype in (ctypes.c_size_t, ctypes.c_uint8):
        box, size = ctype(0), ctypes.c_size_t(ctypes.sizeof(ctype))
        if lib.cuptiActivityGetAttribute(_attribute_id(cupti, name), ctypes.byref(size), ctypes.byref(box)) == 0:
            return int(box.value)
    return None


def _now_ns() -> int:
    """Now, on the backend's clock (the one records are moved onto)."""
    try:
        from ..backends import get_backend

        return int(get_backend().now_ns())
    except Exception:
        return time.perf_counter_ns()


def _current_cuda_device() -> int:
    """The device of the current backend, where it is a real GPU; else 0."""
    try:
        from ..backends import get_backend

        backend = get_backend()
    except Exception:
        return 0
    if getattr(backend, "is_simulated", True):
        return 0
    return int(backend.current_device())


@atexit.register
def _stop_at_exit() -> None:
    # CUPTI's worker thread must not call into a Python that is shutting down.
    collector = _active
    if collector is not None:
        with contextlib.suppress(Exception):
            collector.stop()

