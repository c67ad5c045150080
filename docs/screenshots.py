"""Make the README's screenshots from the notebooks, in a real JupyterLab and Debian's Chromium.

    python3 docs/screenshots.py          # writes docs/images/view.png and docs/images/panel.png

It runs ``notebooks/02-the-view.ipynb`` (a copy, in a temporary folder: the notebook in the checkout is not
touched) on the simulated GPU with the UVM Lab view open, hovers an event on the timeline, and takes the
pictures. Needs the built lab extension (``cd extension && jlpm build``) and Playwright for Python.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images", help="where the pictures go")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, jupyter_lab(Path(tmp)) as (url, token, root), \
            sync_playwright() as playwright:
        shutil.copy(REPO / "notebooks" / NOTEBOOK, root / NOTEBOOK)
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 2000, "height": 1150}, device_scale_factor=1).new_page()
        open_notebook(page, url, token, NOTEBOOK)
        run_cell(page, NOTEBOOK, 0, "SimBackend")
        run_cell(page, NOTEBOOK, 1, "UVM Lab view")
        page.locator('.jp-UvmLabView[data-state="connected"]').wait_for(timeout=WAIT_MS)
        run_cell(page, NOTEBOOK, 2, "AccessResult")
        run_cell(page, NOTEBOOK, 3, "uvm_trace:")
        run_cell(page, NOTEBOOK, 4, "uvm_trace:")
        # The allocation that moved most, selected; the timeline's first lane hovered.
        page.locator(".jp-UvmLabView").get_by_label("Sort allocations").select_option("faults")
        page.locator(".jp-UvmLabView .jp-UvmLab-row").first.click()
        page.wait_for_timeout(1500)   # a few updates: the lanes and the timeline catch up
        page.locator(".jp-UvmLabView .jp-UvmLabView-main").evaluate("el => el.scrollTo(0, 0)")
        hover_a_mark(page, 0)
        page.screenshot(path=str(args.out / "view.png"))
        # The sidebar panel, beside the notebook.
        page.locator('.jp-SideBar .lm-TabBar-tab[data-id="uvm-lab"]').click()
        page.locator(".jp-UvmLab:not(.jp-UvmLabView)").first.wait_for(timeout=WAIT_MS)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(args.out / "panel.png"), clip={"x": 0, "y": 0, "width": 1000, "height": 800})
        browser.close()
    print(f"wrote {args.out / 'view.png'} and {args.out / 'panel.png'}")


if __name__ == "__main__":
    main()
