"""uvm_lab: a workbench for CUDA unified memory.

    import uvm_lab as ul
    ul.use_backend("sim", device_memory="4GiB")
    buf = ul.DeviceBuffer(size="512MiB")
    buf.prefetch("gpu")
    ul.residency(buf).summary()
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import deferred, errors, events, mr, statistics
from .access import touch
from .advisor import Recommendations, advise
from .backends import get_backend, use_backend
from .backends.base import AccessResult
from .buffer import DeviceBuffer, find_buffer, live_buffers
from .events.trace import Trace, record
from .location import Location
from .mr import (
    available_device_memory,
    is_initialized,
    register_reinitialize_hook,
    reinitialize,
    unregister_reinitialize_hook,
)
from .residency_map import ResidencyMap, get_tracker, residency
from .stream import DEFAULT_STREAM, Stream
from .trace_replay import Replayed, replay
from .units import format_bytes, parse_size

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_STREAM",
    "AccessResult",
    "DeviceBuffer",
    "Location",
    "Recommendations",
    "Replayed",
    "ResidencyMap",
    "Stream",
    "Trace",
    "__version__",
    "advise",
    "available_device_memory",
    "compare",
    "deferred",
    "errors",
    "events",
    "find_buffer",
    "format_bytes",
    "get_backend",
    "is_initialized",
    "live_buffers",
    "load_ipython_extension",
    "mr",
    "parse_size",
    "record",
    "register_reinitialize_hook",
    "reinitialize",
    "replay",
    "residency",
    "snapshot",
    "statistics",
    "touch",
    "unload_ipython_extension",
    "unregister_reinitialize_hook",
    "use_backend",
]

get_tracker()  # residency maps are built from events: start listening before the first allocation


#: Subpackages imported on first use (``ul.workloads``, ``ul.experiment``): they bring pandas and the catalog, which
#: importing uvm_lab need not pay for.
_ON_FIRST_USE = ("experiment", "workloads")


def __getattr__(name: str) -> Any:
    if name in _ON_FIRST_USE:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the built lab extension lives (for ``jupyter labextension develop``)."""
    return [{"src": "labextension", "dest": "uvm-lab"}]


def compare(workload: Any, grid: Any = None, **options: Any) -> Any:
    """Run a workload over a grid of configurations and return the table: see
    :func:`uvm_lab.experiment.compare`."""
    from .experiment import compare as run

    return run(workload, grid, **options)


def snapshot(trace: Trace | None, path: str | os.PathLike[str], **options: Any) -> Path:
    """Write ``trace``'s view (or, for None, every event still held) to ``path`` as one self-contained HTML
    file that opens anywhere, with no network and no server: see :func:`uvm_lab.jupyter.snapshot.snapshot`."""
    from .jupyter.snapshot import snapshot as write

    return write(trace, path, **options)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext uvm_lab``: the magics, the dashboard and the lab panel's comm target."""
    from .jupyter import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .jupyter import unload_ipython_extension as unload

    unload(ipython)
