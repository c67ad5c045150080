"""A Dask cluster in the UVM Lab view, in a real JupyterLab and Chromium: a notebook starts a LocalCluster of two
process workers on two simulated GPUs each, watches it with a ClusterMonitor, and has each worker hold a buffer on
GPU 1. The view's Cluster section lists the 2 workers x 2 GPUs; a click on a worker shows its timeline (the peer
migration among its rows) and its buffers; "Prefetch to host" is carried out by the worker that owns the buffer (its
row's pages follow); a buffer freed since it was listed is refused with a typed error shown in the section; a worker
killed is marked gone, its last picture kept."""

from __future__ import annotations

import contextlib
import json
import re

import pytest

from .lab import WAIT_MS, new_page, open_notebook, run_cell, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

pytest.importorskip("distributed")

PAGES = 8 * 1024 * 1024 // 4096

SETUP = """\
%load_ext uvm_lab
import contextlib, json, os
import distributed
import uvm_lab as ul
from uvm_lab.dask import ClusterMonitor, UvmLab
ul.use_backend("sim", device_memory="256MiB")
local = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                 worker_dashboard_address=None)
client = distributed.Client(local)
client.wait_for_workers(2)
monitor = ClusterMonitor(client)
client.register_plugin(UvmLab(backend="sim", devices=2, device_memory="256MiB", interval=0.05))
workers = sorted(client.scheduler_info()["workers"])

def hold(label):
    import distributed, uvm_lab as ul
    buf = ul.DeviceBuffer(size="8MiB", label=label)
    ul.touch(buf, on="gpu:0")
    buf.prefetch("gpu:1")
    distributed.get_worker().__dict__.setdefault("held", []).append(buf)
    return int(buf.id)

ids = {w: client.submit(hold, f"held on {w}", workers=[w], pure=False).result() for w in workers}
print("cluster ready", json.dumps(ids))"""

VIEW = "%uvm view"

DROP = """\
def drop(dask_worker):   # client.run runs it on the worker's event loop, which hands it the worker
    for buf in dask_worker.__dict__.pop("held", []):
        buf.close()
client.run(drop, workers=[workers[0]])
print("dropped")"""

KILL = """\
with contextlib.suppress(Exception):   # it dies before it can answer
    client.run(os._exit, 1, workers=[workers[1]])
print("killed")"""

CLOSE = """\
client.close(); local.close(); print("closed")"""


