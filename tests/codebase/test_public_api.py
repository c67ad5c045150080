"""The public surface is what ``__all__`` says, and every error is part of one tree."""

from __future__ import annotations

import inspect

import pytest

import uvm_lab
import uvm_lab.allocators.cupy
import uvm_lab.allocators.numba
import uvm_lab.errors
import uvm_lab.events
import uvm_lab.mr
import uvm_lab.statistics
import uvm_lab.torch


@pytest.mark.parametrize("module", [uvm_lab, uvm_lab.mr, uvm_lab.events, uvm_lab.errors, uvm_lab.statistics,
                                    uvm_lab.allocators.cupy, uvm_lab.allocators.numba, uvm_lab.torch])
def test_all_names_exist(module):
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


def test_the_issue_api_is_public():
    for name in ("use_backend", "get_backend", "DeviceBuffer", "touch", "record", "residency", "live_buffers"):
        assert name in uvm_lab.__all__
    for name in ("ManagedMemoryResource", "PoolMemoryResource", "PrefetchResourceAdaptor",
                 "StatisticsResourceAdaptor", "set_current_device_resource", "get_current_device_resource"):
        assert name in uvm_lab.mr.__all__


def test_rmms_names_are_public_where_rmm_has_them():
    for name in ("reinitialize", "register_reinitialize_hook", "unregister_reinitialize_hook", "is_initialized",
                 "available_device_memory", "statistics"):
        assert name in uvm_lab.__all__
    for name in ("CallbackMemoryResource", "SystemMemoryResource", "SamHeadroomMemoryResource",
                 "available_device_memory", "is_initialized"):
        assert name in uvm_lab.mr.__all__
    for name in ("Statistics", "enable_statistics", "get_statistics", "push_statistics", "pop_statistics",
                 "statistics", "profiler", "ProfilerRecords", "default_profiler_records"):
        assert name in uvm_lab.statistics.__all__
    assert "uvm_lab_cupy_allocator" in uvm_lab.allocators.cupy.__all__
    assert "UvmLabNumbaManager" in uvm_lab.allocators.numba.__all__


def test_rfc_0023s_names_are_public():
    for name in ("set_enabled_uvm", "get_enabled_uvm", "is_managed", "manage", "unmanage", "to", "label"):
        assert name in uvm_lab.torch.__all__


def test_every_error_derives_from_the_root_and_a_builtin():
    errors = [obj for _, obj in inspect.getmembers(uvm_lab.errors, inspect.isclass)
              if issubclass(obj, Exception) and obj.__module__ == "uvm_lab.errors"]
    assert len(errors) >= 10
    for err in errors:
        assert issubclass(err, uvm_lab.errors.UvmLabError)
        if err is not uvm_lab.errors.UvmLabError:
            assert any(issubclass(err, b) for b in (ValueError, RuntimeError, MemoryError)), err
