"""One scenario of uvm_lab's torch allocator in a process of its own (torch takes one allocator per process,
before its first CUDA tensor): ``python torch_allocator_child.py SCENARIO``. Prints one JSON line of what it
saw, for tests/gpu/test_torch_allocator_gpu.py to check."""

from __future__ import annotations

import gc
import json
import sys

import torch

import uvm_lab as ul
from uvm_lab import deferred
from uvm_lab.allocators import torch as allocator
from uvm_lab.mr import LimitingResourceAdaptor, ManagedMemoryResource, set_current_device_resource
from uvm_lab.statistics import enable_statistics, get_statistics

MiB = 1 << 20


def settle() -> None:
    gc.collect()
    torch.cuda.synchronize()
    deferred.run()


def current() -> dict:
    """RMM's way: every CUDA tensor of the process from uvm_lab."""
    enable_statistics()
    torch.cuda.memory.change_current_allocator(allocator.uvm_lab_torch_allocator)
    with ul.record() as trace:
        x = torch.arange(MiB, dtype=torch.float32, device="cuda")   # the line the allocation is charged to
        line = sys._getframe().f_lineno - 1
        y = x * 2
        total = float(y.sum())
        buffer = allocator.buffer_at(x.data_ptr())
        seen = {"total": total, "label": buffer.label, "managed": buffer.is_managed, "size": buffer.size,
                "residency": ul.residency(buffer).summary(),
                "uvm_lab_bytes": get_statistics().current_bytes, "stats": allocator.memory_stats()}
        try:
            torch.cuda.memory_stats()
            seen["torch_stats"] = "answered"
        except RuntimeError as exc:
            seen["torch_stats"] = str(exc)
        del x, y
        settle()
    allocs = trace.to_pandas().query("kind == 'alloc' and bytes == @MiB * 4")
    seen.update(sources=list(allocs["source"]), line=line, after=allocator.memory_stats(),
                uvm_lab_bytes_after=get_statistics().current_bytes)
    return seen


def out_of_memory() -> dict:
    """A failure under change_current_allocator: torch raises, with uvm_lab's reason, and goes on."""
    set_current_device_resource(LimitingResourceAdaptor(ManagedMemoryResource(), allocation_limit=64 * MiB))
    torch.cuda.memory.change_current_allocator(allocator.uvm_lab_torch_allocator)
    try:
        torch.empty(128 * MiB, dtype=torch.uint8, device="cuda")
        error = None
    except RuntimeError as exc:
        error = f"{type(exc).__name__}: {exc}"
    after = allocator.memory_stats()
    small = torch.ones(1024, device="cuda")
    return {"error": error, "after": after, "small": float(small.sum())}


def pool() -> dict:
    """A MemPool: torch's caching allocator in front, its statistics whole, uvm_lab's segments behind."""
    import uvm_lab.torch as ut

    warm = torch.ones(1, device="cuda")   # torch's own allocator is initialized: pools work all the same
    base = torch.cuda.memory_stats()
    mem_pool = allocator.mem_pool()
    with torch.cuda.use_mem_pool(mem_pool):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 16)).cuda()
        x = torch.randn(256, 1024, device="cuda")
        model(x).square().mean().backward()
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    names = ut.label(model)
    seen = {
        "torch_reserved": stats["reserved_bytes.all.current"] - base["reserved_bytes.all.current"],
        "torch_segments": stats["segment.all.current"] - base["segment.all.current"],
        "torch_allocated": stats["allocated_bytes.all.current"] - base["allocated_bytes.all.current"],
        "pool_reserved": sum(segment["total_size"] for segment in mem_pool.snapshot()),
        "uvm_lab": allocator.memory_stats(),
        "managed": ut.is_managed(model[0].weight),
        "labels": sorted(set(names.values())),
        "grad_managed": ut.is_managed(model[0].weight.grad),
    }
    # A failure in a pool is torch's OutOfMemoryError, after torch has freed what it caches and tried again.
    set_current_device_resource(LimitingResourceAdaptor(ManagedMemoryResource(), allocation_limit=64 * MiB))
    with torch.cuda.use_mem_pool(mem_pool):
        try:
            torch.empty(128 * MiB, dtype=torch.uint8, device="cuda")
            seen["pool_error"] = None
        except torch.OutOfMemoryError as exc:
            seen["pool_error"] = type(exc).__name__
    del model, x, warm
    settle()
    seen["uvm_lab_after_error"] = allocator.memory_stats()["segment.all.current"]
    return seen


def enable() -> dict:
    """RFC-0023 on a GPU: enabling makes torch's CUDA tensors managed, moved in place by uvm_lab.torch.to."""
    import uvm_lab.torch as ut

    ut.set_enabled_uvm(True)
    t = torch.arange(MiB, dtype=torch.float32, device="cuda")
    managed = ut.is_managed(t)
    c = ut.to(t, "cpu")
    moved = {"same_memory": c.data_ptr() == t.data_ptr(), "device": str(c.device), "value": float(c[4321]),
             "host_share": ul.residency(ut.buffer_of(t)).summary().get("host", 0.0), "where": ut.device_of(t)}
    try:
        ut.set_enabled_uvm(False)
        disable = None
    except ul.errors.BackendError as exc:
        disable = str(exc)
    return {"managed": managed, "moved": moved, "disable": disable}


def too_late() -> dict:
    """Enabling after torch made a CUDA tensor with its own allocator: a BackendError that names the way out."""
    import uvm_lab.torch as ut

    torch.ones(1, device="cuda")
    try:
        ut.set_enabled_uvm(True)
        return {"error": None, "enabled": ut.get_enabled_uvm()}
    except ul.errors.BackendError as exc:
        return {"error": str(exc), "enabled": ut.get_enabled_uvm()}


def environment() -> dict:
    """PYTORCH_ENABLE_UNIFIED_MEMORY=1: importing uvm_lab.torch makes the allocator torch's."""
    import uvm_lab.torch as ut

    t = torch.ones(4096, device="cuda")
    return {"enabled": ut.get_enabled_uvm(), "managed": ut.is_managed(t)}


if __name__ == "__main__":
    ul.use_backend("cuda", watch=False)
    print(json.dumps(globals()[sys.argv[1]]()))
