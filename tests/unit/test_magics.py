"""%load_ext uvm_lab, %uvm and %%uvm_trace in a real IPython InteractiveShell."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("IPython")

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import uvm_lab as ul
from uvm_lab.jupyter import load_ipython_extension, unload_ipython_extension
from uvm_lab.jupyter.magics import VIEW_MIME_TYPE, UvmMagics


@pytest.fixture
def sim(sim_backend):
    """The conftest's fresh simulated 4 GiB GPU, with plain managed memory as the current resource."""
    ul.mr.set_current_device_resource(ul.mr.ManagedMemoryResource())
    return sim_backend


@pytest.fixture
def shell(sim):
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "uvm_lab")
    yield ip
    ip.run_line_magic("unload_ext", "uvm_lab")


def test_load_ext_registers_the_magics_once(shell):
    assert "uvm" in shell.magics_manager.magics["line"]
    assert "uvm_trace" in shell.magics_manager.magics["cell"]
    first = shell.magics_manager.registry["UvmMagics"]
    load_ipython_extension(shell)                  # a second load is harmless
    assert shell.magics_manager.registry["UvmMagics"] is first


def test_unload_removes_the_magics(sim):
    ip = InteractiveShell.instance()
    load_ipython_extension(ip)
    unload_ipython_extension(ip)
    assert "uvm" not in ip.magics_manager.magics["line"]
    assert "uvm_trace" not in ip.magics_manager.magics["cell"]
    load_ipython_extension(ip)                     # and it can come back
    assert "uvm" in ip.magics_manager.magics["line"]
    unload_ipython_extension(ip)


def test_load_registers_the_comm_target_when_the_module_exists(sim, monkeypatch):
    calls = []
    fake = types.ModuleType("uvm_lab.jupyter.comm")
    fake.register_comm_target = lambda: calls.append(1) or False
    monkeypatch.setitem(sys.modules, "uvm_lab.jupyter.comm", fake)
    ip = InteractiveShell.instance()
    load_ipython_extension(ip)
    load_ipython_extension(ip)
    assert calls == [1, 1]                         # idempotent on its side; we call it on every load
    unload_ipython_extension(ip)


def test_status_lists_backend_memory_and_allocations(shell, sim, capsys):
    a = ul.DeviceBuffer(size="8MiB", label="weights")
    a.prefetch("host")
    capsys.readouterr()
    assert shell.run_line_magic("uvm", "status") is None
    out = capsys.readouterr().out
    assert "backend: sim" in out
    assert "4 GiB total" in out
    assert "weights" in out and "8 MiB" in out
    line = next(x for x in out.splitlines() if "weights" in x)
    assert "100.0%" in line                        # all of it on the host
    assert "published" in out and "dropped" in out
    # a column per GPU of the (one-GPU) device, and one for pages whose place cannot be known
    assert table_column(out, "weights") == {"gpu:0": "0.0%", "host": "100.0%", "both": "0.0%", "unknown": "0.0%",
                                            "nowhere": "0.0%"}


def table_column(out, label):
    """The residency columns of ``label``'s row of the status table, by header (columns as the dashes mark them)."""
    lines = out.splitlines()
    header = next(i for i, x in enumerate(lines) if x.split()[:2] == ["id", "label"])
    spans = [m.span() for m in re.finditer(r"-+", lines[header + 1])]
    cells = [[line[a:b].strip() for a, b in spans] for line in (lines[header], *lines[header + 2:])]
    names, row = cells[0], next(c for c in cells[1:] if c[1] == label)
    first, last = names.index("kind") + 1, names.index("advice")
    return dict(zip(names[first:last], row[first:last], strict=True))


