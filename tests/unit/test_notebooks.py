"""The notebooks run headless, top to bottom, and show what their text says they show."""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import pytest

from uvm_lab.backends.sim.platform import get_platform

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("jupyter_bokeh")

ROOT = Path(__file__).resolve().parents[2]
WELCOME = ROOT / "notebooks" / "01-welcome.ipynb"
MiB = 1 << 20

# Appended by the test, never part of the notebook: reads the dashboard the tour displayed, giving its
# timer thread a few seconds to pick up the events of the last cell.
PROBE = """
import json, time
from uvm_lab.page_states import CATEGORY_NAMES
_gpu0 = CATEGORY_NAMES.index("gpu:0")
_d = get_ipython().magics_manager.registry["UvmMagics"].dashboard
_deadline = time.monotonic() + 10
while time.monotonic() < _deadline and set(_d.residency.source.data["category"]) != {_gpu0}:
    time.sleep(0.05)
print(json.dumps({"live": _d.live, "selected": _d.allocations.selected, "a": a.id,
                  "categories": sorted(CATEGORY_NAMES[int(s)] for s in set(_d.residency.source.data["category"])),
                  "refreshes": _d.refreshes}))
"""


#: Every notebook in notebooks/ (the README's pictures are made from them, docs/screenshots.py).
NOTEBOOKS = sorted(path.name for path in (ROOT / "notebooks").glob("*.ipynb"))
#: Code cells (by id) a test appends to a notebook before running it.
PROBES = {WELCOME.name: {"test-probe": PROBE}}
TORCH = "03-pytorch-unified-memory.ipynb"
#: Optional packages a notebook needs: where one is missing, its run is skipped, with the reason.
NEEDS = {TORCH: ("torch",)}


def _kernel_available() -> bool:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        return False
    return True


