"""The UVM Lab panel in a real JupyterLab, in a real Chromium, against a real kernel.

The JupyterLab server and Chromium are the session's (``conftest.py``); the notebook is written here. The test
opens the panel before the kernel has loaded uvm_lab (the panel says so), runs the notebook's first
cell (``%load_ext uvm_lab``, allocate, prefetch to the GPU), and checks the map against the kernel:
what is drawn, per page category (the map's ``data-*-pages`` attributes), what a cell prints from
``ul.residency``, the legend's colours, and what the controls change.
"""

from __future__ import annotations

import contextlib
import json
import re

import pytest

from uvm_lab.jupyter.palette import PALETTE
from uvm_lab.page_states import CATEGORY_NAMES

from .lab import ARTIFACTS, WAIT_MS, new_page, open_notebook, run_cell, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SCREENSHOT = ARTIFACTS / "panel.png"
PAGES = 64 * 1024 * 1024 // 4096  # the "weights" buffer below

SETUP = """\
%load_ext uvm_lab
import uvm_lab as ul
ul.use_backend("sim", device_memory="4GiB")
buf = ul.DeviceBuffer(size="64MiB", label="weights")
buf.prefetch("gpu")
act = ul.DeviceBuffer(size="24MiB", label="activations")
ul.touch(act, on="gpu", mode="write", size="10MiB")
ul.touch(act, on="host", mode="write", offset="14MiB", size="6MiB")
print("ready", buf.id)"""

STATE = """\
import json
from uvm_lab.page_states import CATEGORY_NAMES
def pages(b):
    codes = ul.residency(b).categories()
    return {name: int((codes == code).sum()) for code, name in enumerate(CATEGORY_NAMES)}
print("STATE", json.dumps({b.label: {**pages(b), "read_mostly": b.read_mostly} for b in (buf, act)}))"""

READ_ON_GPU = """ul.touch(buf, on="gpu", mode="read"); print("touched")"""

LOOP = """\
import time
for i in range(24):
    buf.prefetch("gpu" if i % 2 == 0 else "host")
    time.sleep(0.25)
print("looped")"""

NO_PAGES = dict.fromkeys(CATEGORY_NAMES, 0)


def _kernel_state(page) -> dict:
    """What the kernel says, printed by a cell: ``ul.residency(b)``'s pages per category and ``b.read_mostly``,
    per buffer."""
    text = run_cell(page, "uvm.ipynb", 1, "STATE")
    return json.loads(re.search(r"STATE (\{.*\})", text).group(1))


def _drawn(attrs: dict) -> dict:
    """The pages a map drew per category (``data-gpu0-pages`` ... ``data-unknown-pages``), by category name."""
    return {name: int(attrs[f"{name.replace(':', '')}Pages"]) for name in CATEGORY_NAMES}


def _rgb(colour: str) -> str:
    """A ``#rrggbb`` colour as the browser's computed style spells it."""
    return "rgb({}, {}, {})".format(*(int(colour[i:i + 2], 16) for i in (1, 3, 5)))


def _wait_for_map(page, label: str, **attrs: str) -> dict:
    """Wait until the map of ``label`` shows ``attrs`` (data attributes); return all of its data attributes."""
    selector = f'.jp-UvmLab-map[data-label="{label}"]' + "".join(f'[data-{k}="{v}"]' for k, v in attrs.items())
    page.locator(selector).wait_for(state="attached", timeout=WAIT_MS)
    return page.locator(selector).evaluate("el => ({...el.dataset})")


