"""The uvm_lab exception tree.

Every error raised on purpose by uvm_lab derives from :class:`UvmLabError`, and each leaf
also subclasses the builtin it refines, so ``except ValueError`` keeps working::

    UvmLabError
    ├── InvalidArgumentError (ValueError)      a bad value given to a public entry point
    │   ├── InvalidSizeError                   "12 parsecs", -1, 0 where a size is needed
    │   ├── TraceFileError                     a truncated, corrupted or foreign trace file
    │   ├── InvalidLocationError               "tpu", device 7 on a one-device machine
    │   └── InvalidAdviceError                 an advice name that CUDA does not have
    ├── InvalidStateError (RuntimeError)       the call is fine but the object is not
    │   ├── BufferClosedError                  prefetch, advise or touch of freed memory
    │   ├── DoubleFreeError                    deallocate of a pointer already freed
    │   └── BackendError                       a backend cannot do what was asked
    │       └── CudaError                      a CUDA call failed: its error name and explanation
    ├── OutOfMemoryError (MemoryError)         an allocation that does not fit
    └── ProtocolError (ValueError)             a malformed message from the front end

Errors carry their data as attributes (``err.value``, ``err.size`` ...) and pickle, so they
survive being sent across processes. Raising one never leaves state half-changed: every
entry point validates before it mutates.
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = [
    "BackendError",
    "BufferClosedError",
    "CudaError",
    "DoubleFreeError",
    "InvalidAdviceError",
    "InvalidArgumentError",
    "InvalidLocationError",
    "InvalidSizeError",
    "InvalidStateError",
    "OutOfMemoryError",
    "ProtocolError",
    "TraceFileError",
    "UvmLabError",
    "shown",
]


def _bounded_repr() -> reprlib.Repr:
    short = reprlib.Repr()
    short.maxlevel = 3
    short.maxstring = short.maxother = 60
    short.maxlong = 40
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = short.maxfrozenset = 6
    return short


_SHORT = _bounded_repr()


def shown(value: object) -> str:
    """``repr(value)`` as an error message names it: at most a few lines, however long or deep the value (a
    message names a bad value, it does not repeat ten megabytes of it, or recurse through a thousand levels)."""
    try:
        return _SHORT.repr(value)
    except Exception:   # an int past Python's digit limit, a repr that raises: the type must do
        size = f" of {value.bit_length()} bits" if isinstance(value, int) else ""
        return f"<{type(value).__name__}{size}>"


class UvmLabError(Exception):
    """Root of every error uvm_lab raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Data is passed by keyword (with defaults), so rebuild from the message, then restore it.
        return (type(self), self.args, self.__dict__)


class InvalidArgumentError(UvmLabError, ValueError):
    """A public entry point was given a value it cannot accept.

    ``value`` is what arrived; ``expected`` says what would have been valid.
    """

    def __init__(self, message: str, *, value: Any = None, expected: str = "") -> None:
        super().__init__(message)
        self.value = value
        self.expected = expected


class InvalidSizeError(InvalidArgumentError):
    """A size that is not a non-negative whole number of bytes (or a string such as "2GiB")."""


class TraceFileError(InvalidArgumentError):
    """A file that is not a trace uvm_lab can read: the message names the file and what is wrong with it."""

    def __init__(self, message: str, *, path: Any = None) -> None:
        super().__init__(message, value=path, expected="a file written by Trace.save")
        self.path = path


class InvalidLocationError(InvalidArgumentError):
    """A location that is neither the host nor a device that exists."""


class InvalidAdviceError(InvalidArgumentError):
    """An advice name or value that CUDA's ``cudaMemAdvise`` does not have."""


class InvalidStateError(UvmLabError, RuntimeError):
    """The arguments are fine, but the object cannot do this now."""


class BufferClosedError(InvalidStateError):
    """The buffer's memory has been freed; it can no longer be prefetched, advised or touched."""


class DoubleFreeError(InvalidStateError):
    """A pointer was given back to a memory resource that does not hold it (already freed, or never its own)."""

    def __init__(self, message: str, *, ptr: int = 0) -> None:
        super().__init__(message)
        self.ptr = ptr


class BackendError(InvalidStateError):
    """The backend cannot do what was asked (a missing capability, or a driver error)."""


class CudaError(BackendError):
    """A CUDA runtime call failed; ``name`` is CUDA's (``cudaErrorInvalidValue``), ``code`` its number."""

    def __init__(self, message: str, *, name: str = "", code: int = 0) -> None:
        super().__init__(message)
        self.name = name
        self.code = code


class OutOfMemoryError(UvmLabError, MemoryError):
    """An allocation of ``size`` bytes did not fit: ``free`` bytes were left under a ``limit``."""

    def __init__(self, message: str, *, size: int = 0, free: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.size = size
        self.free = free
        self.limit = limit


class ProtocolError(UvmLabError, ValueError):
    """A message from the front end that is not one of the known commands, or is malformed."""

    def __init__(self, message: str, *, command: Any = None) -> None:
        super().__init__(message)
        self.command = command
