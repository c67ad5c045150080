"""Make the README's screenshots from the notebooks, in a real JupyterLab and Debian's Chromium.

    python3 docs/screenshots.py          # writes docs/images/view.png and docs/images/panel.png

It runs ``notebooks/02-the-view.ipynb`` (a copy, in a temporary folder: the notebook in the checkout is not
touched) on the simulated GPU with the UVM Lab view open, hovers an event on the timeline, and takes the
pictures. A cell that shows an error, or anything on stderr, stops it with that line, and no picture is
written: the README never shows a failing notebook. Needs the built lab extension (``pip install -e .``, or
``python3 hatch_build.py --labextension``) and Playwright for Python.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.browser.lab import (  # noqa: E402  (the checkout's own helpers, found from here)
    CHROMIUM,
    CHROMIUM_ARGS,
    WAIT_MS,
    jupyter_lab,
    open_notebook,
    run_cell,
)

NOTEBOOK = "02-the-view.ipynb"


def hover_a_mark(page, lane_index: int) -> None:
    """Move along a timeline lane until the pointer is over a mark, so the picture shows its hover."""
    canvas = page.locator(".jp-UvmLabView .jp-UvmLab-timelineCanvas")
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    y = box["y"] + 22 + 18 * lane_index + 9
    tooltip = page.locator(".jp-UvmLabView .jp-UvmLab-timeline .jp-UvmLab-hover")
    middle = int(box["x"] + 110 + (box["width"] - 110) / 2)
    for step in range(0, int(box["width"] / 2), 3):   # from the middle outwards: a hover in the picture's middle
        for x in (middle + step, middle - step):
            page.mouse.move(x, y)
            if tooltip.is_visible():
                return
    raise RuntimeError("no mark along the lane to hover")


def run(page, index: int, expect: str) -> None:
    """Run code cell ``index`` of the notebook until it prints ``expect``; stop, naming the error, where the cell
    shows one or prints to stderr."""
    try:
        run_cell(page, NOTEBOOK, index, expect)
    finally:
        stderr = page.locator(".jp-Notebook .jp-CodeCell").nth(index).locator(
            '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')   # errors render so too
        if stderr.count():
            lines = [line for line in stderr.first.inner_text().splitlines() if line.strip() and "---" not in line]
            raise SystemExit(f"screenshots: code cell {index} of {NOTEBOOK} showed an error, and no picture was "
                             f"written: {lines[-1] if lines else '(on stderr)'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images", help="where the pictures go")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, jupyter_lab(Path(tmp)) as (url, token, root), \
            sync_playwright() as playwright:
        shots = Path(tmp) / "shots"   # both pictures, then copied out together: never one new and one old
        shots.mkdir()
        shutil.copy(REPO / "notebooks" / NOTEBOOK, root / NOTEBOOK)
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 2000, "height": 1150}, device_scale_factor=1).new_page()
        open_notebook(page, url, token, NOTEBOOK)
        run(page, 0, "SimBackend")
        run(page, 1, "UVM Lab view")
        page.locator('.jp-UvmLabView[data-state="connected"]').wait_for(timeout=WAIT_MS)
        run(page, 2, "AccessResult")
        run(page, 3, "uvm_trace:")
        run(page, 4, "uvm_trace:")
        # The allocation that moved most, selected; the timeline's first lane hovered.
        page.locator(".jp-UvmLabView").get_by_label("Sort allocations").select_option("faults")
        page.locator(".jp-UvmLabView .jp-UvmLab-row").first.click()
        page.wait_for_timeout(1500)   # a few updates: the lanes and the timeline catch up
        page.locator(".jp-UvmLabView .jp-UvmLabView-main").evaluate("el => el.scrollTo(0, 0)")
        hover_a_mark(page, 0)
        page.screenshot(path=str(shots / "view.png"))
        # The sidebar panel, beside the notebook.
        page.locator('.jp-SideBar .lm-TabBar-tab[data-id="uvm-lab"]').click()
        page.locator(".jp-UvmLab:not(.jp-UvmLabView)").first.wait_for(timeout=WAIT_MS)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(shots / "panel.png"), clip={"x": 0, "y": 0, "width": 1000, "height": 800})
        browser.close()
        args.out.mkdir(parents=True, exist_ok=True)
        for shot in shots.iterdir():
            shutil.copy(shot, args.out / shot.name)
    print(f"wrote {args.out / 'view.png'} and {args.out / 'panel.png'}")


if __name__ == "__main__":
    main()
