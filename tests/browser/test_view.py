"""The UVM Lab main-area view in a real JupyterLab and Chromium, against a real kernel on the simulated GPU.

A scripted cell allocates, writes on the host, reads on the GPU and prefetches back; ``%uvm view`` opens
the view. It must list the 301 allocations without a row for each in the page, find and sort them, show
the cell's events in the timeline by cause (as many as the kernel's own records say), name an event and
its cell line when hovered, zoom, select an allocation from the timeline, change the kernel through its
controls, the map following, and show an earlier state of the map at the time cursor. A second
notebook's kernel takes over the view when that notebook is the current one, and a kernel restart is
followed once uvm_lab is loaded again.
"""

from __future__ import annotations

import contextlib
import json
import re

import pytest

from .lab import WAIT_MS, new_page, open_notebook, run_cell, screenshot, wait_for_kernel, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGES = 8 * 1024 * 1024 // 4096  # "weights"

SETUP = """\
%load_ext uvm_lab
import uvm_lab as ul
ul.use_backend("sim", device_memory="256MiB")
weights = ul.DeviceBuffer(size="8MiB", label="weights")
ul.touch(weights, on="host", mode="write")
ul.touch(weights, on="gpu", mode="read")
weights.prefetch("host")
small = [ul.DeviceBuffer(size="64KiB", label=f"small-{i}") for i in range(300)]
print("ready")"""

VIEW = "%uvm view"

# What the kernel says: weights' pages per category, its advice, and its events per cause (the records of
# its address range, as the bus holds them).
STATE = """\
import json
from uvm_lab.events.causes import CAUSE_NAMES, cause_codes
from uvm_lab.page_states import CATEGORY_NAMES
def pages(b):
    codes = ul.residency(b).categories()
    return {name: int((codes == code).sum()) for code, name in enumerate(CATEGORY_NAMES) if (codes == code).any()}
h = ul.events.get_bus().history()
mine = h[(h["address"] >= weights.ptr) & (h["address"] < weights.ptr + weights.size)]
causes = {name: int((cause_codes(mine) == i).sum()) for i, name in enumerate(CAUSE_NAMES)}
prefetched = mine["start"][mine["kind"] == ul.events.EventKind.PREFETCH]
print("STATE", json.dumps({"pages": pages(weights), "read_mostly": weights.read_mostly,
                           "preferred": weights.preferred_location, "accessed_by": list(weights.accessed_by),
                           "causes": causes, "last_prefetch": int(prefetched.max())}))"""

# The update interval of every session of the kernel's views, in ms.
RATE = 'from uvm_lab.jupyter.comm import sessions; print("RATE", [round(s.interval * 1000) for s in sessions()])'

OTHER = """\
%load_ext uvm_lab
import uvm_lab as ul
ul.use_backend("sim", device_memory="1GiB")
only = ul.DeviceBuffer(size="2MiB", label="other-notebook")
print("other ready")"""


def _kernel_state(page) -> dict:
    text = run_cell(page, "view.ipynb", 2, "STATE")
    return json.loads(re.search(r"STATE (\{.*\})", text).group(1))


def _causes(view) -> dict[str, int]:
    text = view.locator(".jp-UvmLab-timeline").get_attribute("data-causes")
    return {k: int(v) for k, v in (part.split("=") for part in text.split(";"))}


def _hover_first_mark(page, view, lane_index: int) -> str:
    """Move along a timeline lane until the pointer is over a mark; return the hover text."""
    canvas = view.locator(".jp-UvmLab-timelineCanvas")
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    y = box["y"] + 22 + 18 * lane_index + 9
    tooltip = view.locator(".jp-UvmLab-timeline .jp-UvmLab-hover")
    for x in range(int(box["x"]) + 112, int(box["x"] + box["width"]) - 2, 3):
        page.mouse.move(x, y)
        if tooltip.is_visible():
            return tooltip.inner_text()
    raise AssertionError("no mark along the lane")


