"""Scripted experiments: one workload over a grid of configurations, repeated, as a table.

>>> import uvm_lab as ul
>>> result = ul.compare("multi_pass_stream", {"policy": ["faults", "prefetch"]}, size="64MiB", passes=2,
...                     device_memory="1GiB", progress=False)
>>> list(result.summary["policy"])
['faults', 'prefetch']

The workload is a catalog name (:data:`uvm_lab.workloads.WORKLOADS`, its parameters given as keywords or in the
grid), a :class:`~uvm_lab.workloads.Workload`, or a function of the user's that uses uvm_lab buffers, called with
the grid's values it names as keywords. The grid maps a name to the values to try; every combination is one
configuration. Besides the workload's own parameters, the grid (or a keyword, for one value) takes:

``policy``
    How data reaches the GPU (:data:`uvm_lab.workloads.POLICIES`): faults, prefetch, read_mostly, remote; or the
    prefetch strategy with an advice, "prefetch+read_mostly" or "prefetch+remote".
``prefetch`` and ``advice``
    The policy's two parts as two names, to cross them: ``prefetch`` "none" or "chunked" (each chunk moved ahead of
    the kernel), ``advice`` "none", "read_mostly" or "remote". Not with ``policy``.
``resource``
    For a function: the resource chain its buffers come from, made the current device resource on each
    configuration's device (:mod:`uvm_lab.mr.chain`: ``"managed"``, ``"pool(managed)"``,
    ``"prefetch(pool(managed))"`` ...). A function that takes ``resource`` itself gets the value instead.
``device_memory`` or ``oversubscription``
    The simulated GPU's memory, as a size or as the workload's bytes over it (1.5: half as much again as fits).
``platform``
    The simulated platform's profile (:data:`uvm_lab.backends.sim.platform.PLATFORMS`).
``prefetch_chunk``
    What the prefetch policy moves ahead of each part of a kernel.
``on``
    ``"sim"``, ``"gpu"`` or ``"auto"`` (the GPU where there is one). A real GPU is never oversubscribed: a
    configuration that would be, or that names a device memory the card does not have, runs on the simulator
    only, and its rows say so (``ran_on`` and ``note``).

Every configuration runs once before any runs again, so a time budget that stops the experiment early leaves
each configuration measured as often as the others, within one; what the budget left out is counted
(:attr:`Experiment.skipped`) and shown.
"""

from __future__ import annotations

import inspect
import itertools
import json
import math
import platform as host_platform
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from . import experiment_feed
from .backends import get_backend, has_backend, using_backend
from .backends.sim import SimBackend
from .backends.sim.platform import get_platform
from .clock import SYSTEM_CLOCK, Clock, checked_clock
from .errors import BackendError, InvalidArgumentError, shown
from .mr import get_current_device_resource, set_current_device_resource
from .mr.chain import build_chain, check_chain
from .units import format_bytes, parse_size
from .workloads import WORKLOADS, PhaseResult, Workload, gpu_available, make, parse_policy, run_gpu, run_sim
from .workloads.gpu import MAX_FRACTION_OF_FREE
from .workloads.sim import MigrationCounter

__all__ = ["ADVICE_POLICIES", "PREFETCH_STRATEGIES", "RUNNER_PARAMETERS", "Experiment", "compare", "load"]

#: The parameters the experiment itself reads (the rest are the workload's).
RUNNER_PARAMETERS = ("policy", "prefetch", "advice", "resource", "device_memory", "oversubscription", "platform",
                     "prefetch_chunk", "on")
#: The ``prefetch`` and ``advice`` names' values: a policy's two parts (:func:`uvm_lab.workloads.parse_policy`).
PREFETCH_STRATEGIES = ("none", "chunked")
ADVICE_POLICIES = ("none", "read_mostly", "remote")
_DEFAULTS = {"policy": "faults", "platform": "x86-pcie5", "prefetch_chunk": "256MiB", "on": "sim"}
_SIM_DEVICE_MEMORY = "16GiB"   # run_sim's, where a configuration names none
_FORMAT = 1                    # the saved file's layout
#: What a run measured that sums over its passes (missing where nothing measured it).
_COUNTS = ("bytes_htod", "bytes_dtoh", "bytes_evicted", "bytes_remote", "faults")


