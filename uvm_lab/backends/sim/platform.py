"""Platform profiles: the link and fault costs of a CPU-GPU system, as data.

``x86-pcie5`` is calibrated to an H200 on PCIe gen5 (driver 580; the project's device probe):
prefetch HtoD 50.5 GB/s and DtoH 15.5 GB/s, fault-driven HtoD 6.7 GB/s, CPU-fault DtoH 4.4 GB/s,
zero-copy reads 51 GB/s, one fault batch round trip about 20 us. The other profiles scale the link
and are marked as not yet calibrated against hardware.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...errors import InvalidArgumentError

__all__ = ["PLATFORMS", "Platform", "get_platform"]


@dataclass(frozen=True)
class Platform:
    """Costs of one kind of machine. Bandwidths in bytes/s, latencies in seconds."""

    name: str
    description: str
    prefetch_htod_bw: float      #: cudaMemPrefetchAsync to the GPU
    prefetch_dtoh_bw: float      #: cudaMemPrefetchAsync to the host
    fault_htod_bw: float         #: migration bandwidth on the GPU fault path
    fault_dtoh_bw: float         #: migration bandwidth on the CPU fault path
    remote_bw: float             #: GPU reads of host memory over the link, no migration
    fault_batch_latency: float   #: one GPU fault batch: fetch, service, replay
    fault_batch_size: int        #: faults per batch (uvm_perf_fault_batch_count)
    cpu_fault_latency: float     #: one CPU page fault (per 64 KiB serviced)
    gpu_populate_bw: float       #: zero-filling first-touched pages on the GPU
    host_populate_bw: float      #: zero-filling first-touched pages on the host
    gpu_memory_bw: float         #: a kernel reading resident pages
    host_memory_bw: float        #: the host touching resident pages
    calibrated: bool = False     #: True when the figures were measured on such a machine

    def with_(self, **changes: Any) -> Platform:
        """A copy with some costs changed, for what-if experiments."""
        return replace(self, **changes)


_PCIE5 = Platform(
    name="x86-pcie5",
    description="x86-64 host, one GPU on PCIe gen5 x16 (calibrated: H200, driver 580)",
    prefetch_htod_bw=50.5e9,
    prefetch_dtoh_bw=15.5e9,
    fault_htod_bw=6.9e9,
    fault_dtoh_bw=4.6e9,
    remote_bw=51.0e9,
    fault_batch_latency=20e-6,
    fault_batch_size=256,
    cpu_fault_latency=1e-6,
    gpu_populate_bw=205e9,
    host_populate_bw=10e9,
    gpu_memory_bw=2.5e12,
    host_memory_bw=20e9,
    calibrated=True,
)


def _scaled(name: str, description: str, link_scale: float) -> Platform:
    p = _PCIE5
    return replace(
        p, name=name, description=description, calibrated=False,
        prefetch_htod_bw=p.prefetch_htod_bw * link_scale, prefetch_dtoh_bw=p.prefetch_dtoh_bw * link_scale,
        fault_htod_bw=p.fault_htod_bw * min(1.0, link_scale * 1.5), fault_dtoh_bw=p.fault_dtoh_bw * link_scale,
        remote_bw=p.remote_bw * link_scale,
    )


PLATFORMS: dict[str, Platform] = {
    p.name: p
    for p in (
        _PCIE5,
        _scaled("x86-pcie4", "x86-64 host, one GPU on PCIe gen4 x16 (link scaled from gen5; not calibrated)", 0.5),
        _scaled("x86-pcie3", "x86-64 host, one GPU on PCIe gen3 x16 (link scaled from gen5; not calibrated)", 0.25),
    )
}


def get_platform(platform: str | Platform) -> Platform:
    """Look a profile up by name (or pass a :class:`Platform` through)."""
    if isinstance(platform, Platform):
        return platform
    if isinstance(platform, str) and platform in PLATFORMS:
        return PLATFORMS[platform]
    valid = ", ".join(sorted(PLATFORMS))
    raise InvalidArgumentError(f"unknown platform {platform!r}; valid: {valid}", value=platform, expected=valid)
