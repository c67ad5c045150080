"""The simulator with several GPUs: each with its own memory and eviction, pages moving between them over the peer
link, ReadMostly copies on every reader, remote mappings of a peer's memory where the platform has peer access."""

from __future__ import annotations

import numpy as np
import pytest

from uvm_lab.backends.sim import PLATFORMS, SimBackend
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EventBus
from uvm_lab.events.schema import Advice, EventKind, MemoryKind, MigrationCause, RemoteMapCause
from uvm_lab.location import Location
from uvm_lab.units import BLOCK_SIZE, PAGE_SIZE

MiB = 1 << 20
HOST, GPU0, GPU1 = Location.host(), Location.device(0), Location.device(1)


def backend(devices: int = 2, memory: str = "64MiB", **options) -> tuple[SimBackend, EventBus]:
    bus = EventBus(capacity=1 << 20)
    return SimBackend(device_memory=memory, devices=devices, bus=bus, **options), bus


def of(records: np.ndarray, kind: EventKind, cause: int | None = None) -> np.ndarray:
    picked = records[records["kind"] == kind]
    return picked if cause is None else picked[picked["flags"] == cause]


def test_each_gpu_has_its_own_memory():
    b, _ = backend()
    assert b.device_count() == 2
    ptr = b.allocate(4 * MiB, MemoryKind.MANAGED)
    b.access(ptr, 4 * MiB, GPU1, "write")
    assert b.mem_info(1)[0] == 64 * MiB - 4 * MiB and b.mem_info(0)[0] == 64 * MiB
    assert (b.page_states(ptr, 4 * MiB) == 4).all()                    # bit 2: device 1


def test_a_fault_on_another_gpu_migrates_the_page_over_the_peer_link():
    b, bus = backend()
    ptr = b.allocate(2 * MiB, MemoryKind.MANAGED)
    b.access(ptr, 2 * MiB, GPU0, "write")
    bus.history()
    r = b.access(ptr, 2 * MiB, GPU1, "read")
    records = bus.history()
    copies = of(records, EventKind.DTOD)
    assert copies["bytes"].sum() == 2 * MiB and set(copies["src"]) == {0} and set(copies["dst"]) == {1}
    assert not len(of(records, EventKind.HTOD)) and not len(of(records, EventKind.DTOH))
    assert r.bytes_htod == 0 and r.bytes_dtoh == 0 and r.bytes_dtod == 2 * MiB   # the access says what it moved
    assert (b.page_states(ptr, 2 * MiB) == 4).all()                    # moved: gone from device 0
    assert b.mem_info(0)[0] == 64 * MiB                                # its chunk given back


def test_the_peer_link_sets_what_a_peer_migration_costs():
    seconds = {}
    for name in ("x86-pcie5", "x86-nvlink"):
        b, _ = backend(platform=name)
        ptr = b.allocate(8 * MiB, MemoryKind.MANAGED)
        b.prefetch(ptr, 8 * MiB, GPU0)
        start = b.now_ns()
        b.prefetch(ptr, 8 * MiB, GPU1)
        seconds[name] = (b.now_ns() - start) / 1e9
    assert PLATFORMS["x86-nvlink"].peer_bw > PLATFORMS["x86-pcie5"].peer_bw
    assert seconds["x86-nvlink"] < seconds["x86-pcie5"]


def test_a_prefetch_to_a_gpu_copies_from_the_peer_that_holds_the_data():
    b, bus = backend()
    ptr = b.allocate(4 * MiB, MemoryKind.MANAGED)
    b.prefetch(ptr, 4 * MiB, GPU0)
    bus.history()
    b.prefetch(ptr, 4 * MiB, GPU1)
    copies = of(bus.history(), EventKind.DTOD, MigrationCause.USER)
    assert copies["bytes"].sum() == 4 * MiB and set(copies["src"]) == {0}
    assert (b.page_states(ptr, 4 * MiB) == 4).all()
    assert b.mem_info(0)[0] == 64 * MiB and b.mem_info(1)[0] == 60 * MiB   # device 0's chunks given back
    b.prefetch(ptr, 4 * MiB, HOST)
    back = of(bus.history(), EventKind.DTOH, MigrationCause.USER)
    assert back["bytes"].sum() == 4 * MiB and set(back["src"]) == {1}