@dataclass
class Experiment:
    """What an experiment measured: one row per configuration, repeat and pass (:attr:`passes`), with the
    runs (:attr:`runs`) and the configurations (:attr:`summary`) made from them."""

    passes: pd.DataFrame
    parameters: list[str]                       #: the configuration's columns, in the grid's order
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def skipped(self) -> int:
        """Runs the time budget left out."""
        return int(self.metadata.get("skipped", 0))

    @property
    def runs(self) -> pd.DataFrame:
        """One row per configuration and repeat: the passes' times, bytes and faults summed."""
        keys = [*self.parameters, "repeat", "ran_on", "note"]
        sums = ["seconds", "bytes", *_COUNTS]
        runs = self.passes.groupby(keys, sort=False, dropna=False)[sums].sum(min_count=1).reset_index()
        runs["gb_per_s"] = runs["bytes"] / runs["seconds"] / 1e9
        return runs

    @property
    def summary(self) -> pd.DataFrame:
        """One row per configuration: the median over repeats, and their spread (``seconds_min``,
        ``seconds_max``, and ``spread``, the range over the median)."""
        runs = self.runs
        keys = [*self.parameters, "ran_on", "note"]
        grouped = runs.groupby(keys, sort=False, dropna=False)
        out = grouped[["seconds", *_COUNTS, "gb_per_s"]].median()
        out["seconds_min"] = grouped["seconds"].min()
        out["seconds_max"] = grouped["seconds"].max()
        out["spread"] = (out["seconds_max"] - out["seconds_min"]) / out["seconds"]
        out["repeats"] = grouped["repeat"].count()
        return out.reset_index()

    def plot(self, y: str = "seconds") -> Any:
        """A bokeh figure of ``y`` (a column of :attr:`summary`) per configuration, with each one's range over
        repeats where ``y`` is seconds. Show it with ``bokeh.io.show``."""
        from bokeh.models import BasicTickFormatter, ColumnDataSource, FactorRange, HoverTool
        from bokeh.models.annotations import Whisker
        from bokeh.plotting import figure

        summary = self.summary
        if y not in summary.columns:
            raise InvalidArgumentError(f"no column {y!r} to plot; the summary's columns are "
                                       f"{', '.join(summary.columns)}", value=y, expected="a column of summary")
        names = [" / ".join(str(row[p]) for p in self.parameters) or "run" for _, row in summary.iterrows()]
        source = ColumnDataSource({"name": names, "y": summary[y].astype(float),
                                   "lo": summary["seconds_min"], "hi": summary["seconds_max"],
                                   "ran_on": summary["ran_on"]})
        # As wide as where it is shown (a notebook's output, the lab view's frame); plain numbers on the axis.
        fig = figure(y_range=FactorRange(factors=names[::-1]), height=60 + 28 * len(names), sizing_mode="stretch_width",
                     x_axis_label=y, title=f"{self.metadata.get('workload', '')}: {y} (median of repeats)",
                     toolbar_location=None)
        fig.xaxis.formatter = BasicTickFormatter(use_scientific=False)
        fig.hbar(y="name", right="y", height=0.6, source=source)
        if y == "seconds":
            fig.add_layout(Whisker(source=source, base="name", lower="lo", upper="hi", dimension="width"))
        fig.add_tools(HoverTool(tooltips=[("configuration", "@name"), (y, "@y"), ("ran on", "@ran_on")]))
        return fig

    def to_html(self, y: str = "seconds") -> str:
        """:meth:`plot`'s figure as one self-contained page (BokehJS inline: no network, no server), as the lab
        view shows it."""
        from bokeh.embed import file_html
        from bokeh.resources import INLINE

        return file_html(self.plot(y), INLINE, title=f"{self.metadata.get('workload', 'experiment')}: {y}")

    def save(self, path: str | Path) -> Path:
        """Write the passes and the metadata: Parquet (``.parquet``, where pyarrow is installed), or CSV with
        the metadata beside it as JSON (``.csv`` and ``.json``). Returns the path of the table."""
        path = Path(path)
        meta = json.dumps({"format": _FORMAT, "parameters": self.parameters, "metadata": self.metadata})
        if path.suffix == ".parquet":
            pa, pq = _pyarrow(path, "writing")
            table = pa.Table.from_pandas(self.passes, preserve_index=False)
            table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"uvm_lab": meta.encode()})
            pq.write_table(table, path)
        elif path.suffix == ".csv":
            self.passes.to_csv(path, index=False)
            path.with_suffix(".json").write_text(meta)
        else:
            raise InvalidArgumentError(f"an experiment is saved as .parquet or .csv, got {str(path)!r}",
                                       value=str(path), expected="a path ending in .parquet or .csv")
        return path

    def _repr_html_(self) -> str:
        note = f"<p>{self.skipped} runs left out by the time budget.</p>" if self.skipped else ""
        return str(self.summary.to_html(index=False)) + note


