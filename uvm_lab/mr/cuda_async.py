"""Stream-ordered device memory from the driver's pool: RMM's ``CudaAsyncMemoryResource``.

On a GPU, as in RMM, the resource creates a memory pool of its own (``cudaMemPoolCreate``) with the
release threshold given (``cudaMemPoolAttrReleaseThreshold``; the maximum, "keep everything", when
none is) and the export handle types asked for (POSIX file descriptors for ``enable_ipc``, fabric
handles for ``enable_fabric``), primes it with ``initial_pool_size`` (allocated and freed once), and
allocates with ``cudaMallocFromPoolAsync`` / ``cudaFreeAsync``. The pool is destroyed with the
resource. On the simulator the resource models that pool:

* Memory is device memory (``MemoryKind.DEVICE``): it never migrates and is never evicted.
* The pool reserves device memory from the backend in chunks of whole 2 MiB blocks (each chunk a
  backend segment, with its SEGMENT_ALLOC event) and cuts allocations best-fit out of them;
  freed ranges coalesce within their chunk.
* ``release_threshold`` is the driver's ``cudaMemPoolAttrReleaseThreshold``: the pool keeps up to
  that many reserved bytes when they are unused, and gives wholly free chunks back beyond it.
  The driver trims at synchronization points; the simulator is synchronous, so it trims right
  after each free. ``None`` (RMM's default) keeps everything.
* ``initial_pool_size`` reserves a first chunk at construction (RMM allocates and frees that much).
* As the driver does, a request the device cannot satisfy first gives the pool's wholly free
  chunks back and tries once more; if it still fails it raises
  :class:`~uvm_lab.errors.OutOfMemoryError`, with every allocation as it was (only unused
  reserved memory may have gone back).

On another backend the resource needs the backend's stream-ordered entry points (``create_async_pool``,
``allocate_async``, ``free_async`` ...), and raises :class:`~uvm_lab.errors.BackendError` where they
are missing.
"""

from __future__ import annotations

from ..backends import Backend, get_backend
from ..deferred import defer
from ..errors import BackendError, InvalidArgumentError, OutOfMemoryError
from ..events.schema import MemoryKind
from ..units import BLOCK_SIZE, format_bytes, parse_size
from .arena import FreeRanges
from .base import MemoryResource, device_of
from .fixed_size import _align_up

__all__ = ["CudaAsyncMemoryResource"]


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be a bool, got {value!r}", value=value, expected="True or False")
    return value


