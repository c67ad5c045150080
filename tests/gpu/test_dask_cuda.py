"""uvm_lab.dask on dask_cuda.LocalCUDACluster: two workers, one GPU each, CuPy arrays through uvm_lab's allocator,
and a prefetch from one GPU to its peer, seen from the client. Needs two GPUs, dask-cuda, and cupti-python for the
driver's migrations."""

from __future__ import annotations

import importlib.util
import time

import pytest

pytestmark = pytest.mark.gpu

dask_cuda = pytest.importorskip("dask_cuda")
distributed = pytest.importorskip("distributed")

from uvm_lab.dask import ClusterMonitor, UvmLab  # noqa: E402

MiB = 2**20
SIZE = 64 * MiB   # far below either card's free memory
CUPTI = importlib.util.find_spec("cupti") is not None


def gpus() -> int:
    from cuda.bindings import runtime

    err, count = runtime.cudaGetDeviceCount()
    return int(count) if int(err) == 0 else 0


def hold_cupy_array() -> dict:
    """A task: a 64 MiB CuPy array, made through the routed allocator and summed on the worker's GPU, kept there."""
    import cupy

    import uvm_lab as ul

    array = cupy.ones(SIZE // 4, dtype=cupy.float32)
    total = float(array.sum())
    distributed.get_worker().__dict__.setdefault("uvm_lab_test_arrays", []).append(array)
    ours = [b for b in ul.live_buffers() if b.ptr <= array.data.ptr < b.ptr + b.size]
    return {"sum": total, "buffer": int(ours[0].id) if ours else None}


def until(condition, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"never saw {what}")
        time.sleep(0.05)
    return value


@pytest.fixture(scope="module")
def cuda_cluster():
    if gpus() < 2:
        pytest.skip("needs two GPUs (the nvidia-h100-x2 or nvidia-h200-x2 machine)")
    with dask_cuda.LocalCUDACluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        monitor = ClusterMonitor(client)
        client.register_plugin(UvmLab(managed_memory=True, cupti=CUPTI, interval=0.05))
        until(lambda: len([w for w in monitor.workers().values() if w.last is not None]) == 2, "both workers report")
        yield client, monitor
        monitor.close()


def test_both_workers_and_both_gpus_show_and_cupy_allocates_through_uvm_lab(cuda_cluster):
    client, monitor = cuda_cluster
    for worker, lanes in monitor.workers().items():
        assert lanes.backend == "cuda" and lanes.gpus == 2, "dask-cuda's workers each see both GPUs, their own first"
        assert lanes.routed["cupy"] == "routed"
        done = client.submit(hold_cupy_array, workers=[worker], pure=False).result()
        assert done["sum"] == SIZE // 4 and done["buffer"] is not None
        rows = until(lambda w=worker: (r := [x for x in monitor.rows() if x["worker"] == w]) and
                     r[0]["allocated"] >= SIZE and r, f"{worker}'s array")
        by_gpu = {row["gpu"]: row for row in rows}
        assert set(by_gpu) == {0, 1}
        assert by_gpu[0]["total"] > SIZE and by_gpu[0]["used"] > 0   # the worker's own GPU, read
        # Its peer: no context there yet, so not read (0 of 0) rather than a context made for the picture.
        assert (by_gpu[1]["used"], by_gpu[1]["total"]) == (0, 0)
    assert len(monitor.rows()) == 4


def test_a_peer_prefetch_routed_to_the_owner_shows_on_the_peer(cuda_cluster):
    _, monitor = cuda_cluster
    worker = sorted(monitor.workers())[0]
    buffers = [b for b in monitor.buffers(worker) if b["size"] >= SIZE]
    assert buffers, "the CuPy array's buffer is listed"
    monitor.prefetch(worker, buffers[0]["id"], "gpu:1")
    after = next(b for b in monitor.buffers(worker) if b["id"] == buffers[0]["id"])
    print("after the peer prefetch:", after)
    assert after["copies"].get("gpu:1", 0) + after["unknown"] == SIZE // 4096
    assert after["copies"].get("gpu:0", 0) == 0
    if CUPTI:   # the driver's own account of the move: a DtoD migration into GPU 1
        rows = until(lambda: (r := {x["gpu"]: x for x in monitor.rows() if x["worker"] == worker}) and
                     r[1]["dtod_bytes"] >= SIZE and r, "the DtoD bytes on gpu:1")
        print("rows:", rows)
        assert rows[1]["total"] > SIZE, "the prefetch made a context on GPU 1: its memory is read from then on"
        columns = monitor.timeline(worker, 0, 2**53 - 1, 1000)[1]
        from uvm_lab.events import EventKind

        peer = columns["kind"] == EventKind.DTOD
        assert peer.any() and set(columns["dst"][peer].tolist()) == {1}
