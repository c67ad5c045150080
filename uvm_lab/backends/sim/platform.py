"""Platform profiles: the link, fault and memory costs of a CPU-GPU system, as data.

``x86-pcie5`` is calibrated to an H200 on PCIe gen5 (driver 580): bandwidths measured directly (the
project's device probe and the measurements in the UVM semantics notes), and the fault paths' costs fitted
by least squares to 82 timed passes of the workloads and their variants on one H200 host
(``benchmarks/sim_calibrate.py`` over ``benchmarks/sim_vs_gpu_h200_b*.json`` and
``sim_vs_gpu_h200_variants.json``):

- prefetch HtoD 50.5 GB/s, DtoH 15.5 GB/s; pinned copies 55.3 GB/s; zero-copy reads 51 GB/s;
- one GPU fault batch: about 31 us, plus 3.6 us per VA block, 6.7 us per 2 MiB chunk it allocates, 0.05 us
  per fault, 0.002 us per page copied, and for the source mapping each migration takes away 0.042 us per page
  plus 4.9 us per contiguous range (a TLB shootdown, whatever its size; a read duplicate of a read-only page
  pays neither); a write fault 0.11 us more than a read (set from a later lease's paired sweeps); copies at
  up to 55.3 GB/s. A grid-stride kernel faults 1 GiB in at about 12.1 GB/s; a read
  every 128 KiB, whose faults move 16 separate 64 KiB ranges per block, at 8.0 GB/s of what it moves;
- evicting a 2 MiB root chunk copies it back at about 40 GB/s, synchronously on the fault path, where the
  fault also waits 50 us for the chunk (oversubscribed grid-stride passes run at 7 to 9 GB/s), and overlapped
  with the refill on the prefetch path (chunked prefetch at 1.5x runs at 34 to 41 GB/s);
- a CPU fault costs about 13 us plus its copies (fault-driven DtoH 20.1 GB/s asymptote);
- the host touching one byte of a resident page: 12 ns a read, 16.5 ns a write (the median of every lease);
- a kernel launched from Python and waited for: 0.096 ms on top of its work (the least any timed pass took);
  beyond it, a kernel reads resident pages at 3.0 TB/s (1 GiB in 0.43-0.57 ms, median 0.45, in the catalog's
  later passes on every lease).

Another H200 host with the same driver serviced the same faults 25-40 % more slowly (``sim_vs_gpu_h200.json``):
the fault path runs on the host's CPU, so a profile is a host's, not a GPU's.

``x86-pcie5-h100`` is the same host link with the fault paths' costs fitted on an H100 80GB HBM3
(``profiles/x86-pcie5-h100.json``, written by ``benchmarks/sim_calibrate.py --measure``): a profile any GPU machine
can fit for itself in under five minutes, and any machine can run.

The other profiles scale the link (``x86-pcie4``, ``x86-pcie3``: the UVMSmart PCIe3 fit of a GTX
1080 Ti) or describe a coherent system (``gh200-ats``: C2C at 375/297 GB/s, the CPU maps GPU memory,
access counters migrate hot remote data); they are marked as not calibrated against our own runs.

Transfers follow a size-dependent link model, the UVMSmart fit ``bw(s) = bw_max * (2/pi) * atan(k * s)``
(``s`` in KiB): a 4 KiB copy gets a fifth of the link, a 64 KiB copy most of it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InvalidArgumentError

__all__ = ["PLATFORMS", "Platform", "get_platform", "link_seconds"]

#: The UVMSmart fit's shape constant (per KiB), from its PCIe3 model of a GTX 1080 Ti.
UVMSMART_LINK_K = 0.07292


def link_seconds(nbytes: np.ndarray | int, bw_max: float, k: float) -> np.ndarray | float:
    """Seconds to move copies of ``nbytes`` each over a link of asymptote ``bw_max`` (size-dependent model).

    Parameters
    ----------
    nbytes
        Size of each copy in bytes (an int or an array of them).
    bw_max
        The link's asymptotic bandwidth in bytes per second, reached by large copies.
    k
        The shape constant of ``bw(s) = bw_max * (2/pi) * atan(k * s)`` with ``s`` in KiB.
    """
    s = np.asarray(nbytes, dtype=np.float64)
    bw = bw_max * (2 / math.pi) * np.arctan(k * s / 1024.0)
    out = np.divide(s, bw, out=np.zeros_like(s), where=s > 0)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class Platform:
    """Costs and capabilities of one kind of machine. Bandwidths in bytes/s, latencies in seconds."""

    name: str
    description: str
    # -- the link -------------------------------------------------------------------------------------------
    link_k: float                #: shape of the size-dependent link model (per KiB)
    prefetch_htod_bw: float      #: cudaMemPrefetchAsync to the GPU (asymptote)
    prefetch_dtoh_bw: float      #: cudaMemPrefetchAsync to the host (asymptote)
    fault_htod_bw: float         #: copies on the GPU fault path (asymptote)
    fault_dtoh_bw: float         #: copies on the CPU fault path (asymptote)
    eviction_bw: float           #: copying an evicted root chunk back to the host (asymptote)
    remote_bw: float             #: the GPU reading host memory through a mapping, no migration
    remote_host_bw: float        #: the host reading GPU memory through a mapping (ATS only)
    # -- fault service ----------------------------------------------------------------------------------------
    fault_batch_size: int        #: faults per batch after de-duplication (uvm_perf_fault_batch_count)
    fault_batch_latency: float   #: one batch: fetch, sort, replay
    fault_block_latency: float   #: servicing one VA block of a batch
    fault_page_latency: float    #: per page copied on a fault path, migrated or duplicated (mapping it)
    cpu_fault_latency: float     #: one CPU page fault, serviced alone
    # -- memory -------------------------------------------------------------------------------------------------
    gpu_populate_bw: float       #: zero-filling first-touched pages on the GPU
    host_populate_bw: float      #: zero-filling first-touched pages on the host
    gpu_memory_bw: float         #: a kernel reading resident pages
    host_memory_bw: float        #: the host touching resident pages
    warp_bw: float               #: what one warp streams on its own (latency-bound)
    gpu_pages_in_flight: int     #: distinct pages a full grid touches at once (grid-stride over 1 MiB)
    # -- what the system can do ---------------------------------------------------------------------------------
    cpu_maps_gpu_memory: bool = False        #: the CPU can map GPU memory (ATS/C2C); x86 PCIe cannot
    access_counter_migration: bool = False   #: access counters migrate hot remote data (R9: ATS only)
    access_counter_threshold: int = 256      #: remote accesses per 2 MiB region before a notification
    pageable_memory_access: bool = False     #: the GPU reaches malloc'd memory
    calibrated: bool = False                 #: True when the figures were measured on such a machine
    #: Per 2 MiB block that ``cudaMemPrefetchAsync`` walks, whether or not it moves anything: on the H200 a
    #: prefetch of an already resident 256 MiB range costs about 0.3-0.4 ms (128 blocks). Fitted (see the
    #: module's docstring), as are the other costs of this group but the remote round trip and the ReadMostly
    #: GPU write.
    prefetch_block_latency: float = 3.19e-6
    #: The least one host access to a resident page costs (a TLB and cache miss): a loop touching one byte
    #: of every page of 1 GiB took 2.6-4.9 ms on the H200 hosts, 10-19 ns a page.
    host_access_latency: float = 12e-9
    #: The least one host write to a resident page costs: a store misses too, and its line goes back dirty. A
    #: loop writing one byte of every page took 13.9-22.0 ns a page on the H200 hosts (45 timed passes over
    #: nine leases, 128 MiB to 2 GiB, median 16.5), where the loop reading them took 8.1-14.4 (median 11.8).
    host_write_latency: float = 16.5e-9
    #: Per ReadMostly page a GPU write fault takes to the writer (R3 (a): a write collapses the page to one
    #: copy, invalidating any other). Calibrated from the H200 measurements (driver 580,
    #: ``benchmarks/sim_vs_gpu_h200.json``): the stencil wrote its 1 GiB ReadMostly output in 60.3 s and the
    #: matmul its 1 GiB C in 55.0 s, 230 and 210 us a page, where batching them like any fault
    #: had simulated 0.24 and 0.37 s. Added per page on top of the batch; why the driver is this slow is not known.
    read_mostly_write_latency: float = 220e-6
    #: One host write fault on a ReadMostly page that the host alone holds: SetReadMostly (and read
    #: duplication) leave the host's mapping read-only, so the first write to each page faults, and the driver
    #: only upgrades the mapping (nothing moves, nothing is invalidated). It replaces ``cpu_fault_latency`` for
    #: such a fault. The host loop writing one byte of every page of a 1 GiB ReadMostly buffer took 0.99-1.01 s
    #: on the fitted host (1.31-1.36 s on the other).
    read_mostly_host_write_latency: float = 3.81e-6
    #: Per page a fault path copies whose source mapping must change: a migration unmaps the source copy; a
    #: read duplicate of a page its holder may write revokes that write access; a duplicate of a read-only
    #: page (ReadMostly, not written since the advice) changes nothing at the source and does not pay it (R3
    #: (a)). With ``fault_unmap_run_latency``, what separates a migration from a duplicate: on the H200 a read
    #: every 128 KiB of a ReadMostly buffer took 18.3 ms, of a plain one 59.5 ms (8,192 ranges of 64 KiB).
    fault_unmap_latency: float = 0.042e-6
    #: Per ReadMostly page a GPU read duplicates while the host may write it (the host wrote it since the
    #: advice or the last duplication): the driver takes the host's write access back, page by page, on top
    #: of ``fault_unmap_latency``. Set from the catalog's host_then_device under ReadMostly on five H200
    #: leases: the GPU's read of the host-written 1 GiB took 34-76 ms (median 57) more than that of a
    #: buffer the host had not written, where the unmap costs alone give 16 ms; (57 - 16) ms over 262,144 pages.
    read_mostly_protect_latency: float = 0.156e-6
    #: Per range of such pages, in place of ``fault_unmap_run_latency``: on one H200 lease, with the host
    #: having written one page in 2 and one in 8 of a 1 GiB ReadMostly buffer, each page its own range, the
    #: GPU's read took 3.2 and 3.4 us a range more than the per-page costs account for, against 4.92 us for
    #: a range unmapped by a migration (``benchmarks/sim_vs_gpu_h200_h_variants.json``).
    read_mostly_protect_run_latency: float = 3.3e-6
    #: One small read of host memory through a remote mapping, start to finish: such reads are bound by the
    #: round trip, not the link, and each warp has one in flight, so an access costs this divided by the
    #: pages in flight, or its bytes at ``remote_bw`` if that is longer. Fitted (least squares on the log of
    #: time, with ``kernel_launch_latency`` added) to the H200's strided passes under PreferredLocation=host +
    #: AccessedBy: 4-byte reads every 16 KiB to 8 MiB of a 1 GiB buffer on one lease, every 64 KiB on eight
    #: (``sim_vs_gpu_h200*.json``): 2.8 ns a read at 256 in flight; 14 of those 15 passes within 25 %, the
    #: 16 KiB stride (65,536 reads in 0.186 ms) simulated 1.50x.
    remote_request_latency: float = 0.72e-6
    #: A kernel launched from Python (CuPy) on an idle GPU and waited for (``cudaDeviceSynchronize``): what a
    #: timed pass costs beyond its work. On the H200 a pass of 128 remote reads, one every 8 MiB, took
    #: 0.096 ms, of 512 and of 2,048 reads 0.098 and 0.101 ms (``sim_vs_gpu_h200_variants.json``).
    #: :func:`uvm_lab.workloads.run_sim` adds it once to each GPU pass; a bare ``access_stream`` does not.
    kernel_launch_latency: float = 0.096e-3
    #: ``access()`` on a GPU, as the CUDA backend runs it: its byte-wise touch kernel (CuPy) launched and waited
    #: for with ``cudaStreamSynchronize``. On one H200 a 4 KiB range took 0.021-0.025 ms (medians of 20 calls),
    #: device or managed memory, any mode (``benchmarks/sim_access_h200.json``); on another, 0.026-0.033
    #: (``sim_access_h200_b.json``, measured after this was set: 14 of its 18 rows within 25 %).
    access_launch_latency: float = 0.021e-3
    #: The touch kernel on resident pages, beyond its launch: one byte loaded per thread and step, so far from
    #: the GPU's bandwidth. 1 GiB took 1.49 ms to read, 1.99 to write back, 0.86 to add 0 to every word
    #: atomically, device or managed memory alike (the same file).
    touch_read_bw: float = 0.73e12
    touch_write_bw: float = 0.546e12    #: see ``touch_read_bw``
    touch_atomic_bw: float = 1.28e12    #: see ``touch_read_bw``
    #: Copies between two GPUs of one host (a fault's or a prefetch's, DtoD): PCIe peer-to-peer through the root
    #: complex here (not measured: a typical gen5 peer copy), NVLink in ``x86-nvlink`` (the driver's migration
    #: rate between two NVLinked H100s, far under the link's own: ``benchmarks/sim_peer.py``).
    peer_bw: float = 40e9
    #: Whether a GPU can map a peer's memory (peer access): AccessedBy and PreferredLocation on another GPU then
    #: map it remotely instead of migrating it (R3 (e), (f)).
    peer_access: bool = True
    #: Per fault a GPU batch services (reading, sorting and de-duplicating its fault buffer entry): a read every
    #: 16 KiB (65,536 faults) took 79.6 ms on the H200 where one every 64 KiB (16,384 faults) moving the same
    #: bytes in the same ranges took 45-50 ms.
    fault_latency: float = 0.049e-6
    #: Per write fault a GPU batch services, on top of ``fault_latency``. A store does not stall its warp the
    #: way a load does, so a writing kernel keeps faulting while the batch is serviced. On one H200 lease, in
    #: rounds, a grid-stride write of 1 GiB of host-written pages took 121.0 ms where the read took 93.1
    #: (27.9 ms over 262,144 faults), and of 256 MiB 32.4 ms against about 23.3 (9.1 ms over 65,536):
    #: 0.11 us a fault (``benchmarks/sim_vs_gpu_h200_g_variants.json``). Set from those two rows; another lease,
    #: run after, put write sweeps of 0.5-2 GiB at 0.86-1.01x (``sim_vs_gpu_h200_j_variants.json``).
    fault_write_latency: float = 0.11e-6
    #: Per range of source pages a fault path unmaps (or write-protects): a TLB shootdown, whatever its size.
    fault_unmap_run_latency: float = 4.92e-6
    #: Per 2 MiB chunk evicted on a fault path, on top of copying its pages back: the fault waits for the chunk
    #: to be unmapped and given up (on the prefetch path evictions overlap the refill and do not wait).
    #: Calibrated to the published oversubscription passes (research/uvm-semantics.md section 3, a 4 GiB
    #: grid-stride read at 1.1-2.0x on an H200, ``benchmarks/sim_oversubscription.py``): their RMS log error is
    #: least at 50-60 us; the oversubscribed passes then read 7.6 GB/s against 6.9-9.1 measured.
    fault_eviction_latency: float = 50e-6
    #: Per 2 MiB GPU chunk a fault batch allocates (from free memory or by evicting) and maps for its block: a
    #: read every 2 MiB (one fault a block) took 18.7 us a fault on the H200, a sweep's second batch in a block
    #: far less.
    fault_chunk_latency: float = 6.66e-6

    def with_(self, **changes: Any) -> Platform:
        """A copy with some costs changed, for what-if experiments; unknown names raise.

        Raises
        ------
        InvalidArgumentError
            For a field the profile does not have, or a cost that is not a positive number.
        """
        names = {f.name for f in fields(self)}
        for key, value in changes.items():
            if key not in names:
                raise InvalidArgumentError(f"Platform has no field {key!r}", value=key,
                                           expected=", ".join(sorted(names)))
            current = getattr(self, key)
            if isinstance(current, float) and (isinstance(value, bool) or not isinstance(value, (int, float))
                                               or not value > 0):
                raise InvalidArgumentError(f"{key} must be a positive number, got {value!r}", value=value,
                                           expected="a positive number")
        return replace(self, **changes)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile as JSON (every field, by name), for :meth:`load` and for
        ``use_backend("sim", platform=path)`` on any machine. Returns the path."""
        out = Path(path)
        out.write_text(json.dumps({"format": _PROFILE_FORMAT, **asdict(self)}, indent=2) + "\n")
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Platform:
        """A profile written by :meth:`save`. A field it lacks takes :data:`x86-pcie5 <PLATFORMS>`'s value (a
        profile written before that cost existed); a field it does not know, or a value of the wrong kind, is
        refused.

        Raises
        ------
        InvalidArgumentError
            For a file that cannot be read, is not a profile, or holds a bad value.
        """
        source = Path(path)
        try:
            data = json.loads(source.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise InvalidArgumentError(f"cannot read a platform profile from {str(source)!r}: {err}", value=str(path),
                                       expected="a JSON file written by Platform.save") from err
        if not isinstance(data, dict) or data.pop("format", None) != _PROFILE_FORMAT:
            raise InvalidArgumentError(f"{str(source)!r} is not a platform profile (format {_PROFILE_FORMAT})",
                                       value=str(path), expected="a JSON file written by Platform.save")
        base = PLATFORMS["x86-pcie5"]
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise InvalidArgumentError(f"{str(source)!r} has fields a profile does not: {', '.join(unknown)}",
                                       value=unknown, expected=", ".join(sorted(known)))
        for name, value in data.items():
            kind = type(getattr(base, name))
            if kind is bool or kind is str:
                ok = isinstance(value, kind)
            else:   # a cost or a count: a positive number (an int where the profile's is)
                ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool) \
                    and value > 0
            if not ok:
                raise InvalidArgumentError(f"{str(source)!r}: {name} must be a {kind.__name__}"
                                           f"{'' if kind in (bool, str) else ' > 0'}, got {value!r}", value=value,
                                           expected=kind.__name__)
        values: dict[str, Any] = {k: float(v) if type(getattr(base, k)) is float else v for k, v in data.items()}
        return replace(base, **values)


