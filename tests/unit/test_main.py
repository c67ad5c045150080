"""``python -m uvm_lab``: the workbench launcher."""

from __future__ import annotations

import subprocess
import sys


def test_help_and_a_missing_folder():
    out = subprocess.run([sys.executable, "-m", "uvm_lab", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "jupyter lab" in out.stdout
    out = subprocess.run([sys.executable, "-m", "uvm_lab", "no-such-folder"], capture_output=True, text=True)
    assert out.returncode == 2 and "'no-such-folder' is not a folder" in out.stderr