def test_status_has_a_column_for_each_gpu_and_for_unknown(sim):
    """On a two-GPU device, pages on gpu:0 and gpu:1 are told apart, and unknown from nowhere."""
    import numpy as np

    from uvm_lab.jupyter.dashboard.collect import category_pages, collect_snapshot
    from uvm_lab.jupyter.dashboard.text import format_status

    buf = ul.DeviceBuffer(size="40KiB", label="mixed")   # ten pages
    # gpu:0 x2, gpu:1 x3, host+gpu:1, unknown, host+unknown, nowhere, gpu:0+gpu:1
    states = np.array([2, 2, 4, 4, 4, 5, 0x80, 0x81, 0, 6], dtype=np.uint8)
    snapshot = collect_snapshot()
    alloc = next(a for a in snapshot["allocations"] if a["id"] == buf.id)
    alloc.update(states=states, category_pages=category_pages(states))
    out = format_status({**snapshot, "device_count": 2, "allocations": [alloc]})
    assert table_column(out, "mixed") == {"gpu:0": "20.0%", "gpu:1": "30.0%", "gpus": "10.0%", "host": "0.0%",
                                          "both": "10.0%", "unknown": "20.0%", "nowhere": "10.0%"}


def test_status_shows_advice(shell, capsys):
    a = ul.DeviceBuffer(size="4MiB", label="adv")
    a.read_mostly = True
    a.preferred_location = "host"
    capsys.readouterr()
    shell.run_line_magic("uvm", "status")
    line = next(x for x in capsys.readouterr().out.splitlines() if " adv " in x)
    assert "read_mostly" in line and "preferred=host" in line


def test_bare_uvm_prints_help(shell, capsys):
    shell.run_line_magic("uvm", "")
    out = capsys.readouterr().out
    assert "status" in out and "dashboard" in out and "resource" in out
    shell.run_line_magic("uvm", "resource -h")
    assert "--pool-size" in capsys.readouterr().out


@pytest.mark.parametrize(("line", "names"), [
    ("bogus", ["'bogus'", "status", "dashboard", "resource"]),
    ("resource tpu", ["'tpu'", "managed", "cuda", "pool"]),
    ("resource pool --pool-size 12parsecs", ["12parsecs", "512MiB"]),
    ("resource pool --pool-size 1000", ["1000", "multiple of 256"]),   # refused by the resource itself
    ("resource managed --pool-size 1GiB", ["--pool-size", "pool", "'managed'"]),
    ("resource cuda --prefetch", ["--prefetch", "managed"]),
    ("resource --prefetch", ["KIND", "managed"]),
    ("status --verbose", ["--verbose"]),
    ("status 'unclosed", ["cannot parse"]),
])
def test_bad_input_raises_usage_error_naming_it(shell, line, names):
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("uvm", line)
    for name in names:
        assert name in str(info.value)


def test_resource_prints_and_sets_the_chain(shell, capsys):
    shell.run_line_magic("uvm", "resource")
    out = capsys.readouterr().out
    assert "ManagedMemoryResource" in out
    shell.run_line_magic("uvm", "resource pool --pool-size 64MiB --prefetch --statistics")
    chain = ul.mr.resource_chain(ul.mr.get_current_device_resource())
    assert [type(r).__name__ for r in chain] == [
        "StatisticsResourceAdaptor", "PrefetchResourceAdaptor", "PoolMemoryResource", "ManagedMemoryResource"]
    out = capsys.readouterr().out
    assert out.index("StatisticsResourceAdaptor") < out.index("PoolMemoryResource")
    a = ul.DeviceBuffer(size="4MiB")
    assert ul.residency(a).summary()["gpu"] == 1.0  # the prefetch adaptor did its job
    a.close()
    shell.run_line_magic("uvm", "resource cuda")
    assert not ul.mr.get_current_device_resource().is_managed


def test_uvm_trace_summarises_and_stores_the_trace(shell, capsys):
    shell.user_ns.update(ul=ul, a=ul.DeviceBuffer(size="8MiB", label="a"))
    shell.user_ns["a"].prefetch("host")
    capsys.readouterr()
    result = shell.run_cell_magic("uvm_trace", "-o t", "r = ul.touch(a, on='gpu', mode='read')\nr.faults")
    out = capsys.readouterr().out
    trace = shell.user_ns["t"]
    assert len(trace) > 0
    assert result == shell.user_ns["r"].faults > 0           # the last expression is the cell's value
    assert "uvm_trace:" in out and "simulated time" in out
    assert re.search(r"migrated host -> device\s+8 MiB", out)
    assert re.search(rf"GPU page faults\s+{shell.user_ns['r'].faults:,}\b", out)
    assert "gpu_page_fault" in out and "htod" in out