def load(path: str | Path) -> Experiment:
    """Read an experiment that :meth:`Experiment.save` wrote (on this machine or another)."""
    path = Path(path)
    if path.suffix == ".parquet":
        _, pq = _pyarrow(path, "reading")
        table = pq.read_table(path)
        meta = json.loads((table.schema.metadata or {}).get(b"uvm_lab", b"null"))
        passes = table.to_pandas()
    elif path.suffix == ".csv":
        meta = json.loads(path.with_suffix(".json").read_text())
        passes = pd.read_csv(path, keep_default_na=False, na_values=[""])
    else:
        raise InvalidArgumentError(f"an experiment is read from .parquet or .csv, got {str(path)!r}",
                                   value=str(path), expected="a path ending in .parquet or .csv")
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise InvalidArgumentError(f"{path} is not an experiment uvm_lab saved (format {_FORMAT})", value=str(path),
                                   expected="a file written by Experiment.save")
    passes["note"] = ["" if pd.isna(note) else str(note) for note in passes["note"]]   # CSV reads "" as missing
    return Experiment(passes, list(meta["parameters"]), dict(meta["metadata"]))


def _pyarrow(path: Path, doing: str) -> tuple[Any, Any]:
    """pyarrow and its parquet module, or a typed error that says what to do without it."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as err:
        raise InvalidArgumentError(f"{doing} {path.name} needs pyarrow (pip install pyarrow); a .csv path "
                                   "keeps an experiment as CSV with its metadata as JSON beside it", value=str(path),
                                   expected="a .csv path, or pyarrow installed") from err
    return pa, pq


# -- running -------------------------------------------------------------------------------------------------------

WorkloadLike = str | Workload | Callable[..., Any]


def compare(workload: WorkloadLike, grid: Mapping[str, Iterable[Any]] | None = None, *, repeats: int = 1,
            time_budget: float | None = None, progress: bool = True, clock: Clock = SYSTEM_CLOCK,
            **fixed: Any) -> Experiment:
    """Run ``workload`` under every configuration of ``grid`` (and ``fixed``), ``repeats`` times each.

    Parameters
    ----------
    workload
        A catalog name, a :class:`~uvm_lab.workloads.Workload`, or a function using uvm_lab buffers.
    grid
        Name to the values to try (see the module's description for the names); every combination runs.
    repeats
        How often each configuration runs.
    time_budget
        Seconds (of ``clock``) after which no run starts; what is left out is counted in ``skipped``.
    progress
        Show a progress bar (tqdm's: a widget in a notebook, text elsewhere).
    fixed
        Names with one value each, as the grid takes them.

    Raises
    ------
    InvalidArgumentError
        For an unknown name, an empty list of values, a bad value, or a bad repeat count or budget; nothing
        has run then.
    BackendError
        For ``on="gpu"`` where there is no GPU.
    """
    checked_clock(clock)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InvalidArgumentError(f"repeats must be a whole number >= 1, got {shown(repeats)}", value=repeats,
                                   expected="a whole number >= 1")
    if time_budget is not None and (isinstance(time_budget, bool) or not isinstance(time_budget, (int, float))
                                    or not 0 < time_budget < math.inf):
        raise InvalidArgumentError(f"time_budget must be a positive number of seconds or None, got "
                                   f"{shown(time_budget)}", value=time_budget, expected="seconds > 0, or None")
    if not isinstance(progress, bool):
        raise InvalidArgumentError(f"progress must be True or False, got {shown(progress)}", value=progress,
                                   expected="a bool")
    runner = _Runner.for_workload(workload)
    axes = _axes(grid, fixed, runner)
    configurations = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    plans = [runner.plan(c) for c in configurations]   # every value checked before anything runs
    parameters = [name for name in axes if len(axes[name]) > 1 or name in (grid or {})]

    frames: list[pd.DataFrame] = []
    total, done = len(plans) * repeats, 0
    bar = _progress(total, runner.name) if progress else None
    started = clock.monotonic()
    try:
        for repeat, plan in itertools.product(range(repeats), plans):   # every configuration before any again
            if time_budget is not None and clock.monotonic() - started >= time_budget:
                break
            frames.append(plan.run(repeat, parameters))
            done += 1
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    metadata = {"workload": runner.name, "fixed": {k: _plain(v[0]) for k, v in axes.items() if k not in parameters},
                "grid": {k: [_plain(v) for v in axes[k]] for k in parameters}, "repeats": repeats,
                "time_budget": time_budget, "skipped": total - done, "uvm_lab": _version(),
                "python": sys.version.split()[0], "machine": host_platform.node(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    passes = pd.concat(frames, ignore_index=True) if frames else _empty(parameters)
    result = Experiment(passes, parameters, metadata)
    experiment_feed.publish(result)   # the lab view draws it
    return result


@dataclass
class _Plan:
    """One configuration, checked and ready to run."""

    values: dict[str, Any]
    run_one: Callable[[], list[PhaseResult]]
    ran_on: str
    note: str

    def run(self, repeat: int, parameters: list[str]) -> pd.DataFrame:
        rows = []
        for r in self.run_one():
            rows.append({**{p: _plain(self.values[p]) for p in parameters}, "repeat": repeat, "ran_on": self.ran_on,
                         "note": self.note, "phase": r.phase, "pass_index": r.pass_index, "seconds": r.seconds,
                         "bytes": r.bytes, "bytes_htod": r.bytes_htod, "bytes_dtoh": r.bytes_dtoh,
                         "bytes_evicted": r.bytes_evicted, "bytes_remote": r.bytes_remote, "faults": r.faults})
        frame = pd.DataFrame(rows)
        for column in _COUNTS:
            frame[column] = frame[column].astype("Int64")   # a count, or missing where nothing measured it
        return frame


class _Runner:
    """How one kind of workload is run, and which names it takes."""

    name: str
    accepts: frozenset[str] | None   # the workload's own parameters (None: any, a function's **kwargs)

    @staticmethod
    def for_workload(workload: object) -> _Runner:
        if isinstance(workload, str):
            if workload not in WORKLOADS:
                raise InvalidArgumentError(f"unknown workload {workload!r}", value=workload,
                                           expected=", ".join(WORKLOADS))
            return _Described(workload)
        if isinstance(workload, Workload):
            return _Described(workload)
        if callable(workload):
            return _Function(workload)
        raise InvalidArgumentError(f"workload must be a catalog name, a Workload or a function, got "
                                   f"{shown(workload)}", value=workload,
                                   expected=f"one of {', '.join(WORKLOADS)}, a Workload, or a callable")

    def plan(self, values: dict[str, Any]) -> _Plan:
        raise NotImplementedError


class _Described(_Runner):
    """A catalog workload, or a :class:`Workload`: run by ``run_sim``, or ``run_gpu`` where it fits."""

    def __init__(self, workload: str | Workload) -> None:
        self.workload = workload
        if isinstance(workload, str):
            self.name = workload
            self.accepts = frozenset(inspect.signature(WORKLOADS[workload]).parameters)
        else:
            self.name = workload.name
            self.accepts = frozenset()

    def plan(self, values: dict[str, Any]) -> _Plan:
        if "resource" in values:
            raise InvalidArgumentError(f"resource is for a function's buffers: {self.name} allocates on the device "
                                       f"itself", value=values["resource"], expected="no resource for a workload")
        params = {k: v for k, v in values.items() if k not in RUNNER_PARAMETERS}
        workload = make(self.workload, **params) if isinstance(self.workload, str) else self.workload
        policy, chunk, platform = _policy(values), _chunk(values), _platform(values)
        device_memory = _device_memory(values, workload.total_bytes)
        on = _where(values)
        if on == "gpu":
            gpu_note = _gpu_refusal(values, workload.total_bytes)
            if not gpu_note:
                return _Plan(values, lambda: run_gpu(workload, policy=policy, prefetch_chunk=chunk), "gpu", "")
        else:
            gpu_note = ""
        memory = device_memory if device_memory is not None else parse_size(_SIM_DEVICE_MEMORY)
        return _Plan(values, lambda: run_sim(workload, policy=policy, prefetch_chunk=chunk, device_memory=memory,
                                             platform=platform), "sim", gpu_note)


class _Function(_Runner):
    """The user's function: called on a simulated device made for the configuration, or on the GPU (``on="gpu"``,
    or ``"auto"`` where there is one; a configuration that names a device memory runs on the simulator), with the
    values it names; what it did is read from the events its buffers published."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.name = getattr(function, "__name__", type(function).__name__)
        signature = inspect.signature(function)
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
        self.accepts = None if takes_any else frozenset(signature.parameters)

    def plan(self, values: dict[str, Any]) -> _Plan:
        if values.get("oversubscription") is not None:
            raise InvalidArgumentError("oversubscription needs the workload's size, which a function does not "
                                       "say: give device_memory", value=values["oversubscription"],
                                       expected="device_memory for a function")
        # The values it was given, those the experiment reads too where it names them (never a default).
        kwargs = {k: v for k, v in values.items() if k not in RUNNER_PARAMETERS or self._takes(k)}
        platform = _platform(values)
        # A policy's names are checked where the function does not take them (its own parameters mean what it says).
        if policy_names := {k: v for k, v in values.items() if k in ("policy", "prefetch", "advice")
                            and not self._takes(k)}:
            _policy(policy_names)
        memory = _device_memory(values, None)
        device_memory = memory if memory is not None else parse_size(_SIM_DEVICE_MEMORY)
        chain = values.get("resource") if not self._takes("resource") else None
        if chain is not None:
            check_chain(chain)
        gpu_note = ""
        if _where(values) == "gpu":
            if memory is None:   # on the GPU the user has: it allocates what it allocates, far below the free memory
                return _Plan(values, lambda: _call_on_gpu(self.function, kwargs, self.name, chain), "gpu", "")
            gpu_note = "a GPU's memory cannot be made smaller: simulated only"
        return _Plan(values, lambda: _call_on_sim(self.function, kwargs, self.name, device_memory, platform, chain),
                     "sim", gpu_note)

    def _takes(self, name: str) -> bool:
        return self.accepts is None or name in self.accepts


def _call_on_gpu(function: Callable[..., Any], kwargs: dict[str, Any], name: str,
                 chain: str | None = None) -> list[PhaseResult]:
    """Call ``function`` on the GPU (the current CUDA backend, or a new one for the call): its time from a
    synchronized device to a synchronized device, and what moved where CUPTI's collector runs (``%uvm tracing on``;
    without it, nothing measures the migrations and they are missing, not zero)."""
    from .tracing import cupti_status

    current = get_backend() if has_backend() else None
    users = get_current_device_resource() if current is not None else None
    keep = current is not None and not current.is_simulated
    try:
        with using_backend(current if keep and current is not None else "cuda",
                           **({} if keep else {"watch": False})) as backend:
            if chain is not None:
                set_current_device_resource(build_chain(chain))
            counter = MigrationCounter(backend.bus) if cupti_status()["active"] else None
            try:
                if counter is not None:
                    counter.take()
                backend.synchronize()
                start = time.perf_counter()
                function(**kwargs)
                backend.synchronize()
                seconds = time.perf_counter() - start
                moved = counter.take() if counter is not None else None
            finally:
                if counter is not None:
                    counter.close()
    finally:
        if users is not None and users.backend is get_backend():
            set_current_device_resource(users)
    if moved is None:
        return [PhaseResult(name, 0, seconds, None, None, None, None, None)]
    return [PhaseResult(name, 0, seconds, moved.htod + moved.dtoh, moved.faults, moved.htod, moved.dtoh, None,
                        moved.records, moved.evicted)]


def _call_on_sim(function: Callable[..., Any], kwargs: dict[str, Any], name: str, device_memory: int,
                 platform: Any, chain: str | None = None) -> list[PhaseResult]:
    """Call ``function`` with a simulated device of its own current (and the resource ``chain`` its current device
    resource), and what it moved, from its events. The user's device and its current resource are current after."""
    users = get_current_device_resource() if has_backend() else None
    try:
        with using_backend("sim", device_memory=device_memory, platform=platform) as backend:
            assert isinstance(backend, SimBackend)
            if chain is not None:
                set_current_device_resource(build_chain(chain))
            counter = MigrationCounter(backend.bus)
            try:
                counter.take()
                start = backend.now_ns()
                function(**kwargs)
                moved = counter.take()
                seconds = (backend.now_ns() - start) / 1e9
            finally:
                counter.close()
    finally:
        if users is not None and users.backend is get_backend():
            set_current_device_resource(users)
    return [PhaseResult(name, 0, seconds, moved.htod + moved.dtoh, moved.faults, moved.htod, moved.dtoh, None,
                        moved.records, moved.evicted)]


def _axes(grid: Mapping[str, Iterable[Any]] | None, fixed: dict[str, Any], runner: _Runner) -> dict[str, list[Any]]:
    """Every name given, with its values: the grid's, then the fixed ones (a list of one). Defaults are not
    among them: a function is called with the names it was given only."""
    if grid is not None and not isinstance(grid, Mapping):
        raise InvalidArgumentError(f"grid must map names to lists of values, got {shown(grid)}", value=grid,
                                   expected="a dict such as {'policy': ['faults', 'prefetch']}")
    axes: dict[str, list[Any]] = {}
    for name, values in (grid or {}).items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise InvalidArgumentError(f"grid[{name!r}] must be a list of values, got {shown(values)}",
                                       value=values, expected=f"a list, such as [{values!r}]")
        axes[name] = list(values)
        if not axes[name]:
            raise InvalidArgumentError(f"grid[{name!r}] is empty: a name with no value leaves nothing to run",
                                       value=values, expected="at least one value")
    for name, value in fixed.items():
        if name in axes:
            raise InvalidArgumentError(f"{name!r} is in the grid and given as a keyword too", value=name,
                                       expected="each name once")
        axes[name] = [value]
    valid = set(RUNNER_PARAMETERS) | set(runner.accepts or ())
    if runner.accepts is not None and (unknown := sorted(set(axes) - valid)):
        raise InvalidArgumentError(f"{runner.name} takes no {', '.join(map(repr, unknown))}; the names are "
                                   f"{', '.join(sorted(valid))}", value=unknown, expected=", ".join(sorted(valid)))
    if "device_memory" in axes and "oversubscription" in axes:
        raise InvalidArgumentError("give device_memory or oversubscription, not both", value=sorted(axes),
                                   expected="one of device_memory, oversubscription")
    return axes


def _policy(values: dict[str, Any]) -> str:
    """The configuration's policy: ``policy``, or the one ``prefetch`` and ``advice`` make together."""
    if "prefetch" not in values and "advice" not in values:
        policy = values.get("policy", _DEFAULTS["policy"])
        parse_policy(policy)
        return str(policy)
    if "policy" in values:
        raise InvalidArgumentError("give policy, or prefetch and advice (its two parts), not both", value="policy",
                                   expected="policy alone, or prefetch and/or advice")
    prefetch, advice = values.get("prefetch", "none"), values.get("advice", "none")
    for name, value, valid in (("prefetch", prefetch, PREFETCH_STRATEGIES), ("advice", advice, ADVICE_POLICIES)):
        if value not in valid:
            raise InvalidArgumentError(f"{name} must be one of {', '.join(valid)}, got {shown(value)}", value=value,
                                       expected=", ".join(valid))
    return "+".join(p for p in ("prefetch" if prefetch == "chunked" else "", "" if advice == "none" else advice)
                    if p) or "faults"


def _chunk(values: dict[str, Any]) -> int:
    return parse_size(values.get("prefetch_chunk", _DEFAULTS["prefetch_chunk"]), name="prefetch_chunk",
                      allow_zero=False)


def _platform(values: dict[str, Any]) -> Any:
    return get_platform(values.get("platform", _DEFAULTS["platform"]))


def _where(values: dict[str, Any]) -> str:
    on = values.get("on", _DEFAULTS["on"])
    if on not in ("sim", "gpu", "auto"):
        raise InvalidArgumentError(f"on must be 'sim', 'gpu' or 'auto', got {shown(on)}", value=on,
                                   expected="sim, gpu, auto")
    if on == "auto":
        return "gpu" if gpu_available() else "sim"
    if on == "gpu" and not gpu_available():
        raise BackendError("on='gpu' needs CuPy and an NVIDIA GPU; on='sim' (or 'auto') runs the simulator")
    return str(on)


def _device_memory(values: dict[str, Any], workload_bytes: int | None) -> int | None:
    """The simulated GPU's bytes the configuration asks for (the simulator counts whole 2 MiB blocks of them);
    None if it names none."""
    if values.get("device_memory") is not None:
        memory = parse_size(values["device_memory"], name="device_memory", allow_zero=False)
    elif values.get("oversubscription") is not None:
        ratio = values["oversubscription"]
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < math.inf:
            raise InvalidArgumentError(f"oversubscription must be a positive number (the workload's bytes over "
                                       f"the device's), got {shown(ratio)}", value=ratio,
                                       expected="a number > 0, such as 1.5")
        assert workload_bytes is not None
        memory = int(workload_bytes / ratio)
    else:
        return None
    return memory


def _gpu_refusal(values: dict[str, Any], workload_bytes: int) -> str:
    """Why a configuration may not run on this GPU ("" where it may): the simulator runs it instead."""
    if values.get("device_memory") is not None or values.get("oversubscription") is not None:
        return "a GPU's memory cannot be made smaller: simulated only"
    import cupy  # gpu_available() found it

    free, _ = cupy.cuda.runtime.memGetInfo()
    if workload_bytes > MAX_FRACTION_OF_FREE * free:
        return (f"needs {format_bytes(workload_bytes)}, more than {MAX_FRACTION_OF_FREE:.0%} of the GPU's "
                f"{format_bytes(free)} free: simulated only, never oversubscribed")
    return ""


def _progress(total: int, name: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=name, unit="run")


def _plain(value: Any) -> Any:
    """A value as a table and JSON hold it."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return getattr(value, "name", None) or str(value)


def _empty(parameters: list[str]) -> pd.DataFrame:
    return pd.DataFrame(columns=[*parameters, "repeat", "ran_on", "note", "phase", "pass_index", "seconds", "bytes",
                                 *_COUNTS])


def _version() -> str:
    from . import __version__

    return __version__

