#!/usr/bin/env bash
# Install uvm_lab with its test dependencies, and Debian's Chromium for the browser tests; lint (ruff) and
# check types (mypy, with pyproject.toml's configuration), then run the whole suite, which must leave the checkout
# as it found it. Extra arguments go to pytest (for example: bash tests/run.sh -m "not browser").
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x /usr/bin/chromium ]; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1   # the tests drive /usr/bin/chromium, never a downloaded browser
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
python3 -m ruff check .
python3 -m mypy
# No test may change the checkout: the state of every tracked and untracked (not ignored) file, before and after.
checkout() { git status --porcelain 2>/dev/null; git diff 2>/dev/null | sha256sum; }
before=$(checkout)
python3 -m pytest "$@"
if [ "$(checkout)" != "$before" ]; then
    echo "the tests changed the checkout (git status):" >&2; git status --short >&2; exit 1
fi
