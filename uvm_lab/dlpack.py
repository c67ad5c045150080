"""DLPack export of a buffer: ``torch.from_dlpack(buf)``, ``cupy.from_dlpack(buf)``, without a copy.

A buffer is exported as a 1-D ``uint8`` tensor in a legacy ``"dltensor"`` capsule (which every
consumer takes). The capsule keeps the buffer alive until the consumer calls the tensor's deleter,
or, when no consumer took it, until the capsule itself is collected.

Device types: managed and device memory are ``kDLCUDA`` (the pointer is valid on the GPU, which is
what consumers need; PyTorch refuses ``kDLCUDAManaged``), pinned host memory is ``kDLCUDAHost``.
:mod:`uvm_lab.torch` also exports managed memory as ``kDLCPU`` (the simulator's bytes, or managed memory
that the host reads), for CPU tensors over it.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from typing import Any

__all__ = ["KDL_CPU", "KDL_CUDA", "KDL_CUDA_HOST", "to_capsule"]

KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
_KDL_UINT = 1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

# What an export keeps alive until its deleter runs: the struct, its shape, and the buffer.
_exports: dict[int, tuple[_DLManagedTensor, Any, object]] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def _delete(managed: Any) -> None:
    with _lock:
        _exports.pop(int(managed.contents.manager_ctx or 0), None)


# Module-level C callbacks, never collected: consumers may call them at any time.
_deleter = _Deleter(_delete)

# The destructor gets the dying capsule as a raw pointer: wrapping it in a Python object again, at
# reference count zero, would free it twice.
_PyCapsule_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _PyCapsule_Destructor]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


def _capsule_destructor(capsule: int) -> None:
    # A consumer renames a capsule it took ("used_dltensor") and owns the tensor from then on; a
    # capsule still named "dltensor" was never taken, so its tensor is released here.
    if _capsule_is_valid(capsule, b"dltensor"):
        pointer = _capsule_pointer(capsule, b"dltensor")
        _delete(ctypes.cast(pointer, ctypes.POINTER(_DLManagedTensor)))


_destructor = _PyCapsule_Destructor(_capsule_destructor)


def to_capsule(owner: object, ptr: int, nbytes: int, device_type: int, device_id: int) -> object:
    """A ``"dltensor"`` capsule for ``nbytes`` bytes at ``ptr``, keeping ``owner`` alive until it is released."""
    shape = (ctypes.c_int64 * 1)(nbytes)
    managed = _DLManagedTensor()
    tensor = managed.dl_tensor
    tensor.data = ptr or None
    tensor.device = _DLDevice(device_type, device_id)
    tensor.ndim = 1
    tensor.dtype = _DLDataType(_KDL_UINT, 8, 1)
    tensor.shape = shape
    tensor.strides = None            # compact, row-major
    tensor.byte_offset = 0
    key = next(_ids)
    managed.manager_ctx = key
    managed.deleter = _deleter
    with _lock:
        _exports[key] = (managed, shape, owner)
    return _capsule_new(ctypes.addressof(managed), b"dltensor", _destructor)


def live_exports() -> int:
    """How many exported tensors no consumer has released yet (for tests and leak checks)."""
    return len(_exports)
