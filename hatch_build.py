"""Build hook: compile the pool's free list (``uvm_lab/mr/_bestfit.c``) where a C compiler is present.

Without one the wheel is pure Python and the pool uses the same free list written in Python
(``uvm_lab.mr.bestfit.PyBestFit``), about twice as slow. ``UVM_LAB_PURE_PYTHON=1`` skips the compiler.
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

SOURCE = Path("uvm_lab") / "mr" / "_bestfit.c"


def compile_free_list(root: str | os.PathLike[str]) -> Path:
    """Compile the free list next to its source; raise ``OSError`` or ``CalledProcessError`` on failure."""
    source = Path(root) / SOURCE
    target = source.with_name("_bestfit" + sysconfig.get_config_var("EXT_SUFFIX"))
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
            target = compile_free_list(self.root)
        except (OSError, subprocess.CalledProcessError) as err:
            detail = getattr(err, "stderr", "") or err
            self.app.display_warning(f"uvm_lab: the pool's free list was not compiled ({detail}); "
                                     f"the Python one will be used")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["artifacts"].append(str(target.relative_to(self.root)))


if __name__ == "__main__":
    print(compile_free_list(Path(__file__).parent if len(sys.argv) < 2 else sys.argv[1]))
