"""``python -m uvm_lab [FOLDER] [jupyter lab options]``: open the workbench in JupyterLab.

Notebooks pick their device themselves: the real GPU where one is usable, the simulated one elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    folder = args.pop(0) if args and not args[0].startswith("-") else "."
    if not Path(folder).is_dir():
        print(f"uvm_lab: {folder!r} is not a folder; give the folder to open, for example notebooks/", file=sys.stderr)
        return 2
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in args:
        args.append("--allow-root")   # containers and CI machines often run as root; JupyterLab refuses without it
    return subprocess.call([sys.executable, "-m", "jupyterlab", folder, *args])


if __name__ == "__main__":
    sys.exit(main())