class CudaAsyncMemoryResource(MemoryResource):
    """Device memory from a stream-ordered pool (``cudaMallocAsync``).

    Parameters
    ----------
    initial_pool_size
        Bytes to reserve now, an int or a string such as ``"1GiB"``; ``None`` (the default) reserves
        nothing until the first allocation.
    release_threshold
        Unused reserved bytes the pool keeps rather than gives back; ``None`` (the default) keeps all.
    enable_ipc
        Make the pool's memory shareable with other processes (POSIX file descriptors). Not on the
        simulator.
    enable_fabric
        Make the pool's memory shareable across nodes (fabric handles). Not on the simulator.
    device
        The GPU the pool lives on (keyword only); the current device when None.

    Raises
    ------
    InvalidSizeError
        A size that is not a non-negative number of bytes.
    InvalidArgumentError
        A flag that is not a bool, or ``initial_pool_size > release_threshold``.
    BackendError
        The backend has no stream-ordered allocation, or cannot share memory as asked.
    OutOfMemoryError
        The device cannot hold ``initial_pool_size``.

    Examples
    --------
    >>> mr = ul.mr.CudaAsyncMemoryResource(initial_pool_size="256MiB", release_threshold="1GiB")
    >>> ptr = mr.allocate("10MiB", stream=0)
    >>> mr.deallocate(ptr, "10MiB", stream=0)
    """

    def __init__(self, initial_pool_size: int | str | None = None, release_threshold: int | str | None = None,
                 enable_ipc: bool = False, enable_fabric: bool = False, *, device: int | None = None) -> None:
        initial = 0 if initial_pool_size is None else parse_size(initial_pool_size, name="initial_pool_size")
        threshold = None if release_threshold is None else parse_size(release_threshold, name="release_threshold")
        ipc = _flag(enable_ipc, "enable_ipc")
        fabric = _flag(enable_fabric, "enable_fabric")
        if threshold is not None and initial > threshold:
            raise InvalidArgumentError(
                f"initial_pool_size ({format_bytes(initial)}) is larger than release_threshold "
                f"({format_bytes(threshold)}): the pool would give the difference back at once; raise the "
                f"threshold or lower the initial size", value=initial_pool_size,
                expected=f"at most release_threshold = {threshold}")
        backend = get_backend()
        device = device_of(backend, device)
        self._simulated = backend.name == "sim"
        if not self._simulated and not hasattr(backend, "create_async_pool"):
            raise BackendError(
                f"CudaAsyncMemoryResource is not available on the {backend.name!r} backend yet: it has no "
                f"stream-ordered allocation (allocate_async); use CudaMemoryResource or PoolMemoryResource")
        if self._simulated and (ipc or fabric):
            what = "enable_ipc" if ipc else "enable_fabric"
            raise BackendError(f"{what}=True needs shareable memory handles, which the simulated backend does not "
                               f"have; leave it False on the simulator")
        super().__init__(backend, device)
        self._initial = initial
        self._threshold = threshold
        self.enable_ipc = ipc
        self.enable_fabric = fabric
        self._ranges = FreeRanges()              # the simulated pool's chunks and free ranges
        self._pool: int | None = None            # the driver's pool, on a GPU
        if not self._simulated:
            handles = (("posix_file_descriptor",) if ipc else ()) + (("fabric",) if fabric else ())
            create = backend.create_async_pool  # type: ignore[attr-defined]  # checked above: the CUDA backend's
            self._pool = create(device=self.device_id, release_threshold=threshold, handles=handles)
        if initial:
            with self._lock:
                if self._simulated:
                    self._reserve(_align_up(initial), 0)
                else:      # as RMM primes the driver's pool: allocate the initial size and free it
                    ptr = self._allocate(initial, 0)
                    self._deallocate(ptr, initial, 0)

    # -- what the pool is -----------------------------------------------------------------------
    @property
    def release_threshold(self) -> int | None:
        """Unused reserved bytes the pool keeps (None: all of them)."""
        return self._threshold

    def pool_size(self) -> int:
        """Bytes the pool has reserved from the device, in use and free (``cudaMemPoolAttrReservedMemCurrent``)."""
        if self._pool is not None:
            return int(self.backend.async_pool_reserved(self._pool))  # type: ignore[attr-defined]
        return sum(self._ranges.blocks.values())

    def upstream_blocks(self) -> list[tuple[int, int]]:
        """``(address, size)`` of every chunk the simulated pool has reserved, by address.

        Raises
        ------
        BackendError
            On a GPU, whose driver does not say how it carves its pool.
        """
        if self._pool is not None:
            raise BackendError("the CUDA driver does not list the chunks of a memory pool; use pool_size()")
        with self._lock:
            return sorted(self._ranges.blocks.items())

    def trim_to(self, nbytes: int | str) -> None:
        """``cudaMemPoolTrimTo``: give unused reserved memory back until at most ``nbytes`` are reserved."""
        keep = parse_size(nbytes, name="nbytes")
        with self._lock:
            if self._pool is not None:
                self.backend.synchronize()       # frees still queued on streams are not yet unused
                self.backend.trim_async_pool(self._pool, keep)  # type: ignore[attr-defined]
            else:
                self._trim(keep)

    def pool_handle(self) -> int:
        """The driver's ``cudaMemPool_t``, for ``CudaAsyncViewMemoryResource`` or IPC.

        Raises
        ------
        BackendError
            On the simulator, which has no driver pool (nor, yet, a backend that exposes one).
        """
        if self._pool is None:
            raise BackendError(f"the {self.backend.name!r} backend has no driver memory pool to hand out; "
                               f"pool_handle() needs the CUDA backend")
        return self._pool

    # -- allocation -----------------------------------------------------------------------------
    def _allocate(self, size: int, stream: int) -> int:
        if not self._simulated:
            return int(self.backend.allocate_async(size, device=self.device_id, stream=stream,  # type: ignore[attr-defined]
                                                   pool=self._pool))
        need = _align_up(size)
        ptr = self._ranges.take(need)
        if ptr is None:
            self._reserve(need, stream)
            ptr = self._ranges.take(need)
            assert ptr is not None
        return ptr

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        if not self._simulated:
            self.backend.free_async(ptr, stream=stream)  # type: ignore[attr-defined]
            return
        self._ranges.give(ptr, _align_up(size))
        if self._threshold is not None:
            self._trim(self._threshold)

    def _reserve(self, need: int, stream: int) -> None:
        chunk = -(-need // BLOCK_SIZE) * BLOCK_SIZE
        try:
            ptr = self.backend.allocate(chunk, MemoryKind.DEVICE, device=self.device_id, stream=stream)
        except OutOfMemoryError as err:
            if not any(self._ranges.is_free(p) for p in self._ranges.blocks):
                raise self._out_of_memory(need, err.free, err.limit, f"the device cannot reserve it ({err})") from err
            self._trim(0)
            try:
                ptr = self.backend.allocate(chunk, MemoryKind.DEVICE, device=self.device_id, stream=stream)
            except OutOfMemoryError as again:
                raise self._out_of_memory(need, again.free, again.limit,
                                          f"the device cannot reserve it, even with the pool's unused memory "
                                          f"given back ({again})") from again
        self._ranges.add_block(ptr, chunk)

    def _trim(self, keep: int) -> None:
        reserved = self.pool_size()
        for ptr, size in sorted(self._ranges.blocks.items(), key=lambda b: (-b[1], b[0])):
            if reserved <= keep:
                break
            if self._ranges.is_free(ptr):
                self._ranges.remove_block(ptr)
                self.backend.free(ptr)
                reserved -= size

    # -- lifetime -------------------------------------------------------------------------------
    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            # The driver keeps a destroyed pool's memory until its last allocation is freed.
            try:  # noqa: SIM105 - at exit the module's globals may be gone
                defer(self.backend.destroy_async_pool, pool)  # type: ignore[attr-defined]
            except Exception:
                pass
            return
        ranges = getattr(self, "_ranges", None)
        if ranges is None or not ranges.blocks:
            return
        try:  # noqa: SIM105 - at exit the module's globals may be gone
            defer(_free_blocks, self.backend, ranges.blocks)
        except Exception:
            pass

    def __repr__(self) -> str:
        threshold = None if self._threshold is None else format_bytes(self._threshold)
        return (f"{type(self).__name__}(pool_size={format_bytes(self.pool_size())!r}, "
                f"release_threshold={threshold!r})")


def _free_blocks(backend: Backend, blocks: dict[int, int]) -> None:
    """A collected pool's chunks go back to the device (run later, by :mod:`uvm_lab.deferred`)."""
    for ptr in list(blocks):
        backend.free(ptr)
        del blocks[ptr]