def test_the_view_shows_every_worker_and_gpu_and_routes_a_prefetch(lab, browser, tmp_path):
    url, token, root = lab
    write_notebook(root / "cluster.ipynb", [SETUP, VIEW, DROP, KILL, CLOSE])
    context, page, errors = new_page(browser, 1600, 1000)
    started = False
    try:
        open_notebook(page, url, token, "cluster.ipynb")
        out = run_cell(page, "cluster.ipynb", 0, "cluster ready")
        started = True
        ids = json.loads(re.search(r"cluster ready (\{.*\})", out).group(1))
        first, second = sorted(ids)
        run_cell(page, "cluster.ipynb", 1, "UVM Lab view")
        view = page.locator(".jp-UvmLabView")
        page.locator('.jp-UvmLabView[data-state="connected"]').wait_for(timeout=WAIT_MS)

        # 2 workers x 2 GPUs, each worker's buffer on its GPU 1.
        section = view.locator(".jp-UvmLab-cluster")
        page.locator('.jp-UvmLab-cluster[data-rows="4"]').wait_for(timeout=WAIT_MS)
        assert section.get_attribute("data-workers") == "2" and section.get_attribute("data-gone") == "0"
        for worker in ids:
            row = f'.jp-UvmLab-clusterRow[data-worker="{worker}"]'
            page.locator(f'{row}[data-gpu="1"][data-pages="{PAGES}"]').wait_for(timeout=WAIT_MS)
            assert section.locator(f'{row}[data-gpu="0"]').get_attribute("data-pages") == "0"
            assert "8.00 MiB / 256 MiB" in section.locator(f'{row}[data-gpu="1"]').inner_text()
        section.scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / "cluster-table.png"))

        # A click on a worker: its timeline, with the peer migration of its buffer, and its buffers.
        section.locator(f'.jp-UvmLab-clusterRow[data-worker="{first}"]').first.click()
        detail = section.locator(f'.jp-UvmLab-workerDetail[data-worker="{first}"]')
        detail.wait_for(timeout=WAIT_MS)
        assert section.get_attribute("data-selected") == first
        buffer = detail.locator(f'tr[data-label="held on {first}"]')
        buffer.wait_for(timeout=WAIT_MS)
        assert buffer.get_attribute("data-buffer") == str(ids[first])
        assert f"GPU 1: {PAGES:,} pages" in buffer.inner_text()
        timeline = detail.locator(".jp-UvmLab-timeline")
        page.wait_for_function("el => (el.dataset.kinds || '').includes('DtoD=')", arg=timeline.element_handle(),
                               timeout=WAIT_MS)
        assert int(timeline.get_attribute("data-rows")) > 0
        detail.scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / "cluster-worker.png"))

        # "Prefetch to host": carried out by the worker that owns it; its row's pages follow, the other's stay.
        buffer.get_by_role("button", name=f"Prefetch held on {first} to host").click()
        result = section.locator(".jp-UvmLab-clusterResult")
        page.locator('.jp-UvmLab-clusterResult[data-ok="true"]').wait_for(timeout=WAIT_MS)
        assert result.inner_text().startswith(f"Prefetched held on {first}")
        page.locator(f'.jp-UvmLab-clusterRow[data-worker="{first}"][data-gpu="1"][data-pages="0"]').wait_for(
            timeout=WAIT_MS)
        assert section.locator(f'.jp-UvmLab-clusterRow[data-worker="{second}"][data-gpu="1"]').get_attribute(
            "data-pages") == str(PAGES)
        buffer.filter(has_text=f"host: {PAGES:,} pages").wait_for(timeout=WAIT_MS)

        # A buffer freed since it was listed (the view paused: it holds what it last received) is refused by the
        # worker, and the section says how, typed.
        view.locator(".jp-UvmLab-pause").click()
        page.locator(f'.jp-UvmLab-workerDetail[data-worker="{first}"][data-reading="false"]').wait_for(
            timeout=WAIT_MS)
        run_cell(page, "cluster.ipynb", 2, "dropped")
        buffer.get_by_role("button", name=f"Prefetch held on {first} to GPU 0").click()
        page.locator('.jp-UvmLab-clusterResult[data-ok="false"]').wait_for(timeout=WAIT_MS)
        text = result.inner_text()
        assert text.startswith("InvalidArgumentError: ") and str(ids[first]) in text, text
        detail.locator(f'tr[data-label="held on {first}"]').wait_for(state="detached", timeout=WAIT_MS)
        page.screenshot(path=str(tmp_path / "cluster-refused.png"))
        view.locator(".jp-UvmLab-pause").click()   # resume

        # A worker killed: its rows are marked gone, its last picture kept; the other's stay live.
        run_cell(page, "cluster.ipynb", 3, "killed")
        gone = f'.jp-UvmLab-clusterRow[data-worker="{second}"][data-state="gone"]'
        page.wait_for_function(f"() => document.querySelectorAll('{gone}').length === 2", timeout=WAIT_MS)
        assert int(section.get_attribute("data-gone")) == 2
        for row in section.locator(gone).all():
            assert "\tgone\t" in row.inner_text() and "jp-mod-gone" in row.get_attribute("class")
        assert section.locator(f'{gone}[data-gpu="1"]').get_attribute("data-pages") == str(PAGES)
        assert {r.get_attribute("data-state") for r in
                section.locator(f'.jp-UvmLab-clusterRow[data-worker="{first}"]').all()} == {"live"}
        section.scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / "cluster-gone.png"))
        assert errors == [], errors
    except Exception:
        with contextlib.suppress(Exception):
            page.screenshot(path=str(tmp_path / "cluster-failure.png"))
        raise
    finally:
        if started:
            with contextlib.suppress(Exception):
                run_cell(page, "cluster.ipynb", 4, "closed")
        context.close()
