"""CUPTI's buffer callbacks in C (``uvm_lab/tracing/_buffers.c``), called the way CUPTI calls them.

CUPTI calls bufferRequested and bufferCompleted from its own threads, through C function pointers. These
tests call the same pointers through ctypes, from several threads at once (ctypes releases the GIL
around a foreign call, as CUPTI's threads never hold it), and check that every byte a "CUPTI" writes
comes out of ``take()`` once, in order per thread, and that a full queue refuses buffers.
"""

from __future__ import annotations

import ctypes
import threading

import pytest

from uvm_lab.tracing import cupti as collector_module

native = collector_module._native
pytestmark = pytest.mark.skipif(native is None, reason="uvm_lab.tracing._buffers was not compiled (no C compiler)")

REQUESTED = collector_module._BUFFER_REQUESTED
COMPLETED = collector_module._BUFFER_COMPLETED
SIZE = 64 << 10


@pytest.fixture
def callbacks():
    native.configure(SIZE, 4)
    native.take()
    requested_at, completed_at = native.addresses()
    yield REQUESTED(requested_at), COMPLETED(completed_at)
    native.take()
    native.configure(8 << 20, collector_module._MAX_QUEUED_BUFFERS)


def request(requested):
    buffer, size, records = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t(99)
    requested(ctypes.byref(buffer), ctypes.byref(size), ctypes.byref(records))
    return buffer.value, size.value, records.value


def test_a_buffer_is_aligned_sized_and_its_valid_bytes_come_back(callbacks):
    requested, completed = callbacks
    address, size, max_records = request(requested)
    assert address and address % 8 == 0 and size == SIZE and max_records == 0
    ctypes.memmove(address, b"records!" * 3, 24)
    completed(None, 0, address, size, 24)
    assert native.take() == [b"records!" * 3]
    assert native.take() == []


def test_an_empty_buffer_is_reused_not_queued(callbacks):
    requested, completed = callbacks
    address, size, _ = request(requested)
    completed(None, 0, address, size, 0)
    assert native.take() == [] and native.stats()["spare"] >= 1
    assert request(requested)[0] == address


def test_a_full_queue_refuses_buffers_until_taken(callbacks):
    requested, completed = callbacks
    before = native.stats()["declined"]
    for i in range(4):
        address, size, _ = request(requested)
        ctypes.memmove(address, bytes([i]) * 8, 8)
        completed(None, 0, address, size, 8)
    assert request(requested) == (None, 0, 0)          # CUPTI then drops, and counts the drop
    assert native.stats()["declined"] == before + 1
    assert native.take() == [bytes([i]) * 8 for i in range(4)]
    assert request(requested)[1] == SIZE


def test_threads_calling_at_once_lose_and_duplicate_nothing(callbacks):
    requested, completed = callbacks
    native.configure(SIZE, 1 << 20)
    threads, rounds = 8, 400
    taken: list[bytes] = []
    done = threading.Event()

    def cupti_thread(t: int) -> None:
        for r in range(rounds):
            address, size, _ = request(requested)
            payload = t.to_bytes(4, "little") + r.to_bytes(4, "little")
            ctypes.memmove(address, payload * 2, 16)
            completed(None, 0, address, size, 16)

    def drain() -> None:
        while not done.is_set():
            taken.extend(native.take())
        taken.extend(native.take())

    drainer = threading.Thread(target=drain)
    drainer.start()
    workers = [threading.Thread(target=cupti_thread, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    done.set()
    drainer.join()
    assert len(taken) == threads * rounds
    assert all(b[:8] == b[8:] for b in taken)           # no buffer written by two threads at once
    seen = [(int.from_bytes(b[:4], "little"), int.from_bytes(b[4:8], "little")) for b in taken]
    assert sorted(seen) == [(t, r) for t in range(threads) for r in range(rounds)]
    for t in range(threads):                              # each thread's buffers come out in its order
        rounds_of_t = [r for tt, r in seen if tt == t]
        assert rounds_of_t == sorted(rounds_of_t)


def test_configure_refuses_sizes_cupti_cannot_use():
    with pytest.raises(ValueError, match="size must be a multiple of 8"):
        native.configure(1000, 4)
    with pytest.raises(ValueError, match="queued >= 1"):
        native.configure(SIZE, 0)
