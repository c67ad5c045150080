"""Streams: uvm_lab's own, and any other library's, as one kind of argument.

Every ``stream=`` in uvm_lab takes ``None`` (the default stream), a :class:`Stream`, a raw handle
(an int), or another library's stream: anything with ``__cuda_stream__`` (cuda.core, CuPy),
PyTorch's ``torch.cuda.Stream`` (``.cuda_stream``) and CuPy's ``Stream`` (``.ptr``).

On a GPU a :class:`Stream` made here owns a ``cudaStream_t``. On the simulator work is synchronous,
so a stream is only a label that events carry.
"""

from __future__ import annotations

import itertools
import threading
from numbers import Integral
from typing import Any

from .errors import InvalidArgumentError, InvalidStateError

__all__ = ["DEFAULT_STREAM", "Stream", "as_stream_handle"]

_EXPECTED = ("None, a uvm_lab.Stream, a non-negative int handle, or a stream of another library "
             "(with __cuda_stream__, such as cuda.core's or CuPy's, or torch.cuda.Stream)")

# Labels for simulated streams: high enough never to look like the default stream's handles (0, 1, 2).
_simulated_handles = itertools.count(0x5000)
_simulated_lock = threading.Lock()


def as_stream_handle(stream: object) -> int:
    """The ``cudaStream_t`` handle of ``stream`` as an int (``None`` is the default stream, 0).

    Raises
    ------
    InvalidArgumentError
        ``stream`` is none of the accepted kinds, or a negative handle.
    """
    if stream is None:
        return 0
    if type(stream) is int:
        if stream >= 0:
            return stream
    elif isinstance(stream, Stream):
        if stream.handle >= 0:
            return stream.handle
        raise InvalidArgumentError("stream has been closed; make a new ul.Stream()", value=stream, expected=_EXPECTED)
    elif isinstance(stream, Integral) and not isinstance(stream, bool):
        if int(stream) >= 0:
            return int(stream)
    else:
        handle = _foreign_handle(stream)
        if handle is not None:
            return handle
    raise InvalidArgumentError(f"stream must be {_EXPECTED}; got {stream!r} ({type(stream).__name__})",
                               value=stream, expected=_EXPECTED)


def _foreign_handle(stream: object) -> int | None:
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        # The CUDA stream protocol: a method returning (version, handle); version 0 is the only one.
        try:
            version, handle = protocol() if callable(protocol) else protocol
        except (TypeError, ValueError):
            return None
        return int(handle) if version == 0 and isinstance(handle, Integral) and int(handle) >= 0 else None
    name = type(stream).__name__
    module = type(stream).__module__ or ""
    if module.startswith("torch") and isinstance(getattr(stream, "cuda_stream", None), Integral):
        return int(stream.cuda_stream)  # type: ignore[attr-defined]
    if module.startswith("cupy") and name.endswith("Stream") and isinstance(getattr(stream, "ptr", None), Integral):
        return int(stream.ptr)  # type: ignore[attr-defined]
    return None


class Stream:
    """A CUDA stream, as RMM's ``Stream``: a new one, or a view of another library's.

    Parameters
    ----------
    obj
        ``None`` (the default) makes a new stream on the current backend, owned by this object and
        destroyed by :meth:`close` or when the object is collected. Anything else that ``stream=``
        takes (an int handle, CuPy's, PyTorch's or cuda.core's stream) gives a view that owns nothing.

    Examples
    --------
    >>> s = ul.Stream()
    >>> buf = ul.DeviceBuffer(size="64MiB", stream=s)
    >>> buf.prefetch("gpu", stream=s)
    >>> s.synchronize()
    """

    def __init__(self, obj: object = None) -> None:
        from .backends import get_backend

        self._backend: Any = None
        self._owned = obj is None
        if obj is None:
            backend = get_backend()
            create = getattr(backend, "create_stream", None)
            if create is None:          # the simulator: synchronous, a stream is a label
                with _simulated_lock:
                    self.handle = next(_simulated_handles)
            else:
                self.handle = int(create())
                self._backend = backend
        else:
            self.handle = as_stream_handle(obj)

    @property
    def is_default(self) -> bool:
        """Whether this is the legacy default stream (handle 0)."""
        return self.handle == 0

    @property
    def owns(self) -> bool:
        """Whether this object made the stream (and will destroy it)."""
        return self._owned

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol, so cuda.core, CuPy and others take a uvm_lab stream."""
        return (0, self.handle)

    def __int__(self) -> int:
        return self.handle

    def synchronize(self) -> None:
        """Wait until all work queued on the stream has finished."""
        if self.handle < 0:
            raise InvalidStateError("this stream has been closed")
        from .backends import get_backend

        backend = self._backend or get_backend()
        sync = getattr(backend, "synchronize_stream", None)
        if sync is not None:
            sync(self.handle)

    def close(self) -> None:
        """Destroy a stream this object made (a view, or a closed stream: nothing to do)."""
        backend, self._backend = self._backend, None
        if backend is not None and self._owned and self.handle > 0:
            backend.destroy_stream(self.handle)
        if self._owned:
            self.handle = -1

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:  # noqa: SIM105 - a destructor never raises, and at exit contextlib may be gone
            self.close()
        except Exception:
            pass

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Stream):
            return self.handle == other.handle
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.handle)

    def __repr__(self) -> str:
        if self.handle < 0:
            return "Stream(closed)"
        kind = "default" if self.handle == 0 else ("owned" if self._owned else "view")
        return f"Stream({self.handle:#x}, {kind})"


#: The legacy default stream (handle 0), what ``stream=None`` means.
DEFAULT_STREAM = Stream(0)
