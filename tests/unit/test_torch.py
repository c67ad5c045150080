"""RFC-0023's unified-memory API (uvm_lab.torch) on the simulator, with CPU-only torch."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

import uvm_lab as ul
import uvm_lab.torch as ut
from uvm_lab import deferred
from uvm_lab.buffer import label_of
from uvm_lab.errors import BackendError, InvalidArgumentError, InvalidLocationError

KiB = 1 << 10


@pytest.fixture
def torch(monkeypatch):
    """torch (skipping without it), with UVM neither set nor in the environment, as a fresh process has it."""
    module = pytest.importorskip("torch")
    monkeypatch.setattr(ut, "_enabled", None)
    monkeypatch.delenv(ut.ENV_VAR, raising=False)
    return module


def advice(t):
    return ut.buffer_of(t).advice


def where(t):
    return ul.residency(ut.buffer_of(t)).summary()


def gone(buffer_id):
    gc.collect()
    deferred.run()
    return buffer_id not in [b.id for b in ul.live_buffers()]


# -- manage, is_managed, unmanage ------------------------------------------------------------------------------
def test_manage_copies_into_managed_memory_with_the_rfcs_cpu_advice(torch):
    x = torch.arange(16 * KiB, dtype=torch.float32)
    m = ut.manage(x, label="x")
    assert ut.is_managed(m) and not ut.is_managed(x)
    assert torch.equal(m, x) and m.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert ut.device_of(m) == "cpu" and m.device.type == "cpu"
    buf = ut.buffer_of(m)
    assert buf.label == "x" and buf.size == x.numel() * 4 and buf.is_managed
    # RFC-0023: CPU allocations prefer the host and are AccessedBy the current GPU.
    assert advice(m) == {"read_mostly": False, "preferred_location": "host", "accessed_by": ("gpu:0",)}
    assert where(m)["host"] == 1.0
    assert ut.manage(m) is m                        # as pin_memory() of a pinned tensor
    # The tensor's bytes are the buffer's: a write through either shows in the other.
    m[3] = 42.0
    assert buf.host_view(dtype="f4")[3] == 42.0


def test_views_of_a_managed_tensor_are_managed_and_share_its_buffer(torch):
    m = ut.manage(torch.zeros(64, 64))
    view = m[8:16, ::2]
    assert ut.is_managed(view) and ut.buffer_of(view) is ut.buffer_of(m)
    assert not ut.is_managed(view + 1)               # an operation's result is torch's memory


def test_unmanage_copies_back_to_torchs_memory(torch):
    m = ut.manage(torch.arange(10.0))
    u = ut.unmanage(m)
    assert not ut.is_managed(u) and torch.equal(u, m)
    plain = torch.ones(3)
    assert ut.unmanage(plain) is plain


def test_a_managed_tensor_keeps_its_buffer_alive_and_frees_it_when_it_dies(torch):
    m = ut.manage(torch.ones(4 * KiB))
    buf_id = ut.buffer_of(m).id
    view = m[10:]
    del m
    assert not gone(buf_id) and view.sum().item() == 4 * KiB - 10   # the view still holds the storage
    del view
    assert gone(buf_id)


def test_zero_element_and_grad_tensors(torch):
    empty = ut.manage(torch.empty(0, 3))
    assert ut.is_managed(empty) and empty.shape == (0, 3)
    w = torch.randn(5, requires_grad=True)
    mw = ut.manage(w)
    assert mw.is_leaf and mw.requires_grad and torch.equal(mw, w)
    ut.manage(torch.arange(4)).sum()                 # integers too


# -- to: a move for a managed tensor, a copy otherwise --------------------------------------------------------
def test_to_cuda_moves_the_pages_and_keeps_the_storage(torch):
    m = ut.manage(torch.arange(32 * KiB, dtype=torch.float32))
    ptr = m.untyped_storage().data_ptr()
    with ul.record() as trace:
        g = ut.to(m, "cuda")
    assert g is m and g.untyped_storage().data_ptr() == ptr          # "return self"
    assert ut.device_of(g) == "cuda:0"
    # RFC-0023: a GPU's tensor prefers that GPU and is AccessedBy nothing.
    assert advice(g) == {"read_mostly": False, "preferred_location": "gpu:0", "accessed_by": ()}
    assert where(g)["gpu"] == 1.0
    totals = trace.summary()
    assert totals["bytes_htod"] == 128 * KiB and totals["counts"].get("htod", 0) > 0
    assert totals["gpu_faults"] == totals["cpu_faults"] == 0          # prefetched, not faulted
    back = ut.to(g, "cpu")
    assert back is m and ut.device_of(m) == "cpu" and where(m)["host"] == 1.0
    assert advice(m)["preferred_location"] == "host" and advice(m)["accessed_by"] == ("gpu:0",)
    assert torch.equal(m, torch.arange(32 * KiB, dtype=torch.float32))


def test_to_the_same_place_returns_the_tensor_and_moves_nothing(torch):
    m = ut.manage(torch.ones(1024))
    with ul.record() as trace:
        assert ut.to(m, "cpu") is m and ut.to(m) is m and ut.to(m, dtype=torch.float32) is m
    assert trace.summary()["bytes_htod"] == trace.summary()["bytes_dtoh"] == 0
    plain = torch.ones(3)
    assert ut.to(plain, "cpu") is plain


def test_to_cuda_of_a_view_moves_its_whole_storage(torch):
    m = ut.manage(torch.zeros(8 * KiB))
    ut.to(m[:10], 0)
    assert ut.device_of(m) == "cuda:0" and where(m)["gpu"] == 1.0


def test_gpu_to_cpu_synchronizes_unless_non_blocking(torch, monkeypatch):
    m = ut.manage(torch.ones(1024))
    ut.to(m, "cuda")
    syncs = []
    backend = ut.buffer_of(m).mr.backend
    monkeypatch.setattr(backend, "synchronize", lambda: syncs.append(1))
    ut.to(m, "cpu", non_blocking=True)
    assert syncs == []
    ut.to(m, "cuda")
    ut.to(m, "cpu")
    assert syncs == [1]
    ut.to(m, "cuda")                                 # host to device: no synchronize
    assert syncs == [1]


def test_a_dtype_change_or_copy_copies_and_leaves_the_source_where_it_was(torch):
    x = torch.arange(4 * KiB, dtype=torch.float32)
    m = ut.manage(x)
    d = ut.to(m, "cuda", dtype=torch.float64)
    assert d is not m and d.dtype == torch.float64 and torch.equal(d, x.double())
    assert ut.is_managed(d) and ut.device_of(d) == "cuda:0" and where(d)["gpu"] == 1.0
    assert ut.buffer_of(d) is not ut.buffer_of(m)
    assert ut.device_of(m) == "cpu" and where(m)["host"] == 1.0      # the source stays
    c = ut.to(m, "cpu", copy=True)
    assert c is not m and not ut.is_managed(c) and torch.equal(c, x)  # UVM off: torch's own copy on the CPU
    c[0] = -1
    assert m[0] == 0


def test_on_the_simulator_a_copy_to_cuda_is_managed(torch):
    x = torch.ones(2048)
    g = ut.to(x, "cuda")
    assert ut.is_managed(g) and ut.device_of(g) == "cuda:0" and where(g)["gpu"] == 1.0
    assert advice(g)["preferred_location"] == "gpu:0"


def test_while_enabled_cpu_copies_are_managed_too(torch):
    assert ut.get_enabled_uvm() is False
    ut.set_enabled_uvm(True)
    assert ut.get_enabled_uvm() is True
    c = ut.to(torch.arange(100), "cpu", dtype=torch.float32)
    assert ut.is_managed(c) and advice(c)["preferred_location"] == "host" and advice(c)["accessed_by"] == ("gpu:0",)
    ut.set_enabled_uvm(False)
    assert not ut.is_managed(ut.to(torch.arange(100), "cpu", dtype=torch.float32))


@pytest.mark.parametrize(("value", "enabled"), [("1", True), ("true", True), ("ON", True), ("0", False),
                                                ("", False), ("no", False)])
def test_the_environment_variable_enables_uvm(torch, monkeypatch, value, enabled):
    monkeypatch.setenv(ut.ENV_VAR, value)
    assert ut.get_enabled_uvm() is enabled
    ut.set_enabled_uvm(not enabled)                  # the call wins over the environment
    assert ut.get_enabled_uvm() is (not enabled)


def test_a_bad_environment_value_names_itself(torch, monkeypatch):
    monkeypatch.setenv(ut.ENV_VAR, "maybe")
    with pytest.raises(InvalidArgumentError, match="maybe") as err:
        ut.get_enabled_uvm()
    assert err.value.value == "maybe" and "1, true" in err.value.expected


# -- label -----------------------------------------------------------------------------------------------------
def test_label_names_a_models_managed_parameters_and_buffers(torch):
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    for p in net.parameters():
        p.data = ut.manage(p.data)
    net[1].running_mean = ut.manage(net[1].running_mean)
    names = ut.label(net, prefix="net.")
    assert names == {n: n for n in ("net.0.weight", "net.0.bias", "net.1.weight", "net.1.bias",
                                    "net.1.running_mean")}
    assert ut.buffer_of(net[0].weight).label == "net.0.weight"
    mean_id = ut.buffer_of(net[1].running_mean).id
    assert label_of(mean_id) == "net.1.running_mean"
    assert net(torch.randn(2, 8)).shape == (2, 4)    # the model still runs over managed memory
    net[1].running_mean = None
    assert gone(mean_id) and label_of(mean_id) == "net.1.running_mean"   # traces name it so after it is freed


def test_a_renamed_buffer_is_described_again_by_live_views(torch):
    collect = pytest.importorskip("uvm_lab.jupyter.dashboard.collect")
    live = collect.LiveAllocations()
    m = ut.manage(torch.ones(100))
    before = dict(live.refresh())
    net = torch.nn.Linear(1, 1)
    net.weight.data = m.view(100, 1)[:1]
    ut.label(net)
    after = dict(live.refresh())
    assert after[ut.buffer_of(m).id]["label"] == "weight" != before[ut.buffer_of(m).id]["label"]


def test_label_rejects_what_is_not_a_module(torch):
    with pytest.raises(InvalidArgumentError, match=r"torch\.nn\.Module") as err:
        ut.label([1, 2])
    assert err.value.value == [1, 2]


# -- bad input: typed errors that name the value, and nothing changed ----------------------------------------
def _state(t=None):
    buffers = [(b.id, b.label) for b in ul.live_buffers()]
    placed = (ut.device_of(t), advice(t), where(t)) if t is not None else None
    return buffers, placed, ut.get_enabled_uvm()


@pytest.mark.parametrize("value", [[1.0, 2.0], 3, None, "tensor"])
def test_non_tensors_are_refused(torch, value):
    before = _state()
    for fn in (ut.manage, ut.unmanage, ut.is_managed, ut.to, ut.device_of, ut.buffer_of):
        with pytest.raises(InvalidArgumentError, match=r"torch\.Tensor") as err:
            fn(value)
        assert err.value.value is value and err.value.expected == "a torch.Tensor"
    assert _state() == before


def test_tensors_on_other_devices_and_layouts_are_refused(torch):
    before = _state()
    meta = torch.empty(4, device="meta")
    with pytest.raises(InvalidArgumentError, match="'meta'") as err:
        ut.manage(meta)
    assert err.value.value is meta and "'cpu' or 'cuda'" in err.value.expected
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(InvalidArgumentError, match="strided"):
        ut.manage(sparse)
    assert _state() == before


@pytest.mark.parametrize(("device", "error"), [("mps", InvalidLocationError), ("cuda:3", InvalidLocationError),
                                               ("tpu", InvalidLocationError), (1.5, InvalidLocationError),
                                               (True, InvalidLocationError), (-1, InvalidLocationError)])
def test_bad_devices_are_refused_before_anything_moves(torch, device, error):
    m = ut.manage(torch.ones(2048))
    before = _state(m)
    with pytest.raises(error) as err:
        ut.to(m, device)
    assert err.value.value is device and "'cuda:N'" in err.value.expected
    assert _state(m) == before


@pytest.mark.parametrize("dtype", ["float32", float, 4])
def test_a_dtype_that_is_not_a_torch_dtype_is_refused(torch, dtype):
    m = ut.manage(torch.ones(2048))
    before = _state(m)
    with pytest.raises(InvalidArgumentError, match=r"torch\.dtype") as err:
        ut.to(m, "cuda", dtype=dtype)
    assert err.value.value is dtype
    assert _state(m) == before


@pytest.mark.parametrize(("name", "value"), [("non_blocking", 1), ("copy", "yes")])
def test_flags_must_be_bools(torch, name, value):
    m = ut.manage(torch.ones(8))
    before = _state(m)
    with pytest.raises(InvalidArgumentError, match=name):
        ut.to(m, "cuda", **{name: value})
    assert _state(m) == before
    with pytest.raises(InvalidArgumentError, match="True or False"):
        ut.set_enabled_uvm(1)
    assert _state(m) == before


def test_a_cuda_tensor_cannot_be_unmanaged_on_the_simulator(torch):
    m = ut.manage(torch.ones(8))
    ut.to(m, "cuda")
    before = _state(m)
    with pytest.raises(BackendError, match="to\\(t, 'cpu'\\)"):
        ut.unmanage(m)
    assert _state(m) == before


def test_a_resource_that_gives_no_managed_memory_is_refused(torch):
    ul.mr.set_current_device_resource(ul.mr.CudaMemoryResource())
    before = _state()
    with pytest.raises(BackendError, match="managed"):
        ut.manage(torch.ones(8))
    with pytest.raises(BackendError, match="managed"):
        ut.set_enabled_uvm(True)
    assert _state() == before


def test_without_torch_the_module_imports_and_each_call_says_how_to_install_it():
    code = """
import sys
sys.modules["torch"] = None          # import torch now fails, as where it is not installed
import uvm_lab.torch as ut
from uvm_lab.errors import BackendError
assert ut.get_enabled_uvm() in (True, False)
for call in (lambda: ut.manage([1]), lambda: ut.to(1, "cuda"), lambda: ut.is_managed(1),
             lambda: ut.set_enabled_uvm(True), lambda: ut.label(None)):
    try:
        call()
    except BackendError as err:
        assert "PyTorch is not installed" in str(err) and "pip install torch" in str(err), err
    else:
        raise AssertionError("no error")
print("ok")
"""
    env = {"PYTHONPATH": str(__import__("pathlib").Path(ul.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