#: The layout of a saved profile (:meth:`Platform.save`).
_PROFILE_FORMAT = 1


_PCIE5 = Platform(
    name="x86-pcie5",
    description="x86-64 host, one GPU on PCIe gen5 x16 (calibrated: H200, driver 580)",
    link_k=UVMSMART_LINK_K,
    prefetch_htod_bw=50.5e9,
    prefetch_dtoh_bw=15.5e9,
    fault_htod_bw=55.3e9,
    fault_dtoh_bw=20.1e9,
    eviction_bw=40e9,
    remote_bw=51.0e9,
    remote_host_bw=51.0e9,
    fault_batch_size=256,
    fault_batch_latency=31.3e-6,
    fault_block_latency=3.63e-6,
    fault_page_latency=0.002e-6,
    cpu_fault_latency=13.3e-6,
    gpu_populate_bw=205e9,
    host_populate_bw=10e9,
    gpu_memory_bw=3.0e12,
    host_memory_bw=20e9,
    warp_bw=0.5e9,
    gpu_pages_in_flight=256,
    calibrated=True,
)


def _scaled(name: str, description: str, link_scale: float, **more: Any) -> Platform:
    p = _PCIE5
    return replace(
        p, name=name, description=description, calibrated=False,
        prefetch_htod_bw=p.prefetch_htod_bw * link_scale, prefetch_dtoh_bw=p.prefetch_dtoh_bw * link_scale,
        fault_htod_bw=p.fault_htod_bw * link_scale, fault_dtoh_bw=p.fault_dtoh_bw * link_scale,
        eviction_bw=p.eviction_bw * link_scale, remote_bw=p.remote_bw * link_scale,
        remote_host_bw=p.remote_host_bw * link_scale, **more)


