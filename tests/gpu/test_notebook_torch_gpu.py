"""The PyTorch notebook, unchanged, on a real GPU: its code cells in order, in a process of their own (enabling
UVM makes uvm_lab's allocator torch's, for the process). Only its IPython magic (``%load_ext uvm_lab``) is left
out, as the GPU machine runs no Jupyter kernel; CI runs the whole notebook in one on the simulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
allocator = pytest.importorskip("uvm_lab.allocators.torch")
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "03-pytorch-unified-memory.ipynb"


def test_the_pytorch_notebook_runs_unchanged_on_a_gpu(cuda):
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    if not allocator.SHIM.is_file():
        pytest.skip(f"{allocator.SHIM.name} was not built here (it needs a C++ compiler)")
    cells = [cell for cell in json.loads(NOTEBOOK.read_text())["cells"] if cell["cell_type"] == "code"]
    code = "\n".join("".join(line for line in "".join(cell["source"]).splitlines(keepends=True)
                             if not line.startswith("%")) + "\n" for cell in cells)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "backend cuda | UVM enabled: True" in out
    assert "managed: True | x managed: False | equal: True" in out and "same storage: True" in out
    assert "f64: a new tensor: True | managed: True | on cuda:0 | equal: True" in out
    assert "m's buffer still live: False" in out and "parameters on ['cuda:0']" in out
    assert "moved host -> device: 32.0 MiB" in out and "(64, 1024) ['cpu']" in out
    seeds = [line for line in out.splitlines() if line.startswith("prefetch")]
    assert len(seeds) == 2 and all("result (4096, 4096)" in line for line in seeds), out[-2000:]
