"""What a workload is: buffers, and phases that access them, described once for both sides.

A :class:`Workload` names its buffers (sizes in bytes) and lists :class:`Phase` objects. Each phase is an
access pattern (``stream``, ``strided``, ``gather``, ``stencil``, ``matmul``, ``host_write``,
``host_read``) over named buffers with its parameters. The simulator turns a phase into an access
stream (:mod:`uvm_lab.workloads.patterns`); the GPU side turns the same phase into a CuPy kernel on
managed memory (:mod:`uvm_lab.workloads.gpu`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgumentError
from ..units import PAGE_SIZE, parse_size

__all__ = ["PATTERNS", "Phase", "Workload"]

#: Access patterns a phase can have, and whether a GPU or the host runs them.
PATTERNS = {"stream": "gpu", "strided": "gpu", "gather": "gpu", "stencil": "gpu", "matmul": "gpu",
            "host_write": "host", "host_read": "host"}


@dataclass(frozen=True)
class Phase:
    """One step of a workload: ``pattern`` over ``buffers``, with its parameters.

    Parameters (by pattern)
    -----------------------
    stream: ``passes`` (1), ``write`` (False: the kernel reads; True: it writes every element).
    strided: ``stride`` (bytes, a multiple of 4), ``passes``, ``offset`` (bytes before the first read, a
    multiple of 4). gather: ``count`` (accesses), ``bytes_per_access`` (128, a warp's coalesced read), ``seed``.
    stencil: ``row_bytes`` (a row of the 2-D grid), ``passes``; reads ``buffers[0]``, writes ``buffers[1]``.
    matmul: ``tiles`` (tiles per side); ``buffers`` are A, B, C, each ``tiles**2`` tiles stored tile by tile.
    host_write / host_read: a host loop writing (reading) one byte of every page of the buffer; host_write
    takes ``every`` (1), to write one page in ``every``.
    """

    pattern: str
    buffers: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def processor(self) -> str:
        return PATTERNS[self.pattern]

    def param(self, name: str, default: Any) -> Any:
        return self.params.get(name, default)


@dataclass(frozen=True)
class Workload:
    """A named set of buffers and the phases that touch them.

    Raises
    ------
    InvalidArgumentError
        When a phase names an unknown pattern or buffer, or a size or parameter is out of range.
    """

    name: str
    buffers: dict[str, int]
    phases: tuple[Phase, ...]

    def __post_init__(self) -> None:
        if not self.buffers:
            raise InvalidArgumentError("a workload needs at least one buffer", value=self.buffers,
                                       expected="{name: size}")
        sizes = {}
        for name, size in self.buffers.items():
            sizes[name] = parse_size(size, name=f"buffer {name!r}", allow_zero=False)
            if sizes[name] % PAGE_SIZE:
                raise InvalidArgumentError(f"buffer {name!r} must be a whole number of 4 KiB pages, got {size!r}",
                                           value=size, expected="a multiple of 4096 bytes")
        object.__setattr__(self, "buffers", sizes)
        for phase in self.phases:
            if phase.pattern not in PATTERNS:
                raise InvalidArgumentError(f"unknown pattern {phase.pattern!r}", value=phase.pattern,
                                           expected=", ".join(PATTERNS))
            missing = [b for b in phase.buffers if b not in sizes]
            if missing or not phase.buffers:
                raise InvalidArgumentError(f"phase {phase.pattern!r} names buffers {missing or '()'} that the "
                                           f"workload does not have", value=phase.buffers,
                                           expected=", ".join(sizes))
            for key in ("passes", "count", "tiles", "every"):
                v = phase.params.get(key)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                    raise InvalidArgumentError(f"{key} must be a positive integer, got {v!r}", value=v,
                                               expected="a positive integer")
            for key in ("stride", "row_bytes", "bytes_per_access"):
                v = phase.params.get(key)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 4 or v % 4):
                    raise InvalidArgumentError(f"{key} must be a positive multiple of 4 bytes, got {v!r}", value=v,
                                               expected="a positive multiple of 4")
            write = phase.params.get("write")
            if write is not None and not isinstance(write, bool):
                raise InvalidArgumentError(f"write must be True or False, got {write!r}", value=write,
                                           expected="a bool")
            offset = phase.params.get("offset")
            if offset is not None:
                limit = sizes[phase.buffers[0]]
                if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 or offset % 4 \
                        or offset >= limit:
                    raise InvalidArgumentError(f"offset must be a multiple of 4 bytes inside buffer "
                                               f"{phase.buffers[0]!r} ({limit} bytes), got {offset!r}", value=offset,
                                               expected=f"a multiple of 4 in [0, {limit})")

    @property
    def total_bytes(self) -> int:
        """Bytes of all buffers together (the working set)."""
        return sum(self.buffers.values())