PLATFORMS: dict[str, Platform] = {
    p.name: p
    for p in (
        _PCIE5,
        _scaled("x86-pcie4", "x86-64 host, one GPU on PCIe gen4 x16 (link scaled from gen5; not calibrated)", 0.5,
                gpu_memory_bw=1.9e12),
        # The UVMSmart GTX 1080 Ti model: PCIe3 at about 12 GB/s, 45 us per far fault.
        _scaled("x86-pcie3", "x86-64 host, one GPU on PCIe gen3 x16 (UVMSmart's 1080 Ti fit; not calibrated)",
                11.22e9 / 50.5e9, fault_block_latency=45e-6, gpu_memory_bw=0.48e12),
        replace(_PCIE5, name="x86-nvlink",
                description="x86-64 host, GPUs on PCIe gen5 x16 joined by NVLink, as H100 pairs are (peer copies at "
                            "the rate prefetches ran between two NVLinked H100s; the rest is x86-pcie5's)",
                peer_bw=55e9, calibrated=False),
        replace(_PCIE5, name="gh200-ats",
                description="Grace Hopper: NVLink-C2C, ATS, access-counter migration (published figures; "
                            "not calibrated)",
                prefetch_htod_bw=375e9, prefetch_dtoh_bw=297e9, fault_htod_bw=375e9, fault_dtoh_bw=297e9,
                eviction_bw=297e9, remote_bw=375e9, remote_host_bw=297e9, gpu_memory_bw=3.4e12,
                host_memory_bw=486e9, cpu_maps_gpu_memory=True, access_counter_migration=True,
                pageable_memory_access=True, calibrated=False),
    )
}


# Profiles fitted on other machines, shipped as files (Platform.save): each by its name.
for _file in sorted((Path(__file__).parent / "profiles").glob("*.json")):
    _profile = Platform.load(_file)
    PLATFORMS[_profile.name] = _profile


def get_platform(platform: str | os.PathLike[str] | Platform) -> Platform:
    """Look a profile up by name, or read one from a file (a path ending in ``.json``: :meth:`Platform.save`'s), or
    pass a :class:`Platform` through.

    Raises
    ------
    InvalidArgumentError
        For a name that is not in :data:`PLATFORMS` (naming the valid ones), or a file that is not a profile.
    """
    if isinstance(platform, Platform):
        return platform
    if isinstance(platform, str) and platform in PLATFORMS:
        return PLATFORMS[platform]
    if isinstance(platform, os.PathLike) or (isinstance(platform, str) and platform.endswith(".json")):
        return Platform.load(platform)
    valid = ", ".join(sorted(PLATFORMS)) + ", or a profile's .json file"
    raise InvalidArgumentError(f"unknown platform {platform!r}; valid: {valid}", value=platform, expected=valid)
