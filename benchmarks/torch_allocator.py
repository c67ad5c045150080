"""torch's CUDA allocations through uvm_lab, against torch's own caching allocator and RMM's torch allocator.

Each (allocator, workload) runs in a process of its own, since torch takes one allocator per process. The
allocators:

- ``torch``: torch's caching allocator (device memory), the baseline;
- ``uvm_lab``: ``change_current_allocator(uvm_lab_torch_allocator)`` over a ``PoolMemoryResource`` of managed
  memory, while a trace records every event (``ul.record()``);
- ``uvm_lab_quiet``: the same, with no trace recording;
- ``uvm_lab_mempool``: a ``torch.cuda.MemPool`` whose segments come from uvm_lab's managed memory, torch's
  caching allocator in front, with the trace recording;
- ``rmm``: RMM's ``rmm_torch_allocator`` over RMM's ``PoolMemoryResource`` of managed memory (where rmm is
  installed; the GPU machine takes it from ``.whl/``).

The workloads:

- ``pairs``: ``torch.empty`` then ``del``, 4 KiB and 1 MiB, pairs a second;
- ``train_small`` and ``train_large``: an MLP's forward, backward and AdamW step (hidden width 512 at batch 64,
  and 4096 at batch 512), milliseconds a step, the median of rounds;
- ``seed000``: seed 000's larger-than-VRAM example (RMM's managed-memory guide), ``randn(n, n)`` and
  ``x @ x.T``, with the guide's ``PrefetchResourceAdaptor`` and without, for uvm_lab and RMM. ``n`` is chosen so
  that both matrices take at most a quarter of the card's free memory: never more managed memory than is free.

    python benchmarks/torch_allocator.py [--workloads pairs,train_small,train_large,seed000] [--repeats 3]
                                         [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOCATORS = ("torch", "uvm_lab", "uvm_lab_quiet", "uvm_lab_mempool", "rmm")
MiB = 1 << 20


# -- in the child ---------------------------------------------------------------------------------------------
def _setup(allocator: str, prefetch: bool = False, pool_size: int = 1 << 30, maximum: int | None = None):
    """Make ``allocator`` torch's; return a context to run the workload in."""
    import contextlib

    import torch

    if allocator.startswith("uvm_lab"):
        sys.path.insert(0, str(ROOT))
        import uvm_lab as ul
        from uvm_lab.allocators import torch as ta
        from uvm_lab.mr import (
            ManagedMemoryResource,
            PoolMemoryResource,
            PrefetchResourceAdaptor,
            set_current_device_resource,
        )

        ul.use_backend("cuda", watch=False)
        context = ul.record(limit=1 << 22) if allocator != "uvm_lab_quiet" else contextlib.nullcontext()
        if allocator == "uvm_lab_mempool":
            pool = ta.mem_pool()
            stack = contextlib.ExitStack()
            stack.enter_context(context)
            stack.enter_context(torch.cuda.use_mem_pool(pool))
            stack.pool = pool   # kept alive with the context
            return stack
        mr = PoolMemoryResource(ManagedMemoryResource(), initial_pool_size=pool_size, maximum_pool_size=maximum)
        set_current_device_resource(PrefetchResourceAdaptor(mr) if prefetch else mr)
        torch.cuda.memory.change_current_allocator(ta.uvm_lab_torch_allocator)
        return context
    if allocator == "rmm":
        import rmm
        from rmm.allocators.torch import rmm_torch_allocator

        mr = rmm.mr.PoolMemoryResource(rmm.mr.ManagedMemoryResource(), initial_pool_size=pool_size,
                                       maximum_pool_size=maximum)
        rmm.mr.set_current_device_resource(rmm.mr.PrefetchResourceAdaptor(mr) if prefetch else mr)
        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    return contextlib.nullcontext()


def _pairs(n: int) -> dict:
    import torch

    result = {}
    for size in (4096, MiB):
        for _ in range(200):   # warm: the pools hold their first blocks
            t = torch.empty(size, dtype=torch.uint8, device="cuda")
            del t
        start = time.perf_counter()
        for _ in range(n):
            t = torch.empty(size, dtype=torch.uint8, device="cuda")
            del t
        result[f"{size // 1024} KiB pairs/s"] = n / (time.perf_counter() - start)
    torch.cuda.synchronize()
    return result


def _train(width: int, batch: int, steps: int, rounds: int) -> dict:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 16)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device="cuda")
    y = torch.randn(batch, 16, device="cuda")

    def step() -> None:
        opt.zero_grad(set_to_none=True)   # gradients are allocated again each step, as by default
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / steps * 1e3)
    return {"ms/step": statistics.median(times), "rounds": times}


def _seed000(allocator: str, n: int, prefetch: bool) -> dict:
    import torch

    need = 2 * 4 * n * n
    with _setup(allocator, prefetch=prefetch, pool_size=need + (256 << 20), maximum=need + (1 << 30)):
        start = time.perf_counter()
        large = torch.randn(n, n, device="cuda")
        result = large @ large.T
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        check = float(result[0, 0])
        del large, result
    return {"s": elapsed, "check": check}


