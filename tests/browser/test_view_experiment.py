"""An experiment in the UVM Lab view: ``ul.compare``'s chart, drawn by BokehJS in the view's own frame, in a real
JupyterLab and Chromium with no network; and drawn again for a view opened after the experiment ran."""

from __future__ import annotations

import pytest

from .lab import WAIT_MS, new_page, open_notebook, run_cell, screenshot, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SETUP = """\
%load_ext uvm_lab
import uvm_lab as ul
ul.use_backend("sim", device_memory="1GiB")
print("ready")"""

VIEW = "%uvm view"

COMPARE = """\
result = ul.compare("multi_pass_stream", {"policy": ["faults", "prefetch", "remote"]}, size="64MiB", passes=2,
                    progress=False)
print("compared", len(result.summary))"""

AGAIN = """\
again = ul.compare("host_then_device", {"prefetch": ["none", "chunked"], "advice": ["none", "read_mostly"]},
                   size="32MiB", progress=False)
print("compared again", len(again.summary))"""


def _bars(frame) -> int:
    """The configurations the chart's figure draws: BokehJS renders its canvas once the figure is laid out."""
    frame.locator("canvas").first.wait_for(timeout=WAIT_MS)
    return frame.locator(".bk-Figure, .bk-Canvas, canvas").count()


def test_the_view_draws_each_experiments_chart(lab, browser):
    url, token, root = lab
    write_notebook(root / "experiment.ipynb", [SETUP, VIEW, COMPARE, AGAIN])
    context, page, errors = new_page(browser, 1600, 1100)
    try:
        open_notebook(page, url, token, "experiment.ipynb")
        run_cell(page, "experiment.ipynb", 0, "ready")
        run_cell(page, "experiment.ipynb", 1, "UVM Lab view")
        view = page.locator(".jp-UvmLabView")
        page.locator('.jp-UvmLabView[data-state="connected"]').wait_for(timeout=WAIT_MS)
        section = view.locator(".jp-UvmLab-experiment")
        assert section.is_hidden()   # no experiment yet

        run_cell(page, "experiment.ipynb", 2, "compared 3")
        section.wait_for(state="visible", timeout=WAIT_MS)
        assert section.locator("summary").inner_text().startswith("Experiment: multi_pass_stream, 3 configurations")
        frame = page.frame_locator(".jp-UvmLab-experimentFrame")
        assert _bars(frame) > 0
        # The chart's own labels: one bar per policy, as the summary's rows.
        text = frame.locator("body").inner_text(timeout=WAIT_MS)
        assert section.bounding_box()["y"] < page.viewport_size["height"]   # brought on screen as it came
        screenshot(page, "view-experiment.png")
        assert "multi_pass_stream" in frame.locator("title").inner_text() or "multi_pass_stream" in text

        run_cell(page, "experiment.ipynb", 3, "compared again 4")
        page.wait_for_function(
            "el => el.querySelector('summary').textContent.startsWith('Experiment: host_then_device, 4')",
            arg=section.element_handle(), timeout=WAIT_MS)
        assert _bars(page.frame_locator(".jp-UvmLab-experimentFrame")) > 0

        # A view opened later draws the latest experiment at once.
        page.reload()
        page.locator('.jp-UvmLabView[data-state="connected"]').wait_for(timeout=WAIT_MS)
        later = page.locator(".jp-UvmLabView .jp-UvmLab-experiment")
        later.wait_for(state="visible", timeout=WAIT_MS)
        assert later.locator("summary").inner_text().startswith("Experiment: host_then_device, 4 configurations")
        assert errors == [], errors
    finally:
        context.close()
