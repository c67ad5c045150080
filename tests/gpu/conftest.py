"""GPU tests run on a real CUDA device, and skip with the reason where there is none."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab.backends import _cuda_backend_class


def _why_no_gpu() -> str | None:
    try:
        import cuda.bindings  # noqa: F401
    except ImportError:
        return "cuda-python is not installed (pip install 'uvm_lab[cuda]')"
    if _cuda_backend_class() is None:
        return "no CUDA GPU answers on this machine"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _why_no_gpu()
    if reason:
        for item in items:
            if item.get_closest_marker("gpu") is not None:   # the marker, not the folder named gpu
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def cuda(sim_backend):
    """The real GPU as the current backend (after the conftest's simulated one), with no host watcher
    publishing on its own thread: tests that want it start it, or run its rounds themselves."""
    backend = ul.use_backend("cuda", watch=False)
    yield backend
    for buf in ul.live_buffers():
        if buf.mr.backend is backend:
            buf.close()
    backend.synchronize()


@pytest.fixture
def cupy(cuda):
    """CuPy, on the real GPU; its own memory pool is its allocator again afterwards."""
    cp = pytest.importorskip("cupy")
    yield cp
    cp.cuda.set_allocator(cp.get_default_memory_pool().malloc)
