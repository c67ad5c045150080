"""One JupyterLab server for every browser test, under a base URL, and one Chromium.

The server starts on a free localhost port with a token and ``--ServerApp.base_url=/uvm-lab-prefix/`` (so
every test also checks that the extension finds its kernel under a prefix), in a temporary root where each
test writes its notebooks; it loads this checkout's built extension. Debian's Chromium (never a downloaded
one) is driven by Playwright.
"""

from __future__ import annotations

import os

import pytest

from .lab import CHROMIUM, CHROMIUM_ARGS, LabError, jupyter_lab


def pytest_collection_modifyitems(items):
    if not CHROMIUM.exists():
        skip = pytest.mark.skip(reason=f"Debian's Chromium is not at {CHROMIUM} (apt-get install chromium); "
                                "the tests never download a browser")
        for item in items:
            if "browser" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """A JupyterLab server that loads this checkout's built extension; yields (url, token, root), the url
    with the base URL. The simulator's core is compiled first, as ``python -m uvm_lab`` does, so that no test's
    first cell waits for it."""
    from uvm_lab.backends.sim import prepare

    prepare()
    try:
        with jupyter_lab(tmp_path_factory.mktemp("lab")) as running:
            yield running
    except LabError as err:
        pytest.fail(str(err))


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
