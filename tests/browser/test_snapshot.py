"""A snapshot page opened from ``file://`` in Chromium with the network off and no server: the timeline draws
the trace's events by cause, hovering a mark names it and the line of this file that caused it, the wheel
zooms (to finer levels), and the device lanes, the allocation list and the by-source table show."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab.jupyter import snapshot as snapshot_module

from .lab import WAIT_MS, screenshot

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not snapshot_module.VIEWER.is_file(), reason="the snapshot viewer is not built (jlpm build)"),
]

AXIS_PX, LANE_PX, LABEL_PX = 22, 18, 110   # timeline.ts's layout


@pytest.fixture
def snapshot_path(tmp_path):
    ul.use_backend("sim", device_memory="64MiB")
    with ul.record() as trace:
        buffers = [ul.DeviceBuffer(size="16MiB", label=f"layer{i}") for i in range(5)]
        for buf in buffers:
            ul.touch(buf, on="gpu")          # oversubscribed: faults, then evictions
        buffers[0].prefetch("host")
        ul.touch(buffers[0], on="gpu")
    path = ul.snapshot(trace, tmp_path / "trace.html", title="Five layers on a 64 MiB GPU")
    for buf in buffers:
        buf.close()
    return path


def test_a_snapshot_opens_from_a_file_with_the_network_off(browser, snapshot_path):
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
    requests: list[str] = []
    context.on("request", lambda request: requests.append(request.url))
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    try:
        page.goto(snapshot_path.as_uri())
        page.wait_for_selector("#uvm-lab-snapshot[data-ready='true']", timeout=WAIT_MS)
        assert page.title() == "Five layers on a 64 MiB GPU"
        timeline = page.locator(".jp-UvmLab-timeline")
        page.wait_for_function("document.querySelector('.jp-UvmLab-timeline').dataset.rows > 0", timeout=WAIT_MS)
        causes = dict(part.split("=") for part in timeline.get_attribute("data-causes").split(";"))
        assert int(causes["demand fault"]) > 0 and int(causes["eviction"]) > 0 and int(causes["prefetch"]) > 0

        # Hover along layer0's lane (the first: the list is oldest first) until a mark answers.
        box = page.locator(".jp-UvmLab-timelineCanvas").bounding_box()
        hover = page.locator(".jp-UvmLab-hover")
        y = box["y"] + AXIS_PX + LANE_PX / 2
        for x in range(LABEL_PX + 1, int(box["width"]), 2):
            page.mouse.move(box["x"] + x, y)
            if hover.is_visible():
                break
        text = hover.inner_text()
        assert text.startswith("layer0") and "from test_snapshot.py:" in text, text

        # The wheel zooms in about the pointer: a narrower window, drawn from a finer level.
        start, end = int(timeline.get_attribute("data-start")), int(timeline.get_attribute("data-end"))
        coarse = int(page.locator(".jp-UvmLab-levelNote").get_attribute("data-width"))
        for _ in range(6):
            page.mouse.wheel(0, -400)
            page.wait_for_timeout(50)
        zoomed = int(timeline.get_attribute("data-end")) - int(timeline.get_attribute("data-start"))
        assert zoomed < (end - start) / 4
        assert int(page.locator(".jp-UvmLab-levelNote").get_attribute("data-width")) > coarse

        # Device lanes (what a trace knows), the allocations, the lines of code, and what is not here.
        assert page.locator(".jp-UvmLab-lane").count() == 4
        assert int(page.locator(".jp-UvmLab-lanes").get_attribute("data-samples")) > 0
        assert page.locator(".jp-UvmLab-row[data-label='layer0']").count() == 1
        assert page.locator(".jp-UvmLab-allocList").get_attribute("data-shown") == "5"
        assert "test_snapshot.py:" in page.locator(".jp-UvmLab-bySourceTable").inner_text()
        assert "Page maps are not in snapshots" in page.locator(".jp-UvmLab-mapsNote").inner_text()

        page.locator(".jp-UvmLab-row[data-label='layer0']").click()
        assert "layer0" in page.locator(".jp-UvmLab-selectionTitle").inner_text()
        page.locator(".jp-UvmLab-live").click()      # "Show all": the whole trace again
        page.mouse.move(box["x"] + LABEL_PX + 200, y)
        screenshot(page, "snapshot.png")
        assert errors == []
        assert all(url.startswith("file:") for url in requests), requests
    finally:
        context.close()


def test_a_two_gpu_snapshot_draws_each_gpus_moves(browser, tmp_path):
    ul.use_backend("sim", devices=2, device_memory="64MiB")
    with ul.record() as trace:
        buf = ul.DeviceBuffer(size="8MiB", label="peer")
        ul.touch(buf, on="host", mode="write")
        buf.prefetch("gpu:0")
        buf.prefetch("gpu:1")
    path = ul.snapshot(trace, tmp_path / "peer.html")
    buf.close()
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    try:
        page.goto(path.as_uri())
        page.wait_for_selector("#uvm-lab-snapshot[data-ready='true']", timeout=WAIT_MS)
        assert page.locator(".jp-UvmLab-lanes").get_attribute("data-gpus") == "2"
        # A trace knows what was allocated, not each GPU's memory: one memory chart, the moves per GPU.
        charts = [lane.get_attribute("data-lane") for lane in page.locator(".jp-UvmLab-lane").all()]
        assert charts == ["Device memory", "Moved per interval", "Faults per interval", "Evicted per interval"]
        legend = page.locator('.jp-UvmLab-lane[data-lane="Moved per interval"] .u-legend').inner_text()
        assert "HtoD to GPU 0" in legend and "DtoD to GPU 1" in legend
        page.wait_for_function("(document.querySelector('.jp-UvmLab-timeline').dataset.kinds || '').includes('DtoD=')",
                               timeout=WAIT_MS)
        page.screenshot(path=str(tmp_path / "two-gpu-snapshot.png"))
        assert errors == []
    finally:
        context.close()
