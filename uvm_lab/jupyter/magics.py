"""``%uvm`` and ``%%uvm_trace``: thin magics over the library.

::

    %uvm status                      backend, device memory, live allocations and their residency
    %uvm dashboard [--close]         the widget dashboard (ipywidgets + bokeh)
    %uvm view                        open the UVM Lab view in JupyterLab's main area
    %uvm resource                    the current device resource chain, top first
    %uvm resource pool --pool-size 1GiB --prefetch
                                     set a simple one: managed | cuda | pool, optionally wrapped
    %uvm tracing [on|off] [--gpu-faults]
                                     real faults and migrations from CUPTI on a GPU (say whether it is on)
    %%uvm_trace [-o NAME] [-q]       run the cell inside ul.record() and print what happened

Bad input raises IPython's ``UsageError`` naming the bad value and what is valid.
"""

from __future__ import annotations

import argparse
import ast
import shlex
from typing import Any, NoReturn

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.units import parse_size

from .dashboard.collect import collect_snapshot
from .dashboard.text import format_status, format_top_sources, format_trace_summary

__all__ = ["RESOURCE_KINDS", "VIEW_MIME_TYPE", "UvmMagics"]

#: What ``%uvm view`` outputs: the lab extension renders it by opening its main-area view. Twin of
#: ``VIEW_MIME_TYPE`` in ``extension/src/index.ts``.
VIEW_MIME_TYPE = "application/vnd.uvm-lab.view+json"

#: ``%uvm resource KIND``: what each kind builds (the bottom of the chain).
RESOURCE_KINDS = {
    "managed": "ManagedMemoryResource(): unified memory, migrates page by page",
    "cuda": "CudaMemoryResource(): plain device memory (cudaMalloc), never migrates",
    "pool": "PoolMemoryResource(ManagedMemoryResource()): a pool suballocating managed memory",
}