def test_panel_shows_live_residency_and_its_controls_change_the_kernel(lab, browser):
    url, token, root = lab
    write_notebook(root / "uvm.ipynb", [SETUP, STATE, READ_ON_GPU, LOOP])
    context, page, errors = new_page(browser, 1280, 860)
    try:
        open_notebook(page, url, token, "uvm.ipynb")

        # The panel, opened from the left sidebar before the kernel has loaded uvm_lab, says so.
        tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="uvm-lab"]')
        assert tab.get_attribute("title") == "UVM Lab"
        tab.click()
        panel = page.locator("#uvm-lab")
        panel.wait_for(state="visible", timeout=WAIT_MS)
        notice = panel.locator(".jp-UvmLab-notice")
        notice.filter(has_text="%load_ext uvm_lab").wait_for(state="visible", timeout=WAIT_MS)
        assert notice.get_by_role("button", name="Retry").is_visible()

        # Running the cell that loads it attaches the panel (it retries after each execution).
        assert "ready" in run_cell(page, "uvm.ipynb", 0, "ready")
        drawn = _wait_for_map(page, "weights", **{"gpu0-pages": PAGES})
        assert notice.is_hidden()
        assert drawn["pages"] == drawn["cells"] == str(PAGES) and drawn["cellPages"] == "1"
        assert _drawn(drawn) == {**NO_PAGES, "gpu:0": PAGES}
        kernel = _kernel_state(page)
        assert kernel["weights"] == {**NO_PAGES, "gpu:0": PAGES, "read_mostly": False}
        weights_item = panel.locator(".jp-UvmLab-allocation", has=page.locator('[data-label="weights"]'))
        assert weights_item.locator(".jp-UvmLab-counts").inner_text() == "GPU 0 100.0%"

        # The legend names the device's one GPU and "unknown", each in the palette's colour.
        legend = panel.locator(".jp-UvmLab-legendItem")
        assert legend.evaluate_all("els => els.map(e => e.dataset.category)") == [
            "gpu:0", "host", "both", "unknown", "nowhere"]
        swatches = legend.evaluate_all("els => els.map(e => getComputedStyle(e.firstChild).backgroundColor)")
        assert swatches == [_rgb(PALETTE[name]) for name in ("gpu:0", "host", "both", "unknown", "nowhere")]

        # The second allocation's map draws exactly the kernel's mixture of categories.
        mixed = _drawn(_wait_for_map(page, "activations"))
        assert mixed == {k: v for k, v in kernel["activations"].items() if k != "read_mostly"}
        assert mixed["gpu:0"] and mixed["host"] and mixed["nowhere"]

        # Prefetching the selected allocation (the first one) to the host moves it in the kernel ...
        assert panel.locator(".jp-UvmLab-selected").inner_text().startswith("Selected: weights")
        destination = panel.get_by_label("Prefetch destination")
        assert destination.evaluate("el => [...el.options].map(o => o.value)") == ["gpu:0", "host"]  # one per GPU
        destination.select_option("host")
        panel.get_by_role("button", name="Prefetch", exact=True).click()
        drawn = _wait_for_map(page, "weights", **{"host-pages": PAGES})
        assert drawn["gpu0Pages"] == "0"
        on_host = {**NO_PAGES, "host": PAGES, "read_mostly": False}
        assert _kernel_state(page)["weights"] == on_host
        panel.locator(".jp-UvmLab-status").filter(has_text="Prefetched weights to the host").wait_for(timeout=WAIT_MS)

        # ... and the ReadMostly toggle sets the advice there.
        switch = panel.get_by_role("switch", name="ReadMostly")
        assert switch.get_attribute("aria-checked") == "false"
        switch.click()
        _wait_for_map(page, "weights", **{"read-mostly": "true"})
        page.locator('#uvm-lab [role="switch"][aria-checked="true"]').wait_for(timeout=WAIT_MS)
        assert _kernel_state(page)["weights"]["read_mostly"] is True

        # A cell that reads it on the GPU now duplicates the pages; the map follows on its own.
        run_cell(page, "uvm.ipynb", 2, "touched")
        drawn = _wait_for_map(page, "weights", **{"both-pages": PAGES})
        assert _kernel_state(page)["weights"] == {**NO_PAGES, "both": PAGES, "read_mostly": True}
        assert _drawn(drawn) == {**NO_PAGES, "both": PAGES}

        # A picture for the docs: the sidebar widened, beside the notebook that drove it.
        handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle").first
        box = handle.bounding_box()
        if box:
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.mouse.down()
            page.mouse.move(box["x"] + 160, box["y"] + box["height"] / 2, steps=5)
            page.mouse.up()
        _wait_for_map(page, "weights", **{"both-pages": PAGES})
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT))

        # Off again, from the panel.
        switch.click()
        page.locator('#uvm-lab [role="switch"][aria-checked="false"]').wait_for(timeout=WAIT_MS)
        assert _kernel_state(page)["weights"]["read_mostly"] is False

        # While a cell runs, the map follows it, and the controls still reach the kernel (comms go to an
        # ipykernel 7 subshell, beside the busy main thread).
        loop = page.locator(".jp-Notebook .jp-CodeCell").nth(3)
        running = loop.locator(".jp-InputPrompt")
        weights = page.locator('.jp-UvmLab-map[data-label="weights"]')
        revision = int(weights.get_attribute("data-revision"))
        loop.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Control+Enter")
        page.wait_for_function("([el, rev]) => Number(el.dataset.revision) >= rev", timeout=WAIT_MS,
                               arg=[weights.element_handle(), revision + 3])
        assert "*" in running.inner_text(), "the map should move while the cell is still running"
        switch.click()
        page.locator('#uvm-lab [role="switch"][aria-checked="true"]').wait_for(timeout=WAIT_MS)
        assert "*" in running.inner_text(), "ReadMostly should be set while the cell is still running"
        loop.locator(".jp-OutputArea-output").filter(has_text="looped").wait_for(timeout=WAIT_MS)
        assert _kernel_state(page)["weights"]["read_mostly"] is True

        # A kernel restart empties the panel; loading uvm_lab in the new kernel brings it back.
        page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Restart Kernel and Clear Outputs")).click()
        page.locator(".jp-Dialog-button.jp-mod-accept").click()
        notice.filter(has_text="%load_ext uvm_lab").wait_for(state="visible", timeout=WAIT_MS)
        assert page.locator(".jp-UvmLab-map").count() == 0
        run_cell(page, "uvm.ipynb", 0, "ready")
        drawn = _wait_for_map(page, "weights", **{"gpu0-pages": PAGES})
        assert drawn["readMostly"] == "false"
        assert errors == []
    except Exception:
        with contextlib.suppress(Exception):
            failure = ARTIFACTS / "panel-failure.png"
            failure.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(failure), full_page=True)
        raise
    finally:
        context.close()

