"""A resource chain written as text, outermost first: ``"prefetch(pool(managed))"``.

For naming a chain where a value must be plain (an experiment's grid, a saved table):

>>> from uvm_lab.mr.chain import build_chain
>>> from uvm_lab.mr import resource_chain
>>> [type(mr).__name__ for mr in resource_chain(build_chain("statistics(pool(managed))"))]
['StatisticsResourceAdaptor', 'PoolMemoryResource', 'ManagedMemoryResource']

Each name is one of RMM's resources with its defaults: :data:`RESOURCES` at the bottom of the chain, and
:data:`ADAPTORS` over one upstream each.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..errors import InvalidArgumentError, shown
from .arena import ArenaMemoryResource
from .base import MemoryResource
from .binning import BinningMemoryResource
from .cuda_async import CudaAsyncMemoryResource
from .device import CudaMemoryResource, PinnedHostMemoryResource
from .managed import ManagedMemoryResource
from .pool import PoolMemoryResource
from .prefetch import PrefetchResourceAdaptor
from .statistics import StatisticsResourceAdaptor
from .tracking import TrackingResourceAdaptor

__all__ = ["ADAPTORS", "RESOURCES", "build_chain", "check_chain"]

#: The resources a chain ends with, by name.
RESOURCES: dict[str, Callable[[], MemoryResource]] = {
    "managed": ManagedMemoryResource,
    "managed_oversubscribing": lambda: ManagedMemoryResource(allow_oversubscription=True),
    "cuda": CudaMemoryResource,
    "async": CudaAsyncMemoryResource,
    "pinned": PinnedHostMemoryResource,
}
#: The resources and adaptors over one upstream, by name.
ADAPTORS: dict[str, Callable[[MemoryResource], MemoryResource]] = {
    "pool": PoolMemoryResource,
    "arena": ArenaMemoryResource,
    "binning": BinningMemoryResource,
    "prefetch": PrefetchResourceAdaptor,                                      # on allocation
    "prefetch_on_access": lambda up: PrefetchResourceAdaptor(up, on="access"),
    "statistics": StatisticsResourceAdaptor,
    "tracking": TrackingResourceAdaptor,
}

_WORD = re.compile(r"\s*([a-z_]+)\s*(\()?")


def check_chain(text: object) -> list[str]:
    """The chain's names, outermost first, every one checked; nothing is made.

    Raises
    ------
    InvalidArgumentError
        For anything but adaptors each wrapping one more, around one of :data:`RESOURCES`.
    """
    valid = (f"adaptors ({', '.join(ADAPTORS)}) each around one more, around a resource ({', '.join(RESOURCES)}), "
             f"such as 'prefetch(pool(managed))'")
    if not isinstance(text, str):
        raise InvalidArgumentError(f"a resource chain is text, got {shown(text)}", value=text, expected=valid)
    names, rest = [], text.strip()
    while rest:
        match = _WORD.match(rest)
        if match is None:
            break
        names.append(match[1])
        rest = rest[match.end():]
        if match[2] is None:
            break
    closing = rest.replace(" ", "")
    if not names or names[-1] not in RESOURCES or any(n not in ADAPTORS for n in names[:-1]) \
            or closing != ")" * (len(names) - 1):
        raise InvalidArgumentError(f"not a resource chain: {text!r}; write {valid}", value=text, expected=valid)
    return names


def build_chain(text: str) -> MemoryResource:
    """The chain ``text`` names, made on the current backend."""
    names = check_chain(text)
    mr = RESOURCES[names[-1]]()
    for name in reversed(names[:-1]):
        mr = ADAPTORS[name](mr)
    return mr