def test_the_view_shows_a_cells_events_and_its_controls_change_the_kernel(lab, browser):
    url, token, root = lab
    write_notebook(root / "view.ipynb", [SETUP, VIEW, STATE, RATE])
    write_notebook(root / "other.ipynb", [OTHER])
    context, page, errors = new_page(browser, 1600, 1000)
    try:
        open_notebook(page, url, token, "view.ipynb")
        run_cell(page, "view.ipynb", 0, "ready")
        run_cell(page, "view.ipynb", 1, "UVM Lab view")
        view = page.locator(".jp-UvmLabView")
        page.locator('.jp-UvmLabView[data-state="connected"]').wait_for(timeout=WAIT_MS)

        # The list: all 301 allocations, a screenful of rows in the page.
        allocations = view.locator(".jp-UvmLab-allocList")
        page.locator('.jp-UvmLab-allocList[data-shown="301"]').wait_for(timeout=WAIT_MS)
        rows = view.locator(".jp-UvmLab-row").count()
        assert 0 < rows < 60, f"{rows} rows in the page for 301 allocations: not virtualised"
        # Sorted by faults, weights (the only one touched) comes first.
        view.get_by_label("Sort allocations").select_option("faults")
        assert view.locator(".jp-UvmLab-row").first.get_attribute("data-label") == "weights"
        # A search narrows it (and the timeline's lanes with it).
        view.get_by_label("Search allocations").fill("weights")
        page.locator('.jp-UvmLab-allocList[data-shown="1"]').wait_for(timeout=WAIT_MS)
        assert allocations.locator(".jp-UvmLab-listCount").inner_text() == "1 of 301"

        # The timeline draws weights' events by cause, as many as the kernel recorded.
        kernel = _kernel_state(page)
        assert kernel["causes"]["demand fault"] > 0 and kernel["causes"]["prefetch"] > 0
        timeline = view.locator(".jp-UvmLab-timeline")
        page.wait_for_function(
            "([el, n]) => el.dataset.causes && el.dataset.causes.includes(`demand fault=${n};`)",
            arg=[timeline.element_handle(), kernel["causes"]["demand fault"]], timeout=WAIT_MS)
        drawn = _causes(view)
        assert drawn["demand fault"] == kernel["causes"]["demand fault"]
        assert drawn["prefetch"] == kernel["causes"]["prefetch"]
        # Hover names the mark: its kind, cause, bytes, pages, where from and to, when and how long.
        text = _hover_first_mark(page, view, 0)
        assert text.startswith("weights\n")
        assert re.search(r"(demand fault|prefetch|allocation)", text) and " pages" in text
        # Where: a move's way, a fault's processor (an allocation has no place).
        assert "→" in text or re.search(r"\non (GPU \d|host)\n", text) or "allocation" in text, text
        assert re.search(r"at .+, for .+", text)
        # ... and the line of the cell that caused it.
        assert re.search(r"\nfrom In \[1\], line [4-8]$", text), text
        # The "by source line" table: the GPU read's line took faults; the prefetch's moved bytes to the host.
        lines = view.locator(".jp-UvmLab-sourceTable")
        read_row = lines.locator('tr[data-source="In [1], line 6"]')
        read_row.wait_for(timeout=WAIT_MS)
        assert int(read_row.locator("td").nth(1).inner_text()) > 0
        prefetch_row = lines.locator('tr[data-source="In [1], line 7"]')
        assert not prefetch_row.locator("td").nth(3).inner_text().startswith("0 ")
        screenshot(page, "view-timeline-hover.png")

        # The wheel zooms in: a narrower window, no longer following; "Follow live" goes back.
        before = int(timeline.get_attribute("data-end")) - int(timeline.get_attribute("data-start"))
        box = view.locator(".jp-UvmLab-timelineCanvas").bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 30)
        page.mouse.wheel(0, -600)
        page.wait_for_function("el => el.dataset.following === 'false'", arg=timeline.element_handle(),
                               timeout=WAIT_MS)
        after = int(timeline.get_attribute("data-end")) - int(timeline.get_attribute("data-start"))
        assert after < before / 2
        view.get_by_role("button", name="Follow live").click()
        page.wait_for_function("el => el.dataset.following === 'true'", arg=timeline.element_handle(),
                               timeout=WAIT_MS)

        # A click on a mark selects its allocation.
        view.get_by_label("Search allocations").fill("")
        page.locator('.jp-UvmLab-allocList[data-shown="301"]').wait_for(timeout=WAIT_MS)
        view.get_by_label("Sort allocations").select_option("size")
        view.locator('.jp-UvmLab-row[data-label="small-0"]').click()
        view.locator(".jp-UvmLab-selectionTitle").filter(has_text=re.compile("^small-0")).wait_for(timeout=WAIT_MS)
        view.get_by_label("Sort allocations").select_option("faults")
        _hover_first_mark(page, view, 0)
        page.mouse.down()
        page.mouse.up()
        view.locator(".jp-UvmLab-selectionTitle").filter(has_text=re.compile("^weights")).wait_for(timeout=WAIT_MS)

        # The page map: every page on the host, as the kernel says; hover names a page.
        big = view.locator('.jp-UvmLab-bigMap[data-label="weights"]')
        big.wait_for(timeout=WAIT_MS)
        assert big.get_attribute("data-host-pages") == str(kernel["pages"]["host"]) == str(PAGES)
        assert view.locator(".jp-UvmLab-placement").get_attribute("data-requested") == "host"
        big.scroll_into_view_if_needed()
        mbox = big.bounding_box()
        page.mouse.move(mbox["x"] + 2, mbox["y"] + 2)
        hover = view.locator(".jp-UvmLab-pageMap:has(.jp-UvmLab-bigMap) .jp-UvmLab-hover")
        hover.wait_for(state="visible", timeout=WAIT_MS)
        assert hover.inner_text().splitlines()[:3] == ["weights: page 0", hover.inner_text().splitlines()[1], "Host"]
        assert hover.inner_text().splitlines()[1].startswith("0x") and "last event: " in hover.inner_text()
        # Zoom the map in: bigger cells.
        px = int(big.get_attribute("data-cell-px"))
        view.get_by_role("button", name="Zoom the page map in").click()
        page.wait_for_function("([el, px]) => Number(el.dataset.cellPx) > px", arg=[big.element_handle(), px],
                               timeout=WAIT_MS)

        # Controls: prefetch pages 0-99 to GPU 0; the map and the kernel agree, requested beside observed.
        view.get_by_label("Prefetch destination").select_option("gpu:0")
        view.get_by_label("First page", exact=True).fill("0")
        view.get_by_label("Page count").fill("100")
        view.get_by_role("button", name="Prefetch", exact=True).click()
        page.locator('.jp-UvmLab-bigMap[data-label="weights"][data-gpu0-pages="100"]').wait_for(timeout=WAIT_MS)
        result = view.get_by_label("Last command")
        result.filter(has_text="Prefetched weights (pages 0–99) to GPU 0.").wait_for(timeout=WAIT_MS)
        assert view.locator(".jp-UvmLab-placement").get_attribute("data-requested") == "gpu:0"
        assert _kernel_state(page)["pages"] == {"gpu:0": 100, "host": PAGES - 100}
        # The time cursor: as that prefetch started, the map was as before (all on the host); the end is live.
        kernel = _kernel_state(page)
        cursor = view.get_by_label("Time cursor", exact=True)
        cursor.evaluate("(el, t) => { el.value = String(t); el.dispatchEvent(new Event('input')); }",
                        kernel["last_prefetch"])
        page.locator('.jp-UvmLab-bigMap[data-label="weights"][data-gpu0-pages="0"]').wait_for(timeout=WAIT_MS)
        position = view.get_by_label("Time cursor position")
        assert position.get_attribute("data-live") == "false"
        assert re.fullmatch(r"at .+ · \d+ states held", position.inner_text()), position.inner_text()
        assert timeline.get_attribute("data-cursor") != "live"   # marked on the timeline too
        screenshot(page, "view-time-cursor.png")
        # Before the view first read the map: not known, and it says so rather than guess.
        cursor.focus()
        page.keyboard.press("Home")
        position.filter(has_text="map from then is not held").wait_for(timeout=WAIT_MS)
        page.keyboard.press("End")
        page.locator('.jp-UvmLab-bigMap[data-label="weights"][data-gpu0-pages="100"]').wait_for(timeout=WAIT_MS)
        assert position.get_attribute("data-live") == "true" and timeline.get_attribute("data-cursor") == "live"
        # A click on the timeline's time axis puts the cursor there.
        view.locator(".jp-UvmLab-timelineCanvas").scroll_into_view_if_needed()
        tbox = view.locator(".jp-UvmLab-timelineCanvas").bounding_box()
        page.mouse.click(tbox["x"] + 120, tbox["y"] + 8)
        page.wait_for_function("el => el.dataset.live === 'false'", arg=position.element_handle(), timeout=WAIT_MS)
        assert int(timeline.get_attribute("data-cursor")) <= int(timeline.get_attribute("data-start")) + \
            (int(timeline.get_attribute("data-end")) - int(timeline.get_attribute("data-start"))) // 10
        cursor.focus()
        page.keyboard.press("End")
        page.locator('.jp-UvmLab-bigMap[data-label="weights"][data-gpu0-pages="100"]').wait_for(timeout=WAIT_MS)
        assert position.get_attribute("data-live") == "true" and position.inner_text().startswith("live")
        # A range past the end: the kernel's typed error, shown; nothing moves.
        view.get_by_label("First page", exact=True).fill(str(PAGES - 1))
        view.get_by_label("Page count").fill("5")
        view.get_by_role("button", name="Prefetch", exact=True).click()
        result.filter(has_text="InvalidArgumentError").wait_for(timeout=WAIT_MS)
        assert "run past the last page" in result.inner_text()
        # Each advice, set and unset.
        view.get_by_label("Preferred location").select_option("gpu:0")
        result.filter(has_text="PreferredLocation is GPU 0").wait_for(timeout=WAIT_MS)
        # The boxes show the kernel's advice: checked once the kernel has it.
        host_box = view.get_by_role("group", name="Accessed by").get_by_label("Host")
        host_box.click()
        result.filter(has_text="AccessedBy is host").wait_for(timeout=WAIT_MS)
        page.wait_for_function("el => el.checked", arg=host_box.element_handle(), timeout=WAIT_MS)
        view.get_by_role("switch", name="ReadMostly").click()
        view.locator('[role="switch"][aria-checked="true"]').wait_for(timeout=WAIT_MS)
        kernel = _kernel_state(page)
        assert (kernel["preferred"], kernel["accessed_by"], kernel["read_mostly"]) == ("gpu:0", ["host"], True)
        screenshot(page, "view.png")
        view.get_by_label("Preferred location").select_option("")
        result.filter(has_text="PreferredLocation is unset").wait_for(timeout=WAIT_MS)
        host_box.click()
        result.filter(has_text="AccessedBy is unset").wait_for(timeout=WAIT_MS)
        page.wait_for_function("el => !el.checked", arg=host_box.element_handle(), timeout=WAIT_MS)
        view.get_by_role("switch", name="ReadMostly").click()
        view.locator('[role="switch"][aria-checked="false"]').wait_for(timeout=WAIT_MS)
        kernel = _kernel_state(page)
        assert (kernel["preferred"], kernel["accessed_by"], kernel["read_mostly"]) == (None, [], False)

        # The device lanes hold the samples of the run, the last one the kernel's capacity.
        lanes = view.locator(".jp-UvmLab-lanes")
        assert int(lanes.get_attribute("data-samples")) >= 1
        assert lanes.get_attribute("data-total") == str(256 * 2**20)

        # A second notebook: the view follows whichever is current.
        page.get_by_text("File", exact=True).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Open from Path")).click()
        page.locator(".jp-Dialog input").fill("other.ipynb")
        page.locator(".jp-Dialog-button.jp-mod-accept").click()
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell").first.wait_for(timeout=WAIT_MS)
        wait_for_kernel(page, "other.ipynb")
        # The view follows the new current notebook at once: its kernel has not loaded uvm_lab yet.
        view.locator(".jp-UvmLab-notice").filter(has_text="%load_ext uvm_lab").wait_for(timeout=WAIT_MS)
        run_cell(page, "other.ipynb", 0, "other ready")
        page.locator('.jp-UvmLab-allocList[data-shown="1"]').wait_for(timeout=WAIT_MS)
        assert view.locator(".jp-UvmLab-row").first.get_attribute("data-label") == "other-notebook"
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="view.ipynb").click()
        page.locator('.jp-UvmLab-allocList[data-shown="301"]').wait_for(timeout=WAIT_MS)

        # The update rate, picked before a kernel restart, holds after it.
        view.get_by_label("Update interval").select_option("250")
        result.filter(has_text="Updates every 250 ms.").wait_for(timeout=WAIT_MS)
        assert "RATE [250]" in run_cell(page, "view.ipynb", 3, "RATE")
        # A kernel restart: the view says what to run, then reattaches by itself once it has run.
        page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Restart Kernel and Clear Outputs")).click()
        page.locator(".jp-Dialog-button.jp-mod-accept").click()
        notice = view.locator(".jp-UvmLab-notice")
        notice.filter(has_text="%load_ext uvm_lab").wait_for(state="visible", timeout=WAIT_MS)
        assert view.locator(".jp-UvmLab-row").count() == 0
        screenshot(page, "view-restarted.png")
        run_cell(page, "view.ipynb", 0, "ready")
        page.locator('.jp-UvmLab-allocList[data-shown="301"]').wait_for(timeout=WAIT_MS)
        assert notice.is_hidden()
        assert view.get_by_label("Update interval").input_value() == "250"
        # The view asks for it again as it reattaches; the kernel may take it just after the cell above ends.
        for _ in range(20):
            rate = run_cell(page, "view.ipynb", 3, "RATE")
            if "RATE [250]" in rate:
                break
            page.wait_for_timeout(250)
        assert "RATE [250]" in rate
        assert errors == []
    except Exception:
        with contextlib.suppress(Exception):
            screenshot(page, "view-failure.png")
        raise
    finally:
        context.close()


