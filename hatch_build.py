"""Build hook: compile the hot paths written in C where a C compiler is present.

- ``uvm_lab/mr/_pool.c``: the pool's free list and allocate/deallocate. Without it the pool runs every call
  in Python, with the same free list written in Python (``uvm_lab.mr.bestfit.PyBestFit``): about 4x slower a
  pair (``benchmarks/README.md``).
- ``uvm_lab/backends/sim/_prefetch.c``, ``_eviction.c`` and ``_records.c``: the simulator's density prefetcher,
  batch by batch, a run of evictions, and the records of copies and faults. Without them the numpy and Python versions beside them give the same pages and
  times, more slowly. ``-ffp-contract=off``: no fused multiply-add, so a float sum is the one Python makes.

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
SOURCES = (Path("uvm_lab") / "mr" / "_pool.c", SIM / "_prefetch.c", SIM / "_eviction.c", SIM / "_records.c")


def compile_extension(root: str | os.PathLike[str], source: Path) -> Path:
    """Compile one source next to itself; raise ``OSError`` or ``CalledProcessError`` on failure."""
    source = Path(root) / source
    target = source.with_name(source.stem + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    subprocess.run([*cc, "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-I", include, str(source), "-o", str(target)],
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
        for source in SOURCES:
            try:
                target = compile_extension(self.root, source)
            except (OSError, subprocess.CalledProcessError) as err:
                detail = getattr(err, "stderr", "") or err
                self.app.display_warning(f"uvm_lab: {source} was not compiled ({detail}); its Python twin will run")
                continue
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            build_data["artifacts"].append(str(target.relative_to(self.root)))


if __name__ == "__main__":
    root = Path(__file__).parent if len(sys.argv) < 2 else Path(sys.argv[1])
    for source in SOURCES:
        print(compile_extension(root, source))
