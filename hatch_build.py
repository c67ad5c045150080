"""Build hook: compile the pool's free list and hot path (``uvm_lab/mr/_pool.c``) where a C compiler is present.

Without one the wheel is pure Python and the pool runs every call in Python, with the same free list
written in Python (``uvm_lab.mr.bestfit.PyBestFit``): about 4x slower a pair (``benchmarks/README.md``).
``UVM_LAB_PURE_PYTHON=1`` skips the compiler.
``python hatch_build.py`` compiles it in place, for a checkout that is used without installing.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

SOURCE = Path("uvm_lab") / "mr" / "_pool.c"


def compile_pool(root: str | os.PathLike[str]) -> Path:
    """Compile the pool next to its source; raise ``OSError`` or ``CalledProcessError`` on failure."""
    source = Path(root) / SOURCE
    target = source.with_name("_pool" + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    subprocess.run([*cc, "-O2", "-shared", "-fPIC", "-I", include, str(source), "-o", str(target)],
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
        try:
            target = compile_pool(self.root)
        except (OSError, subprocess.CalledProcessError) as err:
            detail = getattr(err, "stderr", "") or err
            self.app.display_warning(f"uvm_lab: the pool was not compiled ({detail}); "
                                     f"it will run in Python")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["artifacts"].append(str(target.relative_to(self.root)))


if __name__ == "__main__":
    print(compile_pool(Path(__file__).parent if len(sys.argv) < 2 else sys.argv[1]))