def _execute(name: str, extra: dict[str, str] | None = None) -> list:
    """Notebook ``name`` with ``extra`` code cells (by id) appended, executed top to bottom in a fresh python3 kernel
    that imports this checkout; returns its cells. A cell that fails does not stop the run: its error is in its
    outputs, for ``test_no_cell_shows_an_error`` to name."""
    if not _kernel_available():
        pytest.skip("no 'python3' Jupyter kernel is installed (pip install ipykernel)")
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    nb.cells.extend(nbformat.v4.new_code_cell(code, id=cell_id) for cell_id, code in (extra or {}).items())
    env_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env_path) if p)  # the kernel inherits it
    try:
        nbclient.NotebookClient(nb, kernel_name="python3", timeout=300, startup_timeout=60, allow_errors=True,
                                resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        if env_path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = env_path
    return nb.cells


@pytest.fixture(scope="module")
def executed():
    """Each notebook, executed once for this module with its probes: a function from its name to its cells."""
    runs: dict[str, list] = {}

    def cells(name: str) -> list:
        for module in NEEDS.get(name, ()):
            pytest.importorskip(module)
        if name not in runs:
            runs[name] = _execute(name, PROBES.get(name))
        return runs[name]

    return cells


@pytest.fixture(scope="module")
def welcome(executed):
    """The welcome tour, executed, with a probe of its dashboard; returns {cell id: cell}."""
    return {c.id: c for c in executed(WELCOME.name)}


#: A number as a notebook prints one: 65,536, 1,447.3, 0.51.
NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"


def number(text: str) -> float:
    """A number as a notebook prints one (:data:`NUMBER`), read back."""
    return float(text.replace(",", ""))


def numbers(text: str) -> set[float]:
    """Every number ``text`` holds, as a notebook prints them (:data:`NUMBER`)."""
    return {number(n) for n in re.findall(NUMBER, text)}


def said(pattern: str, text: str) -> list[float]:
    """The numbers that ``pattern`` (``{n}`` for each, any run of spaces or a line break between words) captures in
    ``text``; fails where the text does not say it."""
    regex = re.escape(pattern).replace(r"\{n\}", f"({NUMBER})").replace(r"\ ", r"\s+")
    found = re.search(regex, text)
    assert found, f"the text does not say {pattern!r}"
    return [number(n) for n in found.groups()]


def stdout(cell) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def result(cell) -> str:
    return next(o.data["text/plain"] for o in cell.outputs if o.output_type == "execute_result")


def summary(cell) -> dict[str, float]:
    return ast.literal_eval(result(cell))


def access(cell) -> dict[str, float]:
    text = result(cell)
    assert text.startswith("AccessResult(")
    return {k: float(v) for k, v in re.findall(r"(\w+)=([\d.e+-]+)", text)}


def test_the_notebooks_are_there():
    assert {WELCOME.name, "02-the-view.ipynb", TORCH} <= set(NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_has_no_outputs(name):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    assert nb.metadata.kernelspec.name == "python3"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_no_cell_shows_an_error(executed, name):
    """What a reader would see as a failure: an error, a traceback, or anything at all on stderr."""
    for cell in executed(name):
        if cell.cell_type != "code":
            continue
        errors = [f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]
        assert errors == [], f"cell {cell.id} of {name} failed"
        stderr = "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stderr")
        assert stderr == "", f"cell {cell.id} of {name} printed to stderr"
        assert "Traceback" not in stdout(cell), f"cell {cell.id} of {name} printed a traceback"


def test_steps_1_to_3_backend_resource_and_a_prefetched_buffer(welcome):
    assert "backend 'sim': 4 GiB free of 4 GiB" in stdout(welcome["backend"])
    chain = stdout(welcome["resource"])
    assert chain.index("PrefetchResourceAdaptor") < chain.index("PoolMemoryResource") < chain.index(
        "ManagedMemoryResource")
    assert summary(welcome["buffer"]) == {"gpu": 1.0, "host": 0.0, "both": 0.0, "nowhere": 0.0, "unknown": 0.0}
    assert "512 MiB of device memory in use" in stdout(welcome["memory"])


def test_step_4_prefetch_to_host_moves_every_page_and_frees_the_gpu(welcome):
    assert summary(welcome["prefetch-host"])["host"] == 1.0
    assert "0 B of device memory in use" in stdout(welcome["prefetch-host"])


def test_step_5_faults_one_per_page_and_prefetch_is_faster(welcome):
    faulted = access(welcome["fault"])
    assert faulted["faults"] == 512 * MiB // 4096
    assert faulted["bytes_htod"] == 512 * MiB and faulted["bytes_dtoh"] == 0
    out = stdout(welcome["compare"])
    fault_ms = float(re.search(r"faulting:\s+([\d.]+) ms", out).group(1))
    prefetch_ms, kernel_ms, faults = re.search(r"kernel:\s+([\d.]+) ms \+ ([\d.]+) ms with (\d+) faults", out).groups()
    assert float(prefetch_ms) * 3 < fault_ms            # "several times faster"
    assert int(faults) == 0 and float(kernel_ms) < 1.0   # "no faults", "a fraction of a millisecond"


def test_step_6_advice_is_read_back_and_moves_nothing(welcome):
    assert "read_mostly: True | preferred_location: host | accessed_by: ()" in stdout(welcome["advice"])
    assert summary(welcome["advice"])["gpu"] == 1.0


def test_step_7_host_write_faults_and_migrates(welcome):
    table = welcome["trace"].outputs[0].data["text/html"]
    for word in ("cpu_page_fault", "dtoh", "coherence", "prefetch", "invalidate"):
        assert word in table
    totals = ast.literal_eval(result(welcome["trace-summary"]))
    blocks = 512 * MiB // (2 * MiB)                     # "the same few rows for each 2 MiB block"
    # "Six faults move a whole block": one coherence and one prefetch migration each (the H200 showed 6
    # CPU-fault and 12 DtoH records per block for the same host access, research/device-probe.md).
    assert totals["counts"]["cpu_page_fault"] == 6 * blocks
    assert totals["counts"]["dtoh"] == 12 * blocks
    assert totals["bytes_dtoh"] == 512 * MiB and totals["bytes_htod"] == 0
    assert totals["cpu_faults"] == 6 * blocks
    assert summary(welcome["after-write"])["host"] == 1.0


def test_step_8_read_mostly_duplicates_and_host_reads_take_no_faults(welcome):
    out = stdout(welcome["duplicate"])
    assert re.search(r"migrated host -> device\s+512 MiB", out)
    assert re.search(r"migrated device -> host\s+0 B", out)
    assert summary(welcome["duplicate"])["both"] == 1.0
    read = access(welcome["host-read"])
    assert read["faults"] == read["bytes_htod"] == read["bytes_dtoh"] == 0


def test_status_and_dashboard(welcome):
    status = stdout(welcome["status"])
    row = next(line for line in status.splitlines() if re.match(r"\s*\d+\s+a\s", line))
    assert "512 MiB" in row and "100.0%" in row and "read_mostly, preferred=host" in row
    kinds = [k for o in welcome["dashboard"].outputs if o.output_type == "display_data" for k in o.data]
    assert "application/vnd.bokehjs_load.v0+json" in kinds            # BokehJS, inline: works offline
    assert "application/vnd.jupyter.widget-view+json" in kinds
    probe = json.loads(stdout(welcome["test-probe"]))
    assert probe["live"] and probe["selected"] == probe["a"]
    assert probe["categories"] == ["gpu:0"]      # "a write collapses the copies: the map turns green"


def test_the_read_mostly_write_trap_is_explained_by_its_numbers(welcome):
    trap = access(welcome["watch"])
    # "131,072 faults, with no byte moved"; "131,072 pages x 220 us is 29 s" (the platform's calibrated figure)
    assert trap["faults"] == 131072 and trap["bytes_htod"] == trap["bytes_dtoh"] == trap["bytes_remote"] == 0
    assert get_platform("x86-pcie5").read_mostly_write_latency == 220e-6
    assert round(trap["seconds"]) == 29
    text = stdout(welcome["trap-fix"])
    (fixed,) = re.findall(r"advice off, prefetch then write:\s+([\d.,]+) ms \+ ([\d.]+) ms with (\d+) faults", text)
    prefetch_ms, write_ms, faults = float(fixed[0].replace(",", "")), float(fixed[1]), int(fixed[2])
    assert faults == 0
    assert round(prefetch_ms) in range(10, 15)                       # "in about 12 ms"
    assert (prefetch_ms + write_ms) / 1e3 < trap["seconds"] / 2000   # "less than a two-thousandth"


@pytest.fixture(scope="module")
def the_view(executed):
    """The view's tour, executed headless; returns its code cells in order."""
    return [c for c in executed("02-the-view.ipynb") if c.cell_type == "code"]


def _bytes_moved_by_line(text: str) -> dict[int, float]:
    """``%%uvm_trace``'s "top lines by bytes moved", in GiB by line of the cell."""
    section = text.split("top lines by bytes moved:")[1]
    units = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024**2}
    return {int(line): float(amount) * units[unit]
            for amount, unit, line in re.findall(r"([\d.]+) (GiB|MiB|KiB)\s+In \[\d+\], line (\d+)", section)}