class _HelpShown(Exception):
    """argparse printed help (``-h``) and would have exited."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises UsageError instead of exiting the kernel."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            print(message)
        raise _HelpShown


def _uvm_parser() -> _Parser:
    parser = _Parser(prog="%uvm", description="uvm_lab: see and steer CUDA unified memory.")
    sub = parser.add_subparsers(dest="command", metavar="{status,dashboard,view,resource,tracing}")
    sub.add_parser("status", help="backend, device memory, live allocations with residency, event counters")
    dash = sub.add_parser("dashboard", help="show the widget dashboard")
    dash.add_argument("--close", action="store_true", help="close the dashboard and stop its updates")
    sub.add_parser("view", help="open the UVM Lab view (device lanes, timeline, page maps, controls) in JupyterLab")
    res = sub.add_parser("resource", help="print the current device resource chain, or set a simple one",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="kinds:\n" + "\n".join(f"  {k:<9}{v}" for k, v in RESOURCE_KINDS.items()))
    res.add_argument("kind", nargs="?", choices=list(RESOURCE_KINDS), help="set a new current device resource")
    res.add_argument("--pool-size", metavar="SIZE", help='initial pool size for "pool", e.g. 1GiB')
    res.add_argument("--prefetch", action="store_true",
                     help="wrap in PrefetchResourceAdaptor: new buffers are prefetched to the GPU")
    res.add_argument("--statistics", action="store_true", help="wrap in StatisticsResourceAdaptor (outermost)")
    tracing = sub.add_parser("tracing", help="CUPTI's real faults and migrations on a GPU: on, off, or say which")
    tracing.add_argument("state", nargs="?", choices=["on", "off"], help="start or stop the CUPTI collector")
    tracing.add_argument("--gpu-faults", action="store_true",
                         help="also record GPU page faults (more records, more overhead)")
    return parser


def _trace_parser() -> _Parser:
    parser = _Parser(prog="%%uvm_trace", description="Run the cell inside ul.record() and summarise its events.")
    parser.add_argument("-o", "--out", metavar="NAME", help="store the Trace in the user namespace as NAME")
    parser.add_argument("-q", "--quiet", action="store_true", help="print no summary")
    return parser


def _parse(parser: _Parser, line: str) -> argparse.Namespace | None:
    try:
        argv = shlex.split(line)
    except ValueError as err:
        raise UsageError(f"{parser.prog}: cannot parse {line!r}: {err}") from None
    try:
        return parser.parse_args(argv)
    except _HelpShown:
        return None


def _size(text: str, option: str) -> int:
    try:
        return parse_size(text, name=option)
    except InvalidArgumentError as err:
        raise UsageError(f"%uvm resource: {err}") from None


def build_resource(kind: str, *, pool_size: str | None = None, prefetch: bool = False,
                   statistics: bool = False) -> Any:
    """The resource ``%uvm resource KIND [...]`` sets, built with the public ``ul.mr`` classes."""
    if kind not in RESOURCE_KINDS:
        raise UsageError(f"%uvm resource: unknown kind {kind!r}; valid kinds: {', '.join(RESOURCE_KINDS)}")
    if pool_size is not None and kind != "pool":
        raise UsageError(f"%uvm resource: --pool-size applies only to kind 'pool', not {kind!r}")
    if prefetch and kind == "cuda":
        raise UsageError("%uvm resource: --prefetch needs managed memory (kind 'managed' or 'pool'), "
                         "but 'cuda' device memory never migrates")
    size = _size(pool_size, "--pool-size") if pool_size is not None else None
    mr: Any
    try:
        if kind == "managed":
            mr = ul.mr.ManagedMemoryResource()
        elif kind == "cuda":
            mr = ul.mr.CudaMemoryResource()
        else:
            mr = ul.mr.PoolMemoryResource(ul.mr.ManagedMemoryResource(), initial_pool_size=size)
        if prefetch:
            mr = ul.mr.PrefetchResourceAdaptor(mr)
        if statistics:
            mr = ul.mr.StatisticsResourceAdaptor(mr)
    except InvalidArgumentError as err:  # e.g. a pool size the resource refuses
        raise UsageError(f"%uvm resource: {err}") from None
    return mr


def format_chain(mr: Any) -> str:
    chain = ul.mr.resource_chain(mr)
    lines = ["current device resource (top first):"]
    for i, r in enumerate(chain, 1):
        note = ""
        if i == len(chain):
            note = "  <- allocates managed memory" if r.is_managed else "  <- allocates device memory"
        lines.append(f"  {i}. {type(r).__name__}{note}")
    return "\n".join(lines)


@magics_class
class UvmMagics(Magics):
    """The ``%uvm`` line magic and the ``%%uvm_trace`` cell magic."""

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self.dashboard: Any = None
        self.collector: Any = None       # the CuptiCollector that %uvm tracing on started
        self._uvm_parser = _uvm_parser()
        self._trace_parser = _trace_parser()

    @property
    def _shell(self) -> Any:
        if self.shell is None:
            raise UsageError("uvm_lab's magics need an IPython shell")
        return self.shell

    @line_magic
    def uvm(self, line: str) -> None:
        """uvm_lab: ``%uvm status | dashboard | resource [KIND]``; ``%uvm -h`` for help."""
        args = _parse(self._uvm_parser, line)
        if args is None:
            return
        if args.command is None:
            self._uvm_parser.print_help()
            return
        getattr(self, f"_{args.command}")(args)

    def _status(self, args: argparse.Namespace) -> None:
        print(format_status(collect_snapshot()))

    def _dashboard(self, args: argparse.Namespace) -> None:
        from IPython.display import display

        if args.close:
            self.close_dashboard()
            return
        if self.dashboard is None or self.dashboard.closed:
            from .dashboard.dashboard import Dashboard

            self.dashboard = Dashboard()
        display(self.dashboard)

    def _view(self, args: argparse.Namespace) -> None:
        from IPython.display import display

        # Outside JupyterLab (or without the extension) only the text shows: it says what to do instead.
        display({VIEW_MIME_TYPE: {}, "text/plain": "UVM Lab view: open it in JupyterLab with the command "
                 "palette's \"Open the UVM Lab View\" (needs the uvm-lab lab extension)."}, raw=True)

    def close_dashboard(self) -> None:
        if self.dashboard is not None:
            self.dashboard.close()
            self.dashboard = None

    def _resource(self, args: argparse.Namespace) -> None:
        if args.kind is None:
            if args.pool_size is not None or args.prefetch or args.statistics:
                raise UsageError("%uvm resource: --pool-size, --prefetch and --statistics need a KIND; "
                                 f"valid kinds: {', '.join(RESOURCE_KINDS)}")
        else:
            mr = build_resource(args.kind, pool_size=args.pool_size, prefetch=args.prefetch,
                                statistics=args.statistics)
            ul.mr.set_current_device_resource(mr)
        print(format_chain(ul.mr.get_current_device_resource()))

    def _tracing(self, args: argparse.Namespace) -> None:
        if args.gpu_faults and args.state != "on":
            raise UsageError("%uvm tracing: --gpu-faults goes with 'on'")
        if args.state == "off":
            self.stop_tracing()
        elif args.state == "on":
            if ul.get_backend().is_simulated:
                print("The simulated device publishes its faults and migrations itself; CUPTI tracing is for a "
                      "GPU (ul.use_backend('cuda')).")
                return
            from uvm_lab.tracing import CuptiCollector

            self.stop_tracing()
            # Inert, with the reason given once as a warning, where CUPTI cannot be used here.
            self.collector = CuptiCollector(gpu_faults=args.gpu_faults).start()
        print(self._tracing_state())

    def _tracing_state(self) -> str:
        collector = self.collector
        if collector is None or not collector.running:
            reason = f" ({collector.reason})" if collector is not None and collector.reason else ""
            return f"CUPTI tracing is off{reason}."
        status = collector.status()
        line = (f"CUPTI tracing is on: counters {', '.join(status['counters'])}; {status['records']} records so far, "
                f"{status['dropped']} dropped.")
        return line + (f" Warning: {status['warning']}" if status["warning"] else "")

    def stop_tracing(self) -> None:
        if self.collector is not None:
            self.collector.stop()
            self.collector = None

    @cell_magic
    def uvm_trace(self, line: str, cell: str) -> Any:
        """Run the cell inside ``ul.record()``; print counts per kind, bytes moved, faults and time taken.

        ``-o NAME`` stores the :class:`Trace` as ``NAME``; ``-q`` prints nothing. The value of the
        cell's last expression is returned, so it displays as usual.
        """
        args = _parse(self._trace_parser, line)
        if args is None:
            return None
        if args.out is not None and not args.out.isidentifier():
            raise UsageError(f"%%uvm_trace: -o needs a Python name, got {args.out!r}")
        trace = None
        try:
            with ul.record() as trace:
                return self._run_cell(cell)
        finally:
            # Also when the cell raised: what it did before the error is in the trace.
            if trace is not None:
                if args.out is not None:
                    self._shell.user_ns[args.out] = trace
                if not args.quiet:
                    name = ul.get_backend().name
                    print(format_trace_summary(trace.summary(), clock="simulated" if name == "sim" else name))
                    print(format_top_sources(trace.by_source()))

    def _run_cell(self, cell: str) -> Any:
        # As %%time does: IPython's transforms, then exec, evaluating a trailing expression for display.
        shell = self._shell
        source = shell.transform_cell(cell)
        tree = shell.transform_ast(shell.compile.ast_parse(source))
        # Compiled under a name IPython knows as this cell, with the magic's own line counted, so that events
        # (and tracebacks) name the cell and the line as the notebook shows them.
        name = shell.compile.cache(source, shell.execution_count, raw_code=cell)
        ast.increment_lineno(tree, 1)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, name, "exec"), shell.user_ns)
        if last is not None:
            return eval(compile(last, name, "eval"), shell.user_ns)
        return None