TWO_GPUS = """\
%load_ext uvm_lab
import uvm_lab as ul
ul.use_backend("sim", devices=2, device_memory="256MiB")
peer = ul.DeviceBuffer(size="8MiB", label="peer")
ul.touch(peer, on="host", mode="write")
print("ready")"""

TO_GPU0 = """\
peer.prefetch("gpu:0")   # from the host
print("on gpu:0")"""

TO_GPU1 = """\
peer.prefetch("gpu:1")   # over the peer link
print("on gpu:1")"""


def _hover_marks_until(page, view, lane_index: int, wanted: str) -> str:
    """Move along a timeline lane right to left (newest marks first) until a mark's hover text holds ``wanted``."""
    canvas = view.locator(".jp-UvmLab-timelineCanvas")
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    y = box["y"] + 22 + 18 * lane_index + 9
    tooltip = view.locator(".jp-UvmLab-timeline .jp-UvmLab-hover")
    for x in range(int(box["x"] + box["width"]) - 2, int(box["x"]) + 112, -2):
        page.mouse.move(x, y)
        if tooltip.is_visible() and wanted in tooltip.inner_text():
            return tooltip.inner_text()
    raise AssertionError(f"no mark along the lane says {wanted!r}")


def _legend(view, lane: str) -> dict[str, str]:
    """A device lane's legend: each series' label and the value it shows at the cursor."""
    rows = view.locator(f'.jp-UvmLab-lane[data-lane="{lane}"] .u-legend .u-series')
    return {row.locator(".u-label").inner_text(): row.locator(".u-value").inner_text() for row in rows.all()}


