"""Choosing the device: ``use_backend("sim" | "cuda" | "auto")`` and ``get_backend()``."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import BackendError, InvalidArgumentError
from .base import AccessMode, AccessResult, Backend, RangeAdvice
from .sim import SimBackend

__all__ = ["AccessMode", "AccessResult", "Backend", "RangeAdvice", "SimBackend", "get_backend", "has_backend",
           "use_backend", "using_backend"]

_BACKENDS = ("auto", "sim", "cuda")
_current: Backend | None = None
_lock = threading.Lock()


def _cuda_backend_class() -> Any | None:
    """The CUDA backend, if this installation has one and a usable GPU; otherwise None."""
    if importlib.util.find_spec("uvm_lab.backends.cuda") is None:
        return None
    from .cuda import CudaBackend  # only this module touches cuda.*

    return CudaBackend if CudaBackend.is_available() else None


def use_backend(name: str | Backend = "auto", *, watch: bool | None = None, **options: Any) -> Backend:
    """Make a new backend current and return it.

    ``"sim"`` is the simulated device (options: ``device_memory``, ``platform``, ``devices``: how many GPUs, each
    with ``device_memory``, and the profile's peer link between them; see ``SimBackend``); ``"cuda"`` the real
    GPU; ``"auto"`` picks ``"cuda"`` where a usable GPU and the CUDA backend are present, else ``"sim"``.
    A backend made earlier (say, the one ``get_backend()`` returned before an experiment made its own) is made
    current again as it is. Resources and buffers made earlier keep the backend they were made on; the current
    device resource starts afresh on the new one.

    ``watch`` runs the host watcher (``ul.tracing.watch()``), which keeps the maps of a real GPU true with
    tracing off; by default it runs on a real GPU, and never on the simulator, whose maps are exact.
    """
    if not isinstance(name, Backend) and name not in _BACKENDS:
        raise InvalidArgumentError(f"backend must be one of {', '.join(_BACKENDS)} or a Backend, got {name!r}",
                                   value=name, expected=", ".join(_BACKENDS) + ", or a Backend")
    if watch is not None and not isinstance(watch, bool):
        raise InvalidArgumentError(f"watch must be True, False or None, got {watch!r}", value=watch,
                                   expected="a bool, or None for the backend's default")
    if isinstance(name, Backend) and options:
        raise InvalidArgumentError(f"options are for a new backend, not one made already: got {sorted(options)}",
                                   value=sorted(options), expected="no options with a Backend")
    backend: Backend
    if isinstance(name, Backend):
        backend = name
    else:
        cuda = _cuda_backend_class() if name in ("auto", "cuda") else None
        if name == "cuda" and cuda is None:
            raise BackendError("the CUDA backend is not available here: it needs an NVIDIA GPU, its driver and "
                               "uvm_lab's cuda extra (pip install 'uvm_lab[cuda]'); use_backend('sim') simulates one")
        backend = cuda(**options) if cuda is not None else SimBackend(**options)
    if watch and backend.is_simulated:
        raise InvalidArgumentError("watch=True needs a real GPU: the simulator has no host page tables to read",
                                   value=watch, expected="False or None on the simulator")
    _make_current(backend, watch=(watch is None and not backend.is_simulated) or bool(watch))
    return backend


def _make_current(backend: Backend | None, *, watch: bool = False) -> None:
    """``backend`` current (None: none, so that the next :func:`get_backend` picks one), the last one's host
    watcher stopped, and this one's started where ``watch`` says."""
    global _current
    from ..tracing.watcher import unwatch
    from ..tracing.watcher import watch as start_watching

    unwatch()   # the last backend's, if any
    with _lock:
        _current = backend
    if watch:
        start_watching()


def get_backend() -> Backend:
    """The current backend; the first call picks one as ``use_backend("auto")`` does."""
    return _current if _current is not None else use_backend("auto")


def has_backend() -> bool:
    """Whether a backend is current (``use_backend`` was called, or ``get_backend`` picked one), without picking one."""
    return _current is not None


@contextmanager
def using_backend(name: str | Backend = "auto", **options: Any) -> Iterator[Backend]:
    """:func:`use_backend` for the length of a ``with`` block: the backend current before it, or none (so that the
    next :func:`get_backend` picks one, as it would have), is current again after it."""
    with _lock:
        before = _current
    backend = use_backend(name, **options)
    try:
        yield backend
    finally:
        if before is not None:
            use_backend(before)
        else:
            _make_current(None)
