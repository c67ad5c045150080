"""One JupyterLab server for every browser test, under a base URL, and one Chromium.

The server starts on a free localhost port with a token and ``--ServerApp.base_url=/uvm-lab-prefix/`` (so
every test also checks that the extension finds its kernel under a prefix), in a temporary root where each
test writes its notebooks; it loads this checkout's built extension. Debian's Chromium (never a downloaded
one) is driven by Playwright.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .lab import REPO

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LABEXTENSION = REPO / "uvm_lab" / "labextension"
BASE_URL = "/uvm-lab-prefix/"


def pytest_collection_modifyitems(items):
    if not CHROMIUM.exists():
        skip = pytest.mark.skip(reason=f"Debian's Chromium is not at {CHROMIUM} (apt-get install chromium); "
                                "the tests never download a browser")
        for item in items:
            if "browser" in item.keywords:
                item.add_marker(skip)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """A JupyterLab server that loads this checkout's built extension; yields (url, token, root), the url
    with the base URL."""
    if not (LABEXTENSION / "package.json").exists():
        pytest.fail(f"the lab extension is not built at {LABEXTENSION.relative_to(REPO)}: run "
                    "`cd extension && jlpm install && jlpm build` first")
    base = tmp_path_factory.mktemp("lab")
    root, data = base / "root", base / "data"
    root.mkdir()
    (data / "labextensions").mkdir(parents=True)
    # This checkout's build, found first on JUPYTER_PATH, whatever else is installed.
    (data / "labextensions" / "uvm-lab").symlink_to(LABEXTENSION, target_is_directory=True)
    # No news or update questions over the page: this machine has no internet, and they cover the panel.
    settings = base / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port, token = _free_port(), "uvm-lab-browser-test"
    env = {
        **os.environ,
        "JUPYTER_PATH": str(data),
        "JUPYTER_CONFIG_DIR": str(base / "config"),
        "JUPYTER_DATA_DIR": str(base / "userdata"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "IPYTHONDIR": str(base / "ipython"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           f"--ServerApp.base_url={BASE_URL}",
           f"--LabApp.user_settings_dir={base / 'settings'}", f"--LabApp.workspaces_dir={base / 'workspaces'}",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly", "--ServerApp.allow_root=True",
           # window.jupyterapp: the tests wait on the kernel connection itself, not on a picture of it.
           "--LabApp.expose_app_in_browser=True"]
    log = (base / "server.log").open("w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}{BASE_URL.rstrip('/')}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if server.poll() is not None:
                pytest.fail(f"jupyter lab exited with {server.returncode}:\n{(base / 'server.log').read_text()}")
            if _answers(f"{url}/api/status?token={token}"):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"jupyter lab did not answer in 90 s:\n{(base / 'server.log').read_text()}")
            time.sleep(0.25)
        yield url, token, root
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)
        log.close()


@pytest.fixture(scope="session")
def browser():
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        pytest.fail(f"the browser tests need Playwright for Python (pip install 'uvm_lab[test]'): {err}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=60_000)
        yield browser
        browser.close()
