"""The architecture, enforced: the core stays free of front-end libraries, and only the CUDA backend
touches ``cuda.*``."""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import uvm_lab

PACKAGE = Path(uvm_lab.__file__).parent
FRONT_END = ("IPython", "ipywidgets", "bokeh", "jupyter_bokeh", "ipykernel", "comm", "traitlets")


def core_modules() -> list[str]:
    """Every module of uvm_lab except the Jupyter front ends and the CUDA backend; and the Dask integration where its
    extra (``uvm_lab[dask]``) is not installed, as on a GPU machine that runs tests/gpu/run.sh."""
    names = [m.name for m in pkgutil.walk_packages([str(PACKAGE)], prefix="uvm_lab.")]
    skip = ("uvm_lab.jupyter", "uvm_lab.backends.cuda", "uvm_lab.__main__")   # __main__ launches JupyterLab
    if importlib.util.find_spec("distributed") is None:
        skip += ("uvm_lab.dask",)
    return ["uvm_lab", *sorted(n for n in names if not n.startswith(skip))]


def test_core_imports_no_front_end_library():
    modules = core_modules()
    assert "uvm_lab.backends.sim.backend" in modules and "uvm_lab.residency_map" in modules
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({FRONT_END!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"the core imported {out.stdout.strip()}"


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_only_the_cuda_backend_imports_cuda():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        cuda = {m for m in imports_of(path) if m == "cuda" or m.startswith("cuda.")}
        if cuda and rel != "backends/cuda.py":
            offenders[rel] = sorted(cuda)
    assert offenders == {}
