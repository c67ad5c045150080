"""Jupyter front ends: the ``%uvm`` magics, the widget dashboard and the lab panel's comm target.

``%load_ext uvm_lab`` (forwarded here by ``uvm_lab.load_ipython_extension``) registers the magics
and, inside a kernel, the ``uvm_lab`` comm target the JupyterLab panel talks to. Nothing is
imported until then: the core never depends on IPython, ipywidgets or bokeh.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%uvm`` and ``%%uvm_trace`` (once), follow cells as event sources, and register the comm
    target (when in a kernel)."""
    from .cells import follow_cells
    from .magics import UvmMagics

    follow_cells(ipython)

    if not isinstance(ipython.magics_manager.registry.get(UvmMagics.__name__), UvmMagics):
        ipython.register_magics(UvmMagics)
    try:
        comm = importlib.import_module(f"{__name__}.comm")
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.comm":
            raise
        return
    try:
        comm.register_comm_target()
    except Exception as err:  # the magics still work without the lab panel
        warnings.warn(f"uvm_lab: the lab panel's comm target could not be registered: {err!r}",
                      RuntimeWarning, stacklevel=2)


def unload_ipython_extension(ipython: Any) -> None:
    """Close the magics' dashboard, stop their CUPTI tracing, stop following cells, and remove ``%uvm`` and
    ``%%uvm_trace``."""
    from .cells import stop_following_cells
    from .magics import UvmMagics

    stop_following_cells(ipython)

    magics = ipython.magics_manager.registry.pop(UvmMagics.__name__, None)
    if isinstance(magics, UvmMagics):
        magics.close_dashboard()
        magics.stop_tracing()
    ipython.magics_manager.magics["line"].pop("uvm", None)
    ipython.magics_manager.magics["cell"].pop("uvm_trace", None)
