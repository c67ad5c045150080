"""uvm_lab.torch on a real GPU: RFC-0023's moves keep the storage, and the map follows them."""

from __future__ import annotations

import pytest

import uvm_lab as ul

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
ut = pytest.importorskip("uvm_lab.torch")
MiB = 1 << 20


@pytest.fixture
def cuda_torch(cuda):
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    return cuda


def test_a_managed_tensor_moves_between_the_gpu_and_the_host_in_place(cuda_torch):
    t = ut.manage(torch.arange(MiB, dtype=torch.float32, device="cuda"))
    buf = ut.buffer_of(t)
    assert ut.is_managed(t) and t.device.type == "cuda" and buf.size == 4 * MiB
    assert ul.residency(buf).summary()["gpu"] == 1.0
    c = ut.to(t, "cpu")                                  # synchronizes, then the host reads it where it is
    assert c.device.type == "cpu" and c.data_ptr() == t.data_ptr()
    assert ul.residency(buf).summary()["host"] == 1.0 and float(c[12345]) == 12345.0
    g = ut.to(c, "cuda")
    assert g.device.type == "cuda" and g.data_ptr() == t.data_ptr()
    assert ul.residency(buf).summary()["gpu"] == 1.0
    assert float((g * 2).sum()) == float(MiB * (MiB - 1))
    advice = buf.advice
    assert advice["preferred_location"] == "gpu:0" and not advice["accessed_by"]   # the RFC's advice for a GPU


def test_a_dtype_change_copies_and_unmanage_gives_a_plain_cuda_tensor(cuda_torch):
    t = ut.manage(torch.ones(1024, device="cuda"))
    half = ut.to(t, "cuda", dtype=torch.float16)
    assert half.dtype == torch.float16 and half.data_ptr() != t.data_ptr() and not ut.is_managed(half)
    plain = ut.unmanage(t)
    assert plain.device.type == "cuda" and not ut.is_managed(plain) and float(plain.sum()) == 1024.0
