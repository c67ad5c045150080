"""uvm_lab's allocator under torch's CUDA tensors, on a real GPU: each scenario in a process of its own
(tests/gpu/torch_allocator_child.py), since torch takes one allocator per process, before its first tensor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
allocator = pytest.importorskip("uvm_lab.allocators.torch")
CHILD = Path(__file__).with_name("torch_allocator_child.py")
MiB = 1 << 20


def run(scenario: str, **env: str) -> dict:
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    if not allocator.SHIM.is_file():
        pytest.skip(f"{allocator.SHIM.name} was not built here (it needs a C++ compiler)")
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(CHILD), scenario], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": path, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_cuda_tensor_comes_from_uvm_lab_charged_to_its_line(cuda):
    seen = run("current")
    assert seen["total"] == float(MiB * (MiB - 1))                      # torch computes in uvm_lab's memory
    assert seen["label"] == "torch" and seen["managed"] and seen["size"] == 4 * MiB
    # arange wrote it on the GPU, by faults uvm_lab does not see with tracing off: never "nowhere", never the host
    residency = seen["residency"]
    assert residency.get("gpu", 0) + residency.get("unknown", 0) == 1.0, residency
    # x's 4 MiB from arange's line, and y's from the line that multiplies (two below it)
    lines = (seen["line"], seen["line"] + 2)
    assert len(seen["sources"]) == 2
    assert all(s.endswith(f"torch_allocator_child.py:{n}") for s, n in zip(seen["sources"], lines, strict=True))
    # uvm_lab's statistics agree with what torch holds from it; torch's own statistics say they are not kept
    assert seen["uvm_lab_bytes"] == seen["stats"]["allocated_bytes.all.current"] >= 8 * MiB
    assert "does not yet support getDeviceStats" in seen["torch_stats"]
    assert seen["after"]["allocated_bytes.all.current"] == seen["uvm_lab_bytes_after"] == 0


def test_a_failed_allocation_is_torchs_error_with_uvm_labs_reason(cuda):
    seen = run("out_of_memory")
    assert seen["error"].startswith("RuntimeError") and "uvm_lab could not allocate 134217728 bytes" in seen["error"]
    assert seen["after"]["allocation.all.current"] == 0 and seen["small"] == 1024.0


def test_a_mem_pool_keeps_torchs_statistics_which_agree_with_uvm_labs(cuda):
    seen = run("pool")
    # torch's statistics count the pool's segments with the rest (backward's own allocations, off this thread, are
    # not in the pool); the pool's own snapshot is exactly what uvm_lab holds for it
    assert seen["pool_reserved"] == seen["uvm_lab"]["reserved_bytes.all.current"] > 0
    assert seen["torch_reserved"] >= seen["pool_reserved"]
    assert seen["torch_segments"] >= seen["uvm_lab"]["segment.all.current"] > 0
    assert 0 < seen["torch_allocated"] <= seen["torch_reserved"]
    assert seen["uvm_lab"]["allocation.all.current"] == 0               # the pool's tensors are torch's to count
    assert seen["managed"] and any("0.weight" in label for label in seen["labels"])
    assert seen["pool_error"] == "OutOfMemoryError"
    assert seen["uvm_lab_after_error"] == seen["uvm_lab"]["segment.all.current"]   # the failure changed nothing


def test_enabling_uvm_makes_torchs_tensors_managed_and_to_moves_them_in_place(cuda):
    seen = run("enable")
    assert seen["managed"]
    moved = seen["moved"]
    assert moved["same_memory"] and moved["device"] == "cpu" and moved["value"] == 4321.0
    assert moved["host_share"] == 1.0 and moved["where"] == "cpu"
    assert "cannot change its allocator back" in seen["disable"]


def test_enabling_after_torchs_first_cuda_tensor_says_what_to_do_instead(cuda):
    seen = run("too_late")
    assert "before the first CUDA tensor" in seen["error"] and "mem_pool()" in seen["error"]
    assert seen["enabled"] is False


def test_the_environment_variable_enables_it_when_uvm_lab_torch_is_imported(cuda):
    seen = run("environment", PYTORCH_ENABLE_UNIFIED_MEMORY="1")
    assert seen == {"enabled": True, "managed": True}