def test_uvm_trace_runs_ipython_syntax_and_quiet(shell, capsys):
    shell.user_ns["a"] = ul.DeviceBuffer(size="1MiB", label="a")
    capsys.readouterr()
    shell.run_cell_magic("uvm_trace", "-q -o t2", "x = 1\n%uvm status\na.prefetch('gpu')")
    out = capsys.readouterr().out
    assert "uvm_trace:" not in out and "backend: sim" in out
    assert len(shell.user_ns["t2"]) > 0


def test_uvm_trace_reports_even_when_the_cell_raises(shell, capsys):
    shell.user_ns["a"] = ul.DeviceBuffer(size="1MiB", label="a")
    with pytest.raises(ZeroDivisionError):
        shell.run_cell_magic("uvm_trace", "-o t3", "a.prefetch('gpu')\n1 / 0")
    assert "uvm_trace:" in capsys.readouterr().out
    assert len(shell.user_ns["t3"]) > 0


def test_uvm_trace_rejects_a_bad_name(shell):
    with pytest.raises(UsageError, match="'1bad'"):
        shell.run_cell_magic("uvm_trace", "-o 1bad", "pass")
    with pytest.raises(UsageError, match="--frobnicate"):
        shell.run_cell_magic("uvm_trace", "--frobnicate", "pass")


def test_dashboard_magic_displays_reuses_and_closes(shell, capsys):
    pytest.importorskip("jupyter_bokeh")
    magics = shell.magics_manager.registry["UvmMagics"]
    assert isinstance(magics, UvmMagics)
    assert shell.run_line_magic("uvm", "dashboard") is None
    dash = magics.dashboard
    assert dash is not None and dash.live
    shell.run_line_magic("uvm", "dashboard")
    assert magics.dashboard is dash                        # shown again, not rebuilt
    shell.run_line_magic("uvm", "dashboard --close")
    assert dash.closed and not dash.live and magics.dashboard is None
    shell.run_line_magic("uvm", "dashboard")
    second = magics.dashboard
    assert second is not dash and second.live
    shell.run_line_magic("unload_ext", "uvm_lab")         # unloading closes it
    assert second.closed
    shell.run_line_magic("load_ext", "uvm_lab")           # the fixture unloads again


def test_status_needs_no_widgets_or_bokeh():
    """The magics load lazily: %uvm status works without importing ipywidgets or bokeh."""
    code = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "import uvm_lab as ul\n"
        "ul.use_backend('sim', device_memory='1GiB')\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'uvm_lab')\n"
        "ip.run_line_magic('uvm', 'status')\n"
        "heavy = [m for m in ('bokeh', 'ipywidgets', 'jupyter_bokeh') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "backend: sim" in proc.stdout


def test_tracing_on_the_simulator_explains_and_starts_nothing(shell, capsys):
    shell.run_line_magic("uvm", "tracing on")
    out = capsys.readouterr().out
    assert "simulated device publishes its faults and migrations itself" in out
    shell.run_line_magic("uvm", "tracing")
    assert capsys.readouterr().out.strip() == "CUPTI tracing is off."
    shell.run_line_magic("uvm", "tracing off")
    assert capsys.readouterr().out.strip() == "CUPTI tracing is off."


@pytest.mark.parametrize("line, message", [
    ("tracing maybe", "invalid choice: 'maybe'"),
    ("tracing off --gpu-faults", "--gpu-faults goes with 'on'"),
])
def test_tracing_refuses_bad_input(shell, line, message):
    with pytest.raises(UsageError, match=message):
        shell.run_line_magic("uvm", line)


