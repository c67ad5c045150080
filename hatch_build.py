"""Build hook: compile the hot paths written in C where a C compiler is present.

- ``uvm_lab/events/_sources.c``: the walk to the calling user line, cached, that every event's ``source`` comes
  from; the pool's hot path calls it directly. Without it the same walk runs in Python
  (``uvm_lab.events.sources``), and the pool below is not compiled either.
- ``uvm_lab/mr/_pool.c``: the pool's free list and allocate/deallocate. Without it the pool runs every call
  in Python, with the same free list written in Python (``uvm_lab.mr.bestfit.PyBestFit``): about 4x slower a
  pair (``benchmarks/README.md``).
- ``uvm_lab/backends/sim/_simcore``, from ``_access.c``, ``_prefetch.c``, ``_eviction.c``, ``_records.c``,
  ``_service.c`` and ``_run.c``: which accesses proceed, the simulator's density prefetcher, a run of evictions,
  the records of copies and faults, a plain fault batch, whole, and a stream's run of them. Without it
  the numpy and Python code beside it gives the same pages, records and times, more slowly.
  ``-ffp-contract=off``: no fused multiply-add, so a float sum is the one Python makes.

``UVM_LAB_PURE_PYTHON=1`` skips the compiler. ``python hatch_build.py`` compiles them in place, for a checkout
that is used without installing.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

SIM = Path("uvm_lab") / "backends" / "sim"
_SIMCORE = ("_access", "_prefetch", "_eviction", "_records", "_service", "_run", "_simcore")
#: Each extension module, and the C files it is built from.
EXTENSIONS = {
    Path("uvm_lab") / "events" / "_sources": (Path("uvm_lab") / "events" / "_sources.c",),
    Path("uvm_lab") / "mr" / "_pool": (Path("uvm_lab") / "mr" / "_pool.c",),
    SIM / "_simcore": tuple(SIM / f"{name}.c" for name in _SIMCORE),
}


def compile_extension(root: str | os.PathLike[str], module: Path) -> Path:
    """Compile one extension module next to its sources; raise ``OSError`` or ``CalledProcessError`` on failure."""
    root = Path(root)
    target = (root / module).with_name(module.name + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    sources = [str(root / source) for source in EXTENSIONS[module]]
    subprocess.run([*cc, "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-I", include, *sources, "-o", str(target)],
                   check=True, capture_output=True, text=True)
    return target


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:   # compiling by hand, without hatchling
    BuildHookInterface = object  # type: ignore[misc,assignment]


class CustomBuildHook(BuildHookInterface):  # type: ignore[misc,valid-type]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("UVM_LAB_PURE_PYTHON"):
            return
        for module in EXTENSIONS:
            try:
                target = compile_extension(self.root, module)
            except (OSError, subprocess.CalledProcessError) as err:
                detail = getattr(err, "stderr", "") or err
                self.app.display_warning(f"uvm_lab: {module} was not compiled ({detail}); its Python twin will run")
                continue
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            build_data["artifacts"].append(str(target.relative_to(self.root)))


if __name__ == "__main__":
    root = Path(__file__).parent if len(sys.argv) < 2 else Path(sys.argv[1])
    for module in EXTENSIONS:
        print(compile_extension(root, module))
