"""``python -m uvm_lab [FOLDER] [jupyter lab options]``: open the workbench in JupyterLab.

Notebooks pick their device themselves: the real GPU where one is usable, the simulated one elsewhere.
SIGINT, SIGTERM or SIGHUP stops JupyterLab cleanly (its kernels with it), and uvm_lab exits with its status.
"""

from __future__ import annotations

import os
import signal
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
    prepare_simulator()
    return run_until_stopped([sys.executable, "-m", "jupyterlab", folder, *args])


def prepare_simulator() -> None:
    """Compile the simulated device's core before JupyterLab starts, so that a notebook's first cell does not wait
    for it; saying so where it takes a while (the first time, about half a minute)."""
    import threading

    from .backends.sim import prepare

    done = threading.Thread(target=prepare, daemon=True)
    done.start()
    done.join(1.0)
    if done.is_alive():
        print("uvm_lab: compiling the simulated device's core (once; numba keeps it) ...", file=sys.stderr, flush=True)
        done.join()


# What stops the workbench. JupyterLab stops cleanly on SIGTERM; on SIGINT it would ask first.
_STOPS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def run_until_stopped(command: list[str]) -> int:
    """Run ``command``; a stop signal sent to this process reaches it as SIGTERM (a second one as SIGKILL), and
    its exit status is returned (128 + the signal's number where a signal ended it, as a shell reports it)."""
    child = subprocess.Popen(command)
    signals_seen = 0

    def forward(signum: int, frame: object) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if child.poll() is None:
            child.send_signal(signal.SIGTERM if signals_seen == 1 else signal.SIGKILL)

    previous = {signum: signal.signal(signum, forward) for signum in _STOPS}
    try:
        code = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
