"""The workloads of issue 5, each one description for the simulator and the GPU alike."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import InvalidArgumentError
from ..units import PAGE_SIZE, parse_size
from .spec import Phase, Workload

__all__ = ["WORKLOADS", "host_then_device", "make", "multi_pass_stream", "random_gather", "sequential_stream",
           "stencil", "strided", "tiled_matmul"]


def _size(size: int | str) -> int:
    n = parse_size(size, allow_zero=False)
    return -(-n // PAGE_SIZE) * PAGE_SIZE


def sequential_stream(size: int | str = "1GiB", write: bool = False) -> Workload:
    """A grid-stride kernel reads (or, with ``write``, writes) every byte of one buffer once."""
    if not isinstance(write, (bool, int)) or write not in (0, 1):
        raise InvalidArgumentError(f"write must be True or False, got {write!r}", value=write, expected="a bool")
    return Workload("sequential_stream", {"data": _size(size)},
                    (Phase("stream", ("data",), {"write": True} if write else {}),))


def multi_pass_stream(size: int | str = "1GiB", passes: int = 3) -> Workload:
    """The same sweep ``passes`` times: the oversubscription cliff shows from the second pass on."""
    return Workload("multi_pass_stream", {"data": _size(size)}, (Phase("stream", ("data",), {"passes": passes}),))


def strided(size: int | str = "1GiB", stride: int = 64 << 10, passes: int = 1, offset: int = 0) -> Workload:
    """One 4-byte read every ``stride`` bytes, from ``offset`` bytes into the buffer on."""
    return Workload("strided", {"data": _size(size)},
                    (Phase("strided", ("data",), {"stride": stride, "passes": passes, "offset": offset}),))


def random_gather(size: int | str = "1GiB", count: int | None = None, seed: int = 0) -> Workload:
    """Warps each read 128 B at random offsets (``count`` reads; by default one per page)."""
    n = _size(size)
    return Workload("random_gather", {"data": n},
                    (Phase("gather", ("data",), {"count": count or n // PAGE_SIZE, "seed": seed}),))


def stencil(size: int | str = "1GiB", row_bytes: int = 1 << 20, passes: int = 1) -> Workload:
    """A 3-row stencil over a 2-D grid: each output row reads three input rows."""
    n = _size(size)
    return Workload("stencil", {"input": n, "output": n},
                    (Phase("stencil", ("input", "output"), {"row_bytes": row_bytes, "passes": passes}),))


def tiled_matmul(size: int | str = "1GiB", tiles: int = 4) -> Workload:
    """C = A B swept tile by tile (``tiles`` per side): A's row of tiles and B's column of tiles per C tile."""
    n = _size(size)
    return Workload("tiled_matmul", {"a": n, "b": n, "c": n}, (Phase("matmul", ("a", "b", "c"), {"tiles": tiles}),))


def host_then_device(size: int | str = "1GiB", passes: int = 1, write_every: int = 1) -> Workload:
    """The host writes the buffer (one page in ``write_every``), a kernel reads it (``passes`` times), the host
    reads it back."""
    return Workload("host_then_device", {"data": _size(size)},
                    (Phase("host_write", ("data",), {"every": write_every} if write_every != 1 else {}),
                     Phase("stream", ("data",), {"passes": passes}), Phase("host_read", ("data",))))


WORKLOADS: dict[str, Callable[..., Workload]] = {
    f.__name__: f for f in (sequential_stream, multi_pass_stream, strided, random_gather, stencil, tiled_matmul,
                            host_then_device)
}


def make(name: str, **params: object) -> Workload:
    """Build a workload by name (see :data:`WORKLOADS`).

    Raises
    ------
    InvalidArgumentError
        For an unknown name.
    """
    if name not in WORKLOADS:
        raise InvalidArgumentError(f"unknown workload {name!r}", value=name, expected=", ".join(WORKLOADS))
    return WORKLOADS[name](**params)