def test_the_view_tour_traces_each_loop_and_readmostly_cuts_what_weights_moves(the_view):
    view, loop, advised = the_view[1], the_view[3], the_view[4]
    shown = "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in view.outputs)
    assert "UVM Lab view" in shown and "command palette" in shown   # headless, it says how to open it
    before, after = stdout(loop), stdout(advised)
    assert "top lines by faults:" in before and "top lines by faults:" in after
    # The line reading weights: line 3 of the first loop, line 5 of the advised one (after the advice).
    assert "weights" in loop.source.splitlines()[2] and "weights" in advised.source.splitlines()[4]
    moved_before, moved_after = _bytes_moved_by_line(before), _bytes_moved_by_line(after)
    assert moved_after[5] < moved_before[3]
    # ... while activations (line 4, then 6) still moves at least as much: the text says it does not fit.
    assert moved_after[6] >= moved_before[4]


@pytest.fixture(scope="module")
def rfc(executed):
    """The PyTorch unified-memory notebook, executed (skipped without torch); returns {cell id: cell}."""
    return {c.id: c for c in executed(TORCH)}


def test_the_rfc_notebook_moves_a_managed_tensor_without_a_copy(rfc):
    assert "UVM enabled: True" in stdout(rfc["setup"])
    assert "managed: True | x managed: False | equal: True" in stdout(rfc["manage"])
    assert "'preferred_location': 'host', 'accessed_by': ('gpu:0',)" in stdout(rfc["manage"])
    assert summary(rfc["manage"])["host"] == 1.0
    moved = stdout(rfc["to-cuda"])
    assert "same storage: True" in moved and "on cuda:0" in moved
    assert "'preferred_location': 'gpu:0', 'accessed_by': ()" in moved
    assert "moved host -> device 256 MiB, faults 0" in moved       # "256 MiB moved by prefetch"
    assert summary(rfc["to-cuda"])["gpu"] == 1.0
    assert summary(rfc["to-cpu"])["host"] == 1.0 and "on cpu" in stdout(rfc["to-cpu"])