def child(args: argparse.Namespace) -> None:
    if args.workload == "seed000":
        out = _seed000(args.allocator, args.n, args.prefetch)
    else:   # the other workloads one after another, in one process under one allocator, set up once
        out = {}
        with _setup(args.allocator):
            for workload in args.workload.split(","):
                if workload == "pairs":
                    out[workload] = _pairs(args.pairs)
                else:
                    width, batch = (512, 64) if workload == "train_small" else (4096, 512)
                    out[workload] = _train(width, batch, args.steps, args.rounds)
    print(json.dumps(out))


# -- the parent -------------------------------------------------------------------------------------------------
def _run(allocator: str, workload: str, args: argparse.Namespace, prefetch: bool = False) -> dict | None:
    cmd = [sys.executable, __file__, "--child", "--allocator", allocator, "--workload", workload,
           "--pairs", str(args.pairs), "--steps", str(args.steps), "--rounds", str(args.rounds), "--n", str(args.n)]
    if prefetch:
        cmd.append("--prefetch")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                                        os.environ.get("PYTHONPATH")]))})
    if done.returncode:
        print(f"  {allocator} {workload}: failed\n{done.stderr[-1500:]}", flush=True)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(outs: list[dict]) -> dict:
    """The median, key by key, of one workload's results from several processes."""
    return {key: statistics.median(out[key] for out in outs) for key in outs[0] if key != "rounds"}


def _rmm_here() -> bool:
    try:
        import rmm  # noqa: F401
    except ImportError:
        return False
    return True


def _matrix_side() -> int:
    """The largest n (a multiple of 1024) whose two n x n float32 matrices take at most a quarter of free memory."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    n = int((free / 4 / 8) ** 0.5) // 1024 * 1024
    return min(n, 32768)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="pairs,train_small,train_large,seed000")
    parser.add_argument("--allocators", default=",".join(ALLOCATORS))
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of --steps in a process (median)")
    parser.add_argument("--repeats", type=int, default=3, help="processes per allocator, interleaved (median)")
    parser.add_argument("--n", type=int, default=0, help="seed000's matrix side (0: from the free memory)")
    parser.add_argument("--json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--allocator", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--prefetch", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    import torch

    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}; free/total "
          f"{[f'{v / 2**30:.1f} GiB' for v in torch.cuda.mem_get_info()]}", flush=True)
    allocators = [a for a in args.allocators.split(",") if a != "rmm" or _rmm_here()]
    workloads = args.workloads.split(",")
    results: dict = {}
    steady = [w for w in workloads if w != "seed000"]
    if steady:
        # Each allocator in a process of its own, the processes interleaved, --repeats times: the host's drift
        # between processes falls on every allocator alike. Each figure is the median over the processes.
        runs: dict[str, list[dict]] = {a: [] for a in allocators}
        for repeat in range(args.repeats):
            for allocator in allocators:
                out = _run(allocator, ",".join(steady), args)
                if out:
                    runs[allocator].append(out)
                print(f"  repeat {repeat} {allocator}: {out}", flush=True)
        for workload in steady:
            for allocator, outs in runs.items():
                results.setdefault(workload, {})[allocator] = _median([o[workload] for o in outs]) if outs else None
    if "seed000" in workloads:
        args.n = args.n or _matrix_side()
        print(f"seed000: n = {args.n} ({2 * 4 * args.n**2 / 2**30:.1f} GiB of managed memory)", flush=True)
        for allocator in [a for a in allocators if a in ("uvm_lab", "rmm")]:
            for prefetch in (False, True):
                key = f"{allocator}{' prefetch' if prefetch else ''}"
                results.setdefault("seed000", {})[key] = out = _run(allocator, "seed000", args, prefetch)
                print(f"  seed000 {key}: {out}", flush=True)
    _table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def _table(results: dict) -> None:
    for workload, by in results.items():
        if workload.startswith("train"):
            base = (by.get("torch") or {}).get("ms/step")
            print(f"\n{workload}: ms/step (ratio to torch's caching allocator)")
            for allocator, out in by.items():
                if out:
                    ratio = f"{out['ms/step'] / base:.3f}x" if base else "-"
                    print(f"  {allocator:16} {out['ms/step']:8.3f}  {ratio}")
        elif workload == "pairs":
            print("\npairs: torch.empty + del a second (ratio to torch's caching allocator)")
            base = by.get("torch") or {}
            for allocator, out in by.items():
                if out:
                    cells = [f"{key} {value:12,.0f}" + (f" ({value / base[key]:.3f}x)" if base.get(key) else "")
                             for key, value in out.items()]
                    print(f"  {allocator:16} " + "  ".join(cells))
        else:
            print(f"\n{workload}: seconds for randn + matmul")
            for key, out in by.items():
                if out:
                    print(f"  {key:18} {out['s']:8.3f}")


if __name__ == "__main__":
    main()
