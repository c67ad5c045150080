"""One CSV row per allocation and free: RMM's ``LoggingResourceAdaptor``.

The file is RMM's format, so RMM's replay and analysis tools read it::

    Thread,Time,Action,Pointer,Size,Stream
    81233,14:02:51.120334,allocate,0x7f0000000000,1000,0
    81233,14:02:51.120410,free,0x7f0000000000,1000,0

``Thread`` is the OS thread id, ``Time`` the wall-clock time (``%H:%M:%S`` and microseconds),
``Action`` one of ``allocate``, ``allocate failure`` and ``free``; ``Pointer`` is printed as C's
``%p`` prints it (``(nil)`` for the null pointer of a failure), ``Stream`` as RMM prints a stream
handle (``0`` for the default stream, hex otherwise).

The file is truncated when the adaptor is made, and written through a buffer: :meth:`flush`
pushes it to disk. Unlike RMM, a ``free`` row is written after the upstream took the pointer
back, so a double free that raises leaves no row behind.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime
from typing import TextIO

from ..errors import InvalidArgumentError
from ..paths import file_path
from .base import MemoryResource, ResourceAdaptor

__all__ = ["HEADER", "LoggingResourceAdaptor"]

#: The CSV header, RMM's.
HEADER = "Thread,Time,Action,Pointer,Size,Stream"
#: The environment variable read when no ``log_file_name`` is given, RMM's.
LOG_FILE_ENV = "RMM_LOG_FILE"


def _pointer(ptr: int) -> str:
    return f"{ptr:#x}" if ptr else "(nil)"


def _stream(stream: int) -> str:
    return f"{stream:#x}" if stream else "0"


class LoggingResourceAdaptor(ResourceAdaptor):
    """Writes a CSV row for every allocation, failed allocation and free through it.

    Parameters
    ----------
    upstream_mr
        The resource that hands out the memory.
    log_file_name
        The CSV file to write (truncated). ``None`` reads the ``RMM_LOG_FILE`` environment variable.

    Raises
    ------
    InvalidArgumentError
        ``upstream_mr`` is not a memory resource, ``log_file_name`` is not a path, or neither it nor
        ``RMM_LOG_FILE`` names a file, or the file cannot be opened.

    Examples
    --------
    >>> mr = ul.mr.LoggingResourceAdaptor(ul.mr.ManagedMemoryResource(), "rmm_log.csv")
    >>> mr.deallocate(mr.allocate(1000), 1000)
    >>> mr.flush()
    """

    def __init__(self, upstream_mr: MemoryResource, log_file_name: str | os.PathLike[str] | None = None) -> None:
        if log_file_name is None:
            log_file_name = os.environ.get(LOG_FILE_ENV) or None
            if log_file_name is None:
                raise InvalidArgumentError(
                    f"a log file must be given, either as log_file_name= or in the {LOG_FILE_ENV} "
                    f"environment variable", value=None, expected="a file name")
        name = file_path(log_file_name, name="log_file_name", expected="a str or os.PathLike file name")
        super().__init__(upstream_mr)
        try:
            self._file: TextIO | None = open(name, "w", encoding="utf-8")  # noqa: SIM115 - lives with the adaptor
        except OSError as err:
            raise InvalidArgumentError(f"cannot open log file {name!r} for writing: {err}", value=log_file_name,
                                       expected="a writable file path") from err
        self._file_name = name
        self._file.write(HEADER + "\n")
        self._write_lock = threading.Lock()

    def get_file_name(self) -> str:
        """The file the rows go to."""
        return self._file_name

    def flush(self) -> None:
        """Push buffered rows to the file."""
        with self._write_lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        """Flush and close the file; later allocations still work and are no longer logged."""
        with self._write_lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _row(self, action: str, ptr: int, size: int, stream: int) -> None:
        now = datetime.now().strftime("%H:%M:%S.%f")
        with self._write_lock:
            if self._file is not None:
                self._file.write(f"{threading.get_native_id()},{now},{action},{_pointer(ptr)},{size},"
                                 f"{_stream(stream)}\n")

    def _allocate(self, size: int, stream: int) -> int:
        try:
            ptr = self.upstream_mr.allocate(size, stream)
        except Exception:
            self._row("allocate failure", 0, size, stream)
            raise
        self._row("allocate", ptr, size, stream)
        return ptr

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        self.upstream_mr.deallocate(ptr, size, stream)
        self._row("free", ptr, size, stream)

    def __del__(self) -> None:
        file = getattr(self, "_file", None)
        if file is not None:
            try:  # noqa: SIM105 - at exit the module's globals may be gone
                file.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.upstream_mr!r}, log_file_name={self._file_name!r})"
