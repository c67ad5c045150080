"""Other libraries allocating through uvm_lab's resources, in RMM's layout (``rmm.allocators``).

``uvm_lab.allocators.cupy``: ``cupy.cuda.set_allocator(uvm_lab_cupy_allocator)``.
``uvm_lab.allocators.numba``: ``cuda.set_memory_manager(UvmLabNumbaManager)``, or
``NUMBA_CUDA_MEMORY_MANAGER=uvm_lab.allocators.numba``.

Each module imports its library only when used, so importing it never fails; using it where the library
(or a GPU) is missing raises :class:`~uvm_lab.errors.BackendError`, saying what is missing.
"""
