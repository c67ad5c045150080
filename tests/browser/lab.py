"""What the browser tests share besides their fixtures (``conftest.py``): notebooks, running a cell, paths."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Screenshots go here, never over a tracked file (the folder is ignored by git).
ARTIFACTS = REPO / "test-artifacts"
WAIT_MS = 30_000  # any one thing the page must do


def write_notebook(path: Path, cells: list[str]) -> None:
    path.write_text(json.dumps({
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
        "cells": [{"cell_type": "code", "id": f"cell{i}", "metadata": {}, "execution_count": None, "outputs": [],
                   "source": source} for i, source in enumerate(cells)],
    }))


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

    before = prompt.inner_text()
    run = scope.locator('.jp-Toolbar [data-command="notebook:run-cell"], '
                        '.jp-Toolbar [data-command="notebook:run-cell-and-select-next"]').first
    # A run asked for just after a kernel starts is now and then lost in the lab (the cell stays "[ ]", no
    # execute request leaves the page): ask again, at most twice, when it has not started.
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
            break
        except PlaywrightTimeoutError:
            if attempt == 2:
                raise
    # A re-run shows its old output until it finishes: wait for a new execution count first.
    page.wait_for_function(
        "([el, before]) => el.textContent !== before && /\\[\\d+\\]/.test(el.textContent)",
        arg=[prompt.element_handle(), before], timeout=WAIT_MS)
    output = cell.locator(".jp-OutputArea-output")
    output.filter(has_text=expect).first.wait_for(timeout=WAIT_MS)
    return "\n".join(output.all_inner_texts())


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    return path