def test_view_magic_outputs_the_bundle_the_lab_extension_opens(shell, monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objs, **kw: shown.append((objs, kw)))
    shell.run_line_magic("uvm", "view")
    ((bundle,), kw), = shown
    assert kw == {"raw": True}
    assert set(bundle) == {VIEW_MIME_TYPE, "text/plain"} and "Open the UVM Lab View" in bundle["text/plain"]
    index_ts = (Path(__file__).resolve().parents[2] / "extension" / "src" / "index.ts").read_text()
    assert f"const VIEW_MIME_TYPE = '{VIEW_MIME_TYPE}';" in index_ts     # the twin the extension renders


def test_events_name_the_cell_and_line_that_caused_them(shell):
    shell.run_cell("import uvm_lab as ul\nb = ul.DeviceBuffer(size='1MiB')", store_history=True)
    allocated_in = shell.execution_count - 1
    shell.run_cell("def back(buf):\n    buf.prefetch('host')\n", store_history=True)
    defined_in = shell.execution_count - 1
    shell.run_cell("ul.touch(b, on='host', mode='write')\nwith ul.record() as t:\n    b.prefetch('gpu')\n"
                   "    back(b)", store_history=True)
    ran_in = shell.execution_count - 1
    df = shell.user_ns["t"].to_pandas()
    assert df[df["kind"] == "htod"]["source"].unique().tolist() == [f"In [{ran_in}], line 3"]
    # The innermost line of user code: inside the function, in the cell that defined it.
    assert df[df["kind"] == "dtoh"]["source"].unique().tolist() == [f"In [{defined_in}], line 2"]
    assert set(df["cell"].tolist()) == {ran_in, defined_in}
    shell.run_cell("with ul.record() as t2:\n    b.close()", store_history=True)
    freed = shell.user_ns["t2"].to_pandas()
    assert freed["cell"].tolist() == [shell.execution_count - 1] * len(freed) and allocated_in < ran_in


def test_driver_events_between_calls_are_charged_to_the_running_cell(shell):
    from uvm_lab.events import EventKind, get_bus, make_events

    shell.run_cell("import uvm_lab as ul\nrecording = ul.record()\nt = recording.__enter__()", store_history=True)
    opened = shell.execution_count - 1
    get_bus().publish(make_events(1, kind=EventKind.HTOD, bytes=4096))   # as CUPTI's records arrive: no caller
    shell.run_cell("x = 1", store_history=True)
    get_bus().publish(make_events(1, kind=EventKind.GPU_PAGE_FAULT, value=1))   # after the cell: still its own
    df = shell.user_ns["t"].to_pandas()
    shell.run_cell("recording.__exit__(None, None, None)")
    assert df["source"].tolist() == [f"In [{opened}]", f"In [{opened + 1}]"]


def test_uvm_trace_prints_the_lines_that_faulted_and_moved_most(shell, capsys):
    shell.run_cell("import uvm_lab as ul\nb = ul.DeviceBuffer(size='8MiB')\nul.touch(b, on='host', mode='write')",
                   store_history=True)
    capsys.readouterr()
    shell.run_cell("%%uvm_trace\nb.prefetch('gpu')\nul.touch(b, on='host', mode='read', size='2MiB')",
                   store_history=True)
    cell = shell.execution_count - 1
    out = capsys.readouterr().out
    faults = out[out.index("top lines by faults"):out.index("top lines by bytes moved")]
    moved = out[out.index("top lines by bytes moved"):]
    assert f"In [{cell}], line 3" in faults and f"In [{cell}], line 2" not in faults
    assert re.search(rf"8 MiB\s+In \[{cell}\], line 2", moved) and re.search(rf"2 MiB\s+In \[{cell}\], line 3", moved)
    assert moved.index("line 2") < moved.index("line 3")   # most bytes first


def test_unloading_stops_charging_events_to_cells(sim):
    from uvm_lab.events import sources

    ip = InteractiveShell.instance()
    load_ipython_extension(ip)
    assert sources.running_cell() != 0
    unload_ipython_extension(ip)
    assert sources.running_cell() == 0
