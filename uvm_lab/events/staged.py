"""Records taken as they are published and read later, all at once: what a consumer that subscribes ``inline``
keeps until its reader (a view's update, a dashboard's refresh) wants them."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..errors import InvalidArgumentError
from .schema import EVENT_DTYPE

__all__ = ["StagedRecords", "joined"]


def joined(batches: Iterable[np.ndarray]) -> np.ndarray:
    """``batches`` of records (``EVENT_DTYPE``) as one new, writable array, in order. Joined as bytes:
    np.concatenate works out the structured dtype's promotion for each piece, and what a loop publishes comes in
    many small batches. Each batch's own buffer is read where it is contiguous (every published one is), with no
    copy of its own first."""
    batches = list(batches)
    try:
        data = bytearray().join(batches)  # type: ignore[arg-type]  # an ndarray is a buffer; stubs say otherwise
    except (BufferError, TypeError):   # a strided view among them (not bytes-like): read as a copy
        data = bytearray().join([batch.tobytes() for batch in batches])
    return np.frombuffer(data, dtype=EVENT_DTYPE)


class StagedRecords:
    """Records added and not read yet, as their bytes: each batch is copied in as it is delivered (its producer may
    reuse the array), and all are read out as one array. Copied as bytes: copying a structured array, or joining
    many, costs several times more per call, and a loop delivers many small batches. Not thread-safe."""

    def __init__(self) -> None:
        self._bytes = bytearray()

    def __len__(self) -> int:
        return len(self._bytes) // EVENT_DTYPE.itemsize

    def add(self, records: np.ndarray) -> None:
        if records.dtype != EVENT_DTYPE:
            raise InvalidArgumentError(f"records must have EVENT_DTYPE, got {records.dtype}", value=records.dtype,
                                       expected="uvm_lab.events.EVENT_DTYPE")
        self._bytes += records.tobytes()

    def take(self) -> np.ndarray:
        """Everything added since the last take, oldest first; empty afterwards."""
        data, self._bytes = self._bytes, bytearray()
        return np.frombuffer(data, dtype=EVENT_DTYPE)
