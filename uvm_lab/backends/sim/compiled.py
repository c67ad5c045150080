"""The simulator's compiled core (``_simcore``, built from the C files beside this one), where the package was built
with a C compiler.

``core`` is the extension module, or None; every user keeps its numpy or Python twin for that case, and a switch
(``FaultEngine.compiled``, ``GpuMemory.compiled``) so that the tests can hold the one to the other.
"""

from __future__ import annotations

from types import ModuleType

from ...events.schema import EVENT_DTYPE

__all__ = ["COMPILED", "core"]

core: ModuleType | None
try:
    from . import _simcore as core
except ImportError:
    core = None
if core is not None and getattr(core, "RECORD_SIZE", None) != EVENT_DTYPE.itemsize:
    core = None   # built from older sources: its records would not line up with EVENT_DTYPE (rebuild it)

#: Whether the compiled core is there.
COMPILED = core is not None
