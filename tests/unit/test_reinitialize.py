"""reinitialize: RMM's per-device chain (Managed or Cuda -> Pool -> Logging), all or nothing."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError, InvalidSizeError, OutOfMemoryError
from uvm_lab.mr.device import CudaMemoryResource
from uvm_lab.mr.logging import HEADER, LoggingResourceAdaptor
from uvm_lab.mr.managed import ManagedMemoryResource
from uvm_lab.mr.pool import PoolMemoryResource
from uvm_lab.mr.reinitialize import register_reinitialize_hook, reinitialize, unregister_reinitialize_hook

MiB = 1 << 20


def chain_types(device: int = 0) -> list[type]:
    return [type(mr) for mr in ul.mr.resource_chain(ul.mr.get_per_device_resource(device))]


def test_defaults_make_a_cuda_memory_resource():
    reinitialize()
    assert chain_types() == [CudaMemoryResource]


def test_managed_pool_and_logging(tmp_path):
    reinitialize(pool_allocator=True, managed_memory=True, initial_pool_size="64MiB", maximum_pool_size="1GiB",
                 logging=True, log_file_name=str(tmp_path / "rmm_log.csv"))
    mr = ul.mr.get_current_device_resource()
    assert chain_types() == [LoggingResourceAdaptor, PoolMemoryResource, ManagedMemoryResource]
    assert mr.get_file_name() == str(tmp_path / "rmm_log.dev0.csv")
    pool = mr.upstream_mr
    assert pool.pool_size() == 64 * MiB and pool.maximum_pool_size == 1 << 30
    with ul.DeviceBuffer(size="1MiB"):
        pass
    mr.flush()
    lines = (tmp_path / "rmm_log.dev0.csv").read_text().splitlines()
    assert lines[0] == HEADER and [line.split(",")[2] for line in lines[1:]] == ["allocate", "free"]


def test_the_log_name_falls_back_to_rmm_log_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RMM_LOG_FILE", str(tmp_path / "env.log"))
    reinitialize(logging=True)
    assert ul.mr.get_current_device_resource().get_file_name() == str(tmp_path / "env.dev0.log")


def test_devices_as_a_list_builds_one_chain_each(sim_backend, monkeypatch, tmp_path):
    monkeypatch.setattr(sim_backend, "_devices", 2)       # the simulator has one GPU; pretend two for the routing
    reinitialize(managed_memory=True, devices=[1, 0], logging=True, log_file_name=str(tmp_path / "log"))
    first, second = ul.mr.get_per_device_resource(0), ul.mr.get_per_device_resource(1)
    assert first is not second
    assert (first.get_file_name(), second.get_file_name()) == (str(tmp_path / "log.dev0"), str(tmp_path / "log.dev1"))
    with pytest.raises(InvalidArgumentError, match="devices"):
        reinitialize(devices=[0, 2])


def test_hooks_run_first_last_registered_first():
    calls: list[str] = []
    register_reinitialize_hook(calls.append, "first")
    register_reinitialize_hook(calls.append, "second")
    try:
        reinitialize()
        assert calls == ["second", "first"]
    finally:
        unregister_reinitialize_hook(calls.append)
    reinitialize()
    assert calls == ["second", "first"]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"pool_allocator": 1}, "pool_allocator"),
    ({"managed_memory": "yes"}, "managed_memory"),
    ({"logging": None}, "logging"),
    ({"devices": 1}, "devices"),
    ({"devices": -1}, "devices"),
    ({"devices": [0, 0]}, "twice"),
    ({"devices": []}, "devices"),
    ({"devices": "0"}, "devices"),
    ({"devices": [0.0]}, "devices"),
    ({"devices": True}, "devices"),
    ({"initial_pool_size": "1GiB"}, "pool_allocator=True"),
    ({"maximum_pool_size": "1GiB"}, "pool_allocator=True"),
    ({"log_file_name": "x.csv"}, "logging=True"),
    ({"logging": True, "log_file_name": 5}, "log_file_name"),
])
def test_bad_arguments_change_nothing(kwargs, match):
    before = ul.mr.get_current_device_resource()
    with pytest.raises(InvalidArgumentError, match=match):
        reinitialize(**kwargs)
    assert ul.mr.get_current_device_resource() is before


def test_logging_without_a_name_anywhere(monkeypatch):
    monkeypatch.delenv("RMM_LOG_FILE", raising=False)
    with pytest.raises(InvalidArgumentError, match="RMM_LOG_FILE"):
        reinitialize(logging=True)


def test_a_pool_that_cannot_be_built_changes_nothing():
    before = ul.mr.get_current_device_resource()
    with pytest.raises(InvalidSizeError):
        reinitialize(pool_allocator=True, initial_pool_size=1000)          # not a multiple of 256
    with pytest.raises(OutOfMemoryError):
        reinitialize(pool_allocator=True, initial_pool_size="8GiB")        # more than the device
    assert ul.mr.get_current_device_resource() is before


def test_hook_must_be_callable():
    with pytest.raises(InvalidArgumentError, match="callable"):
        register_reinitialize_hook("not a function")  # type: ignore[arg-type]