def test_the_rfc_notebook_copies_where_the_rfc_says(rfc):
    copies = stdout(rfc["copies"])
    assert "f64: a new tensor: True | managed: True | on cuda:0 | equal: True" in copies
    # enabled: the forced copy is managed too, with the RFC's advice for the CPU
    assert "forced: a new tensor: True | managed: True | advice" in copies and "m is still on cpu" in copies
    assert "'preferred_location': 'host', 'accessed_by': ('gpu:0',)" in copies
    assert "managed: False | equal: True" in stdout(rfc["unmanage"])
    assert "m's buffer still live: False" in stdout(rfc["unmanage"])


def test_the_rfc_notebook_names_the_models_tensors(rfc):
    names = ("0.weight", "0.bias", "2.weight", "2.bias")
    assert ast.literal_eval(result(rfc["label"])) == {n: n for n in names}
    assert "batch managed: True" in stdout(rfc["model"]) and "parameters on ['cuda:0']" in stdout(rfc["model"])
    assert "moved host -> device: 32.0 MiB" in stdout(rfc["model"])   # the weights, and the biases' 20 KiB
    assert ast.literal_eval(result(rfc["model"])) == dict.fromkeys(names, 1.0)
    assert "(64, 1024) ['cpu']" in stdout(rfc["run"])


def test_the_seed_example_takes_no_faults_with_the_prefetch_adaptor_and_some_without(rfc):
    lines = stdout(rfc["seed"]).splitlines()
    without, with_prefetch = (line for line in lines if line.startswith("prefetch"))
    faults = [int(line.split("GPU faults")[1].split("|")[0]) for line in (without, with_prefetch)]
    assert faults[0] > 0 and faults[1] == 0, lines       # what the text after the cell says
    assert all("result (4096, 4096)" in line and "'gpu': 1.0" in line for line in (without, with_prefetch))




@pytest.fixture(scope="module")
def strategies(executed):
    """The prefetch-strategies notebook, executed; returns {cell id: cell}."""
    return {c.id: c for c in executed("04-prefetch-strategies.ipynb")}


def test_the_prefetch_strategies_rank_as_the_text_says(strategies):
    printed = stdout(strategies["findings"])
    ms = {(memory, name): float(t) for memory, line in re.findall(r"^(4GiB|1GiB): (.*)$", printed, re.M)
          for name, t in re.findall(r"(none|on allocate|on access) (\d+) ms", line)}
    assert len(ms) == 6
    # Where it fits: on access, then on allocate, then none. Where it does not: on access is the slowest.
    assert ms["4GiB", "on access"] < ms["4GiB", "on allocate"] < ms["4GiB", "none"]
    assert ms["1GiB", "on access"] > max(ms["1GiB", "none"], ms["1GiB", "on allocate"])
    # On allocate moves the host-filled inputs back: their whole gigabyte.
    assert "moved 1.00 GiB back to the host" in printed


def test_the_prefetch_strategies_text_states_the_faults_and_evictions_shown(strategies):
    printed = stdout(strategies["findings"])
    fits = re.search(r"^faults where it fits: (.*)$", printed, re.M)[1]
    faults = {name: int(n.replace(",", "")) for name, n in re.findall(r"(none|on allocate|on access) ([\d,]+)", fits)}
    text = strategies["findings-md"].source
    hosts = int(re.search(r"the ([\d,]+) of\s+its row are the host's", text)[1].replace(",", ""))
    # The kernel takes no fault on access: its row holds the host's alone, which every row holds too.
    assert faults["on access"] == hosts and min(faults.values()) == hosts and faults["none"] > 100 * hosts
    over = re.search(r"^evicted where it does not fit: (.*)$", printed, re.M)[1]
    evicted = {name: float(n) for name, n in re.findall(r"(none|on allocate|on access) ([\d.]+) GiB", over)}
    number = r"(\d+(?:\.\d+)?)"
    said = re.search(rf"it evicts {number} GiB over the three passes, where faulting alone evicts {number}", text)
    assert evicted["on access"] == float(said[1]) and evicted["none"] == float(said[2])
