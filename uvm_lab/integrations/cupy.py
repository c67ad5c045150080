"""Moved to :mod:`uvm_lab.allocators.cupy`, RMM's place for it; these names stay importable from here."""

from ..allocators.cupy import cupy_allocator, make_cupy_allocator, uvm_lab_cupy_allocator

__all__ = ["cupy_allocator", "make_cupy_allocator", "uvm_lab_cupy_allocator"]