def test_read_mostly_duplicates_the_page_on_every_reader():
    b, bus = backend()
    ptr = b.allocate(2 * MiB, MemoryKind.MANAGED)
    b.access(ptr, 2 * MiB, HOST, "write")
    b.advise(ptr, 2 * MiB, Advice.SET_READ_MOSTLY, None)
    bus.history()
    b.access(ptr, 2 * MiB, GPU0, "read")
    b.access(ptr, 2 * MiB, GPU1, "read")
    assert (b.page_states(ptr, 2 * MiB) == 1 | 2 | 4).all()           # the host's copy and one on each GPU
    copies = of(bus.history(), EventKind.HTOD)
    assert copies["bytes"].sum() == 4 * MiB and set(copies["dst"]) == {0, 1}
    b.access(ptr, PAGE_SIZE, GPU1, "write")                             # a write collapses to the writer
    assert b.page_states(ptr, PAGE_SIZE)[0] == 4
    dropped = of(bus.history(), EventKind.INVALIDATE)
    assert set(dropped["src"]) == {-1, 0}


@pytest.mark.parametrize("platform", ["x86-pcie5", "x86-nvlink"])
def test_accessed_by_maps_a_peers_memory_remotely(platform):
    b, bus = backend(platform=platform)
    ptr = b.allocate(2 * MiB, MemoryKind.MANAGED)
    b.access(ptr, 2 * MiB, GPU0, "write")
    b.advise(ptr, 2 * MiB, Advice.SET_ACCESSED_BY, GPU1)
    bus.history()
    r = b.access(ptr, 2 * MiB, GPU1, "read")
    assert (b.page_states(ptr, 2 * MiB) == 2).all()                    # it stays on device 0
    assert r.bytes_remote > 0 and r.faults == 0                         # read through the mapping, no fault
    assert not len(of(bus.history(), EventKind.DTOD))


def test_preferred_location_on_a_peer_maps_the_faulting_gpu_remotely():
    b, bus = backend()
    ptr = b.allocate(2 * MiB, MemoryKind.MANAGED)
    b.advise(ptr, 2 * MiB, Advice.SET_PREFERRED_LOCATION, GPU0)
    b.access(ptr, 2 * MiB, GPU0, "write")
    bus.history()
    b.access(ptr, 2 * MiB, GPU1, "read")                                # R3 (f): it stays where it is preferred
    assert (b.page_states(ptr, 2 * MiB) == 2).all()
    maps = of(bus.history(), EventKind.REMOTE_MAP, RemoteMapCause.POLICY)
    assert maps["bytes"].sum() == 2 * MiB and set(maps["src"]) == {0} and set(maps["dst"]) == {1}


def test_without_peer_access_accessed_by_cannot_map_a_peer_and_the_page_migrates():
    no_peer = PLATFORMS["x86-pcie5"].with_(name="no-peer", peer_access=False)
    b, bus = backend(platform=no_peer)
    ptr = b.allocate(2 * MiB, MemoryKind.MANAGED)
    b.access(ptr, 2 * MiB, GPU0, "write")
    b.advise(ptr, 2 * MiB, Advice.SET_ACCESSED_BY, GPU1)
    bus.history()
    b.access(ptr, 2 * MiB, GPU1, "read")
    assert (b.page_states(ptr, 2 * MiB) == 4).all()
    assert of(bus.history(), EventKind.DTOD)["bytes"].sum() == 2 * MiB


def test_each_gpu_evicts_only_its_own_chunks():
    b, bus = backend(memory="8MiB")
    on0 = b.allocate(8 * MiB, MemoryKind.MANAGED)
    on1 = b.allocate(12 * MiB, MemoryKind.MANAGED)
    b.access(on0, 8 * MiB, GPU0, "write")
    bus.history()
    b.access(on1, 12 * MiB, GPU1, "write")                             # 12 MiB on an 8 MiB device 1
    evicted = of(bus.history(), EventKind.DTOH, MigrationCause.EVICTION)
    assert evicted["bytes"].sum() == 4 * MiB and set(evicted["src"]) == {1}
    assert (b.page_states(on0, 8 * MiB) == 2).all()                    # device 0 untouched
    assert b.mem_info(0)[0] == 0 and b.mem_info(1)[0] == 0


def test_the_host_takes_pages_back_from_the_gpu_that_holds_them():
    b, bus = backend()
    ptr = b.allocate(2 * BLOCK_SIZE, MemoryKind.MANAGED)
    b.access(ptr, BLOCK_SIZE, GPU0, "write")
    b.access(ptr + BLOCK_SIZE, BLOCK_SIZE, GPU1, "write")
    bus.history()
    b.access(ptr, 2 * BLOCK_SIZE, HOST, "read")
    back = of(bus.history(), EventKind.DTOH)
    assert {int(s): int(n) for s, n in zip(*np.unique(back["src"], return_counts=True), strict=True)}.keys() == {0, 1}
    assert back["bytes"].sum() == 2 * BLOCK_SIZE
    assert (b.page_states(ptr, 2 * BLOCK_SIZE) == 1).all()


@pytest.mark.parametrize("devices", [0, 8, 1.5, True, "2"])
def test_devices_is_checked(devices):
    with pytest.raises(InvalidArgumentError, match="devices"):
        SimBackend(devices=devices)