def test_the_view_shows_every_gpu_and_a_peer_migration(lab, browser, tmp_path):
    url, token, root = lab
    write_notebook(root / "gpus.ipynb", [TWO_GPUS, VIEW, TO_GPU0, TO_GPU1])
    context, page, errors = new_page(browser, 1600, 1000)
    try:
        open_notebook(page, url, token, "gpus.ipynb")
        run_cell(page, "gpus.ipynb", 0, "ready")
        run_cell(page, "gpus.ipynb", 1, "UVM Lab view")
        view = page.locator(".jp-UvmLabView")
        page.locator('.jp-UvmLabView[data-state="connected"]').wait_for(timeout=WAIT_MS)
        lanes = view.locator(".jp-UvmLab-lanes")
        run_cell(page, "gpus.ipynb", 2, "on gpu:0")
        page.wait_for_function("el => el.dataset.used === String(8 * 2**20)", arg=lanes.element_handle(),
                               timeout=WAIT_MS)
        run_cell(page, "gpus.ipynb", 3, "on gpu:1")

        # A memory chart per GPU, and the lanes' totals over both: 8 MiB in use, on GPU 1 now.
        page.locator('.jp-UvmLab-lanes[data-gpus="2"]').wait_for(timeout=WAIT_MS)
        charts = [lane.get_attribute("data-lane") for lane in view.locator(".jp-UvmLab-lane").all()]
        assert charts == ["GPU 0 memory", "GPU 1 memory", "Moved per interval", "Faults per interval",
                          "Evicted per interval"]
        assert lanes.get_attribute("data-total") == str(2 * 256 * 2**20)
        page.wait_for_function("el => el.dataset.used === String(8 * 2**20)", arg=lanes.element_handle(),
                               timeout=WAIT_MS)
        # Each GPU's way of moving is a series of its own: the peer copy into GPU 1 among them.
        moved = view.locator('.jp-UvmLab-lane[data-lane="Moved per interval"] .u-legend')
        for label in ("HtoD to GPU 0", "DtoH from GPU 0", "DtoD to GPU 1"):
            assert label in moved.inner_text(), moved.inner_text()
        kernel_line = view.locator(".jp-UvmLab-kernel")
        kernel_line.filter(has_text="GPU 0: 0 B of 256 MiB in use, GPU 1: 8.00 MiB of 256 MiB in use").wait_for(
            timeout=WAIT_MS)
        # The newest interval, as a user reads it off the charts: the pointer at its end (the cursors move together).
        lanes.scroll_into_view_if_needed()
        over = view.locator('.jp-UvmLab-lane[data-lane="GPU 1 memory"] .u-over')
        box = over.bounding_box()
        page.mouse.move(box["x"] + box["width"] - 1, box["y"] + box["height"] / 2)
        assert _legend(view, "GPU 1 memory")["used"] == "8.00 MiB"
        assert _legend(view, "GPU 0 memory")["used"] == "0 B"
        assert _legend(view, "GPU 0 memory")["capacity"] == _legend(view, "GPU 1 memory")["capacity"] == "256 MiB"
        moves = _legend(view, "Moved per interval")
        assert moves["DtoD to GPU 1"] == "8.00 MiB" and moves["DtoD to GPU 0"] == moves["HtoD to GPU 1"] == "0 B"
        page.screenshot(path=str(tmp_path / "two-gpus-lanes.png"))

        # The timeline draws the peer migration, and its hover names both GPUs.
        timeline = view.locator(".jp-UvmLab-timeline")
        page.wait_for_function("el => (el.dataset.kinds || '').includes('DtoD=')", arg=timeline.element_handle(),
                               timeout=WAIT_MS)
        text = _hover_marks_until(page, view, 0, "DtoD")
        assert text.startswith("peer\n") and "GPU 0 → GPU 1" in text, text
        page.screenshot(path=str(tmp_path / "two-gpus-timeline.png"))
        assert errors == []
    except Exception:
        with contextlib.suppress(Exception):
            page.screenshot(path=str(tmp_path / "two-gpus-failure.png"))
        raise
    finally:
        context.close()


