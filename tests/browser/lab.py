"""What drives a real JupyterLab in a real Chromium, for the browser tests (``conftest.py``), the scale
benchmark and the README's screenshots: a lab server, notebooks, running a cell, paths."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Screenshots go here, never over a tracked file (the folder is ignored by git).
ARTIFACTS = REPO / "test-artifacts"
WAIT_MS = 30_000  # any one thing the page must do

#: Debian's Chromium: never a downloaded browser.
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


class LabError(RuntimeError):
    """The lab server could not be started."""


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


@contextlib.contextmanager
def jupyter_lab(base: Path, base_url: str = BASE_URL) -> Iterator[tuple[str, str, Path]]:
    """A JupyterLab server on a free localhost port, with a token, under ``base_url`` (so a test also checks
    that the extension finds its kernel under a prefix), all its state in ``base``, loading this checkout's
    built extension; yields ``(url, token, root)``, the url with the base URL, notebooks going in ``root``."""
    if not (LABEXTENSION / "package.json").exists():
        raise LabError(f"the lab extension is not built at {LABEXTENSION.relative_to(REPO)}: run "
                       "`cd extension && jlpm install && jlpm build` first")
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
           f"--ServerApp.base_url={base_url}",
           f"--LabApp.user_settings_dir={base / 'settings'}", f"--LabApp.workspaces_dir={base / 'workspaces'}",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly", "--ServerApp.allow_root=True",
           # window.jupyterapp: the tests wait on the kernel connection itself, not on a picture of it.
           "--LabApp.expose_app_in_browser=True"]
    log = (base / "server.log").open("w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}{base_url.rstrip('/')}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if server.poll() is not None:
                raise LabError(f"jupyter lab exited with {server.returncode}:\n{(base / 'server.log').read_text()}")
            if _answers(f"{url}/api/status?token={token}"):
                break
            if time.monotonic() > deadline:
                raise LabError(f"jupyter lab did not answer in 90 s:\n{(base / 'server.log').read_text()}")
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


def write_notebook(path: Path, cells: list[str]) -> None:
    path.write_text(json.dumps({
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
        "cells": [{"cell_type": "code", "id": f"cell{i}", "metadata": {}, "execution_count": None, "outputs": [],
                   "source": source} for i, source in enumerate(cells)],
    }))


def new_page(browser, width: int, height: int) -> tuple:
    """A context and a page of ``width`` x ``height``, and the list the page's console errors about uvm_lab go to
    (each test asserts it empty)."""
    context = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=1)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "uvm" in m.text.lower() else None)
    return context, page, errors


def open_notebook(page, url: str, token: str, name: str) -> None:
    """Open ``name`` in JupyterLab and wait for its kernel to be idle."""
    # reset: a fresh workspace, not the layout an earlier test left on the server.
    page.goto(f"{url}/lab/tree/{name}?token={token}&reset", timeout=60_000)
    page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=60_000)
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=60_000)
    page.locator('.jp-SideBar .lm-TabBar-tab[data-id="uvm-lab"]').wait_for(timeout=60_000)
    wait_for_kernel(page, name)


def wait_for_kernel(page, path: str) -> None:
    """Wait until notebook ``path``'s kernel is connected and has answered an execute request: a cell run
    before that can be lost."""
    page.wait_for_function("""async (path) => {
        const panel = [...window.jupyterapp.shell.widgets('main')]
            .find(w => w.node.classList.contains('jp-NotebookPanel') && w.context.path === path);
        const kernel = panel?.sessionContext?.session?.kernel;
        if (!kernel || kernel.connectionStatus !== 'connected' || kernel.status !== 'idle') return false;
        await kernel.info;
        // A silent round trip: the kernel takes execute requests on this connection now.
        await kernel.requestExecute({code: '', silent: true, store_history: false}).done;
        return panel.sessionContext.session?.kernel === kernel;
    }""", arg=path, timeout=60_000, polling=250)


def run_cell(page, path: str, index: int, expect: str) -> str:
    """Run cell ``index`` of the open notebook ``path`` from the UI; return its output once this run has printed
    ``expect``."""
    panel = page.evaluate("""(path) => [...window.jupyterapp.shell.widgets('main')]
        .find(w => w.node.classList.contains('jp-NotebookPanel') && w.context.path === path)?.id""", path)
    assert panel, f"{path} is not open"
    scope = page.locator(f'[id="{panel}"]')
    cell = scope.locator(".jp-Notebook .jp-CodeCell").nth(index)
    prompt = cell.locator(".jp-InputPrompt")
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    before = prompt.evaluate("el => el.textContent")   # compared with textContent below, so read as that
    run = scope.locator('.jp-Toolbar [data-command="notebook:run-cell"], '
                        '.jp-Toolbar [data-command="notebook:run-cell-and-select-next"]').first
    # A run asked for just after a kernel starts is now and then lost in the lab: the cell stays "[ ]" (no
    # execute request leaves the page), or shows "[*]" and then its old prompt again, with no count. Ask
    # again, at most twice, for either.
    for attempt in range(3):
        # On a loaded machine the lab now and then asks which kernel a notebook should have, though it has
        # one running: answer as a user would, with the kernel it names.
        select_kernel = page.locator(".jp-Dialog", has_text="Select Kernel")
        if select_kernel.count() and select_kernel.is_visible():
            select_kernel.locator(".jp-Dialog-button.jp-mod-accept").click()
            wait_for_kernel(page, path)
        cell.locator(".jp-InputPrompt").click()   # selects the cell
        page.wait_for_function("([el]) => el.classList.contains('jp-mod-active')", arg=[cell.element_handle()],
                               timeout=WAIT_MS)
        # The toolbar's run button: what a keyboard shortcut could race (the edit-mode switch) it cannot.
        run.click()
        try:
            # Started: "[*]", or already a new execution count.
            page.wait_for_function("([el, before]) => el.textContent !== before", arg=[prompt.element_handle(), before],
                                   timeout=WAIT_MS // 3 if attempt < 2 else WAIT_MS)
        except PlaywrightTimeoutError:
            if attempt == 2:
                raise
            continue
        # Finished: a new execution count (a re-run shows its old output until then); or lost: the old prompt.
        outcome = page.wait_for_function("""([el, before]) => {
            const text = el.textContent;
            if (text !== before && /\\[\\d+\\]/.test(text)) return 'finished';
            return text === before ? 'lost' : false;
        }""", arg=[prompt.element_handle(), before], timeout=WAIT_MS).json_value()
        if outcome == "finished":
            break
    else:
        raise AssertionError(f"cell {index} of {path} was run three times and the lab lost each run")
    output = cell.locator(".jp-OutputArea-output")
    output.filter(has_text=expect).first.wait_for(timeout=WAIT_MS)
    return "\n".join(output.all_inner_texts())


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    return path
