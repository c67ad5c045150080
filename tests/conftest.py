"""Every test starts on a fresh simulated device, so no test sees another's memory."""

from __future__ import annotations

import pytest
from hypothesis import settings

import uvm_lab as ul

# No deadline: tests assert results, not times (and a compiled path's first call compiles it, which may take
# seconds on a fresh clone).
settings.register_profile("uvm_lab", deadline=None)
settings.load_profile("uvm_lab")


@pytest.fixture(autouse=True)
def sim_backend():
    """A fresh 4 GiB simulated GPU (on the x86-pcie5 profile), made current for the test."""
    backend = ul.use_backend("sim", device_memory="4GiB")
    yield backend
    for buf in ul.live_buffers():
        if buf.mr.backend is backend:
            buf.close()