BIG = """\
%load_ext uvm_lab
import uvm_lab as ul
ul.use_backend("sim", device_memory="512MiB")
big = ul.DeviceBuffer(size="128MiB", label="big")   # 32,768 pages: two to a cell of the map
ul.touch(big, on="gpu", mode="write", offset=30_000 * 4096, size=4096)
codes = ul.residency(big, first_page=16_384, pages=16_384).categories()
print("BIG", int((codes == 5).sum()))"""


def test_a_large_allocations_pages_can_be_read_one_a_cell(lab, browser):
    url, token, root = lab
    write_notebook(root / "big.ipynb", [BIG, VIEW])
    context = browser.new_context(viewport={"width": 1600, "height": 1000}, device_scale_factor=1)
    page = context.new_page()
    try:
        open_notebook(page, url, token, "big.ipynb")
        gpu_pages = int(re.search(r"BIG (\d+)", run_cell(page, "big.ipynb", 0, "BIG")).group(1))
        assert gpu_pages > 0
        run_cell(page, "big.ipynb", 1, "UVM Lab view")
        view = page.locator(".jp-UvmLabView")
        whole = view.locator('.jp-UvmLab-bigMap[data-label="big"]')
        whole.wait_for(timeout=WAIT_MS)
        assert whole.get_attribute("data-cell-pages") == "2"
        # A click on the map's last cell (pages 32,766-32,767) reads the last 16,384 pages, one a cell.
        whole.evaluate("""el => {
            const px = Number(el.dataset.cellPx), cols = Math.floor(el.clientWidth / px), cell = 16383;
            const box = el.getBoundingClientRect();
            el.dispatchEvent(new MouseEvent('click', {bubbles: true, clientX: box.left + (cell % cols) * px + px / 2,
                                                      clientY: box.top + Math.floor(cell / cols) * px + px / 2}));
        }""")
        detail = view.locator('.jp-UvmLab-detailMap[data-label="big"]')
        detail.wait_for(timeout=WAIT_MS)
        assert (detail.get_attribute("data-first-page"), detail.get_attribute("data-cells"),
                detail.get_attribute("data-cell-pages")) == ("16384", "16384", "1")
        # Exactly the kernel's pages there: as many on GPU 0 as it counts.
        assert detail.get_attribute("data-gpu0-pages") == str(gpu_pages)
        title = view.get_by_label("Page detail")
        assert re.match(r"Pages 16,384–32,767, one a cell · read at .+", title.inner_text()), title.inner_text()
        # Hover names the allocation's own page number.
        detail.scroll_into_view_if_needed()
        dbox = detail.bounding_box()
        page.mouse.move(dbox["x"] + 1, dbox["y"] + 1)
        hover = view.locator(".jp-UvmLab-hover").filter(has_text="big: page 16384")
        hover.wait_for(state="visible", timeout=WAIT_MS)
        screenshot(page, "view-page-detail.png")
    except Exception:
        with contextlib.suppress(Exception):
            screenshot(page, "view-failure.png")
        raise
    finally:
        context.close()
