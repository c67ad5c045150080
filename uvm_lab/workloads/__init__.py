"""Workloads: one description, run as an access stream on the simulator or as CuPy kernels on a GPU.

>>> from uvm_lab import workloads
>>> w = workloads.multi_pass_stream("64MiB", passes=3)
>>> [round(r.gb_per_s) > 0 for r in workloads.run_sim(w, device_memory="48MiB")]
[True, True, True]
"""

from .catalog import (
    WORKLOADS,
    host_then_device,
    make,
    multi_pass_stream,
    random_gather,
    sequential_stream,
    stencil,
    strided,
    tiled_matmul,
)
from .gpu import gpu_available, run_gpu
from .patterns import Chunk, phase_stream, stream_shape
from .sim import POLICIES, PhaseResult, parse_policy, run_sim
from .spec import PATTERNS, Phase, Workload

__all__ = [
    "PATTERNS",
    "POLICIES",
    "WORKLOADS",
    "Chunk",
    "Phase",
    "PhaseResult",
    "Workload",
    "gpu_available",
    "host_then_device",
    "make",
    "multi_pass_stream",
    "parse_policy",
    "phase_stream",
    "random_gather",
    "run_gpu",
    "run_sim",
    "sequential_stream",
    "stencil",
    "stream_shape",
    "strided",
    "tiled_matmul",
]
