"""``python -m uvm_lab``: the workbench launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def test_help_and_a_missing_folder():
    out = subprocess.run([sys.executable, "-m", "uvm_lab", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "jupyter lab" in out.stdout
    out = subprocess.run([sys.executable, "-m", "uvm_lab", "no-such-folder"], capture_output=True, text=True)
    assert out.returncode == 2 and "'no-such-folder' is not a folder" in out.stderr


def _children(pid):
    """The processes ``pid`` started (Linux's /proc), or None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return None


def _running(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"   # a zombie has stopped
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds JupyterLab's process through /proc")
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_stops_jupyterlab_and_the_launcher_exits_with_it(tmp_path, stop):
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "uvm_lab", str(tmp_path), "--no-browser", "--ServerApp.port=0",
         "--ServerApp.token=t", "--ServerApp.open_browser=False"],
        stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        for line in launcher.stderr:   # the server says where it listens once it is up
            lines.append(line)
            if "http://127.0.0.1:" in line or "http://localhost:" in line:
                break
        else:
            pytest.fail("JupyterLab never started:\n" + "".join(lines[-20:]))
        lab = _children(launcher.pid)
        assert lab, "the launcher runs JupyterLab as its child"
        launcher.send_signal(stop)
        assert launcher.wait(timeout=60) == 0    # a clean stop, its status passed on
        assert not [pid for pid in lab if _running(pid)]   # and JupyterLab is gone, not left running
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
