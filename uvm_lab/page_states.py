"""What one byte says about one 4 KiB page: which processors hold a copy, and what the map cannot know.

A page state is a bitmask:

=========  ===========================================================================================
bit 0      the host holds a copy (:data:`HOST`)
bit d + 1  GPU ``d`` holds a copy, for ``d`` in ``0 .. MAX_GPUS - 1`` (GPU 0 and GPU 1 are different places)
bit 7      :data:`UNKNOWN`: GPUs may hold copies the map cannot name. The page holds data somewhere (it
           became unknown when a GPU or the driver worked on it unobserved); the host bit beside it is
           exact where the host's page tables were read, and GPU bits beside it are copies known to exist.
=========  ===========================================================================================

So 0 is "nowhere" (never touched), 1 "on the host", 2 "on GPU 0", 3 "on the host and GPU 0" (a
read-duplicated page), 0x80 "unknown", 0x81 "on the host; whether a GPU also holds it, unknown". A copy on
a GPU beyond ``MAX_GPUS`` cannot be named in a byte, so it reads as unknown rather than as some other GPU.

Views do not decode bits: they draw :func:`categories`, one code per page with a name in
:data:`CATEGORY_NAMES`, so every view names and colours a state the same way.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from .location import HOST_ID

__all__ = [
    "BOTH",
    "CATEGORY_NAMES",
    "GPU",
    "HOST",
    "MAX_GPUS",
    "NOWHERE",
    "UNKNOWN",
    "bit",
    "bits",
    "categories",
    "count_states",
    "gpu_bits",
    "state_name",
]

NOWHERE = 0
HOST = 1
GPU = 2        #: GPU 0's bit
BOTH = 3       #: the host and GPU 0
UNKNOWN = 0x80
MAX_GPUS = 6
_GPU_BITS = 0x7E


def bit(processor: int) -> int:
    """The state bit of a processor: the host (``HOST_ID``), or a GPU ordinal; :data:`UNKNOWN` past ``MAX_GPUS``."""
    if processor == HOST_ID:
        return HOST
    return 1 << (processor + 1) if 0 <= processor < MAX_GPUS else UNKNOWN


def bits(processors: np.ndarray) -> np.ndarray:
    """:func:`bit` of each processor id in an array, as ``uint8``."""
    p = np.asarray(processors, dtype=np.int64)
    gpu = (p >= 0) & (p < MAX_GPUS)
    return np.where(p == HOST_ID, HOST, np.where(gpu, np.left_shift(1, np.where(gpu, p, 0) + 1), UNKNOWN)
                    ).astype(np.uint8)


#: The name of each category :func:`categories` gives, by code.
CATEGORY_NAMES: tuple[str, ...] = ("nowhere", "host", "both", "unknown", "gpus",
                                   *(f"gpu:{d}" for d in range(MAX_GPUS)))
_GPU_CATEGORY = 5   # "gpu:0"'s code; GPU d's is 5 + d


def _category_of(state: int) -> int:
    gpus = [d for d in range(MAX_GPUS) if state & (1 << (d + 1))]
    if state & UNKNOWN:
        return 3
    if state & HOST:
        return 2 if gpus else 1
    if not gpus:
        return 0
    return _GPU_CATEGORY + gpus[0] if len(gpus) == 1 else 4


_CATEGORY = np.array([_category_of(s) for s in range(256)], dtype=np.uint8)


def categories(states: np.ndarray) -> np.ndarray:
    """The category code of each page state (``uint8``; names in :data:`CATEGORY_NAMES`).

    ``nowhere``, ``host``, ``both`` (the host and one or more GPUs), ``unknown`` (whatever the host bit),
    ``gpus`` (two or more GPUs, not the host), and ``gpu:d`` (GPU ``d`` alone).
    """
    return np.take(_CATEGORY, np.asarray(states, dtype=np.uint8))   # take: half the time of [] indexing


def count_states(states: np.ndarray) -> np.ndarray:
    """How many pages are in each of the 256 page states: an ``int64`` array of 256, in one pass."""
    return _count_states(np.ascontiguousarray(states, dtype=np.uint8).reshape(-1))


@njit(types.int64[::1](types.uint8[::1]), cache=True)
def _count_states(states: np.ndarray) -> np.ndarray:
    # Compiled: np.bincount widens every byte to a machine word first, and a live view counts every map it shows
    # that changed. Four tables, so that a run of one state does not wait on its own last count.
    tables = np.zeros((4, 256), np.int64)
    whole = len(states) - len(states) % 4
    for i in range(0, whole, 4):
        tables[0, states[i]] += 1
        tables[1, states[i + 1]] += 1
        tables[2, states[i + 2]] += 1
        tables[3, states[i + 3]] += 1
    for i in range(whole, len(states)):
        tables[0, states[i]] += 1
    return tables[0] + tables[1] + tables[2] + tables[3]


def state_name(state: int) -> str:
    """A page state in words: ``"nowhere"``, ``"host"``, ``"gpu:1"``, ``"host+gpu:0"``, ``"host+unknown"`` ..."""
    if isinstance(state, bool) or not isinstance(state, (int, np.integer)) or not 0 <= state <= 255:
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(f"a page state is a byte, 0..255; got {state!r}", value=state, expected="0..255")
    parts = ["host"] if state & HOST else []
    parts += [f"gpu:{d}" for d in range(MAX_GPUS) if state & (1 << (d + 1))]
    parts += ["unknown"] if state & UNKNOWN else []
    return "+".join(parts) or "nowhere"


def gpu_bits(states: np.ndarray) -> np.ndarray:
    """The GPU bits of each state (nonzero where some GPU is known to hold a copy)."""
    return np.asarray(states, dtype=np.uint8) & np.uint8(_GPU_BITS)
