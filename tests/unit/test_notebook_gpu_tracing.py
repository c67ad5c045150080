"""The GPU-tracing notebook records, reads, checks, exports and replays a trace as its text says: here on the
simulator (this CI has no GPU), where every figure is deterministic and no GPU-only result may be claimed."""

from __future__ import annotations

import ast
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from uvm_lab.advisor import PATTERNS

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("jupyter_bokeh")   # tests.unit.test_notebooks, whose helpers these are, needs it

from tests.unit.test_notebooks import NUMBER, ROOT, _execute, number, numbers, result, said, stdout  # noqa: E402

NAME = "09-tracing-a-real-gpu.ipynb"
#: The cells the tests read, by id.
IDS = ("setup", "record", "summary", "table", "table-obs", "lines", "lines-obs", "check", "export", "replay",
       "advice", "advice-obs", "stop")
MiB = 2**20
SIZE = 256 * MiB
PAGES = SIZE // 4096
#: What only a GPU run may print: none of it may show on the simulator.
GPU_ONLY = ("a real GPU", "CUPTI tracing: on", "check_host:", "CUPTI:", "CUPTI collector stopped", "unknown, CUPTI")



def _listing() -> set[str]:
    """The files at the top of the checkout and in notebooks/: where a stray export from the notebook would land."""
    return {p.name for p in ROOT.iterdir()} | {f"notebooks/{p.name}" for p in (ROOT / "notebooks").iterdir()}


@pytest.fixture(scope="module")
def run():
    """The notebook, executed once: ({cell id: cell}, the checkout's listing before, after). Removes the temporary
    folder it exported into, once the module is done."""
    before = _listing()
    cells = {c.id: c for c in _execute(NAME)}
    after = _listing()
    yield cells, before, after
    found = re.search(r"^Perfetto trace: (.+?), ", stdout(cells["export"]), re.M)
    if found:
        folder = Path(found[1]).parent
        if folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith("uvm_lab-"):
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def cells(run):
    return run[0]


@pytest.fixture(scope="module")
def totals(cells) -> dict:
    """What ``trace.summary()`` showed."""
    return ast.literal_eval(result(cells["summary"]))


@pytest.fixture(scope="module")
def by_line(cells) -> dict[int, dict[str, float]]:
    """The by-source-line view, by line of the recording cell (every row must name that cell)."""
    rows = re.findall(rf"^In \[(\d+)\], line (\d+): ({NUMBER}) events?, GPU faults ({NUMBER}), CPU faults "
                      rf"({NUMBER}), MiB to the GPU ({NUMBER}), MiB to the host ({NUMBER})$", stdout(cells["lines"]),
                      re.M)
    assert rows and len(rows) == len(stdout(cells["lines"]).splitlines()), stdout(cells["lines"])
    assert {int(r[0]) for r in rows} == {cells["record"].execution_count}
    out = {int(line): dict(zip(("events", "gpu_faults", "cpu_faults", "htod", "dtoh"), map(number, rest),
                               strict=True)) for _, line, *rest in rows}
    assert len(out) == len(rows)
    return out


def test_the_committed_notebook_has_the_cells_the_tests_read():
    nb = nbformat.read(ROOT / "notebooks" / NAME, as_version=4)
    ids = [c.id for c in nb.cells]
    assert set(IDS) <= set(ids) and len(ids) == len(set(ids))
    assert all(c.outputs == [] and c.execution_count is None for c in nb.cells if c.cell_type == "code")


def test_it_ran_on_the_simulator_with_cupti_off_and_a_buffer_far_below_the_free_memory(cells):
    setup = stdout(cells["setup"])
    assert re.search(r"^backend 'sim', the simulator: no usable GPU here \(.+\)$", setup, re.M), setup
    assert "CUPTI tracing: off, not needed: the simulator publishes its own faults and migrations" in setup
    assert said("the buffer: {n} MiB, {n} pages of {n} KiB", setup) == [256, PAGES, 4]
    free, total = said("device memory: {n} GiB free of {n} GiB", setup)
    assert 256 * 4 <= free * 1024 <= total * 1024


def test_no_gpu_only_result_is_claimed_on_the_simulator(cells):
    printed = "".join(stdout(c) for c in cells.values() if c.cell_type == "code")
    assert not [p for p in GPU_ONLY if p in printed]
    assert stdout(cells["check"]).strip() == ("pages CUPTI missed: 0, there is no CUPTI here: the simulator's records "
                                              "are complete by construction")
    assert stdout(cells["stop"]).strip() == "no CUPTI collector was started: nothing to stop"
    # Each observation quotes the simulator's figures, and says so.
    for cell_id in ("table-obs", "lines-obs", "advice-obs"):
        assert cells[cell_id].source.startswith("**What you see** (on the simulator)")


def test_the_trace_moves_the_buffer_each_way_once(cells, totals):
    assert stdout(cells["record"]).strip() == f"recorded {totals['events']:,} events; the recording missed 0"
    assert totals["bytes_htod"] == totals["bytes_dtoh"] == SIZE
    assert totals["bytes_inferred"] == totals["bytes_dtod"] == totals["missed"] == 0
    assert totals["gpu_faults"] == PAGES                       # one per page, the first kernel's
    printed = stdout(cells["table"])
    assert said("MiB to the GPU: {n}; MiB to the host: {n}; inferred from the host's page tables: {n} MiB",
                printed) == [256, 256, 0]
    assert said("GPU faults: {n}; CPU faults: {n}", printed) == [totals["gpu_faults"], totals["cpu_faults"]]


def test_the_migrations_by_kind_and_cause_are_as_the_text_says(cells, totals, by_line):
    rows, kind = {}, None
    for line in result(cells["table"]).splitlines()[2:]:         # past the header and the index's names
        found = re.match(r"^(htod|dtoh)?\s+(\w+)\s+(\d+)\s+([\d.]+)$", line)
        assert found, line
        kind = found[1] or kind
        rows[kind, found[2]] = (int(found[3]), float(found[4]))
    assert set(rows) == {("htod", "coherence"), ("dtoh", "coherence"), ("dtoh", "prefetch")}   # nothing inferred
    assert rows["htod", "coherence"][1] == 256                    # "all of it as coherence"
    assert rows["dtoh", "coherence"][1] + rows["dtoh", "prefetch"][1] == 256
    records, mib = rows["dtoh", "coherence"]
    assert mib * MiB == records * 4096                            # "each moving its own 4 KiB page"
    assert records == rows["dtoh", "prefetch"][0] == by_line[7]["cpu_faults"]   # one of each for each fault
    assert by_line[7]["cpu_faults"] % (SIZE // (2 * MiB)) == 0    # the same few faults in every 2 MiB block
    assert sum(n for n, _ in rows.values()) == totals["counts"]["htod"] + totals["counts"]["dtoh"]
    text = cells["table-obs"].source
    assert said("{n} MiB each way", text) == [256]
    assert said("The first kernel's {n} GPU faults, one per page", text) == [totals["gpu_faults"]]
    assert said("home a {n} MiB block at a time", text) == [2]
    assert "Nothing was inferred" in text


def test_each_line_of_the_recording_did_what_the_text_says(cells, by_line, totals):
    code = cells["record"].source.splitlines()
    assert "DeviceBuffer(" in code[1] and 'on="host", mode="write"' in code[2]
    assert 'on="gpu"' in code[3] and 'on="gpu"' in code[4] and 'on="host")' in code[6]
    text = cells["lines-obs"].source
    assert said("line {n} allocates the buffer", text) == [2]
    assert by_line[2]["events"] == 2 and by_line[2]["htod"] == by_line[2]["dtoh"] == 0
    line, faults = said("The fill, line {n}, takes {n} CPU faults and moves nothing", text)
    assert line == 3 and by_line[3]["cpu_faults"] == faults and by_line[3]["htod"] == by_line[3]["dtoh"] == 0
    line, faults, mib = said("The first kernel, line {n}, takes all {n} GPU faults and moves {n} MiB to the GPU", text)
    assert line == 4 and by_line[4]["gpu_faults"] == faults == totals["gpu_faults"] and by_line[4]["htod"] == mib
    assert said("The second kernel, line {n}, finds every page in place: no fault, nothing moved", text) == [5]
    assert by_line[5] == {"events": 1, "gpu_faults": 0, "cpu_faults": 0, "htod": 0, "dtoh": 0}   # its access alone
    line, faults, mib = said("The read-back, line {n}, takes {n} CPU faults and moves {n} MiB to the host", text)
    assert line == 7 and by_line[7]["cpu_faults"] == faults and by_line[7]["dtoh"] == mib == 256
    # The lines account for every fault and byte of the trace, and for nothing else.
    for key, total in (("gpu_faults", "gpu_faults"), ("cpu_faults", "cpu_faults")):
        assert sum(r[key] for r in by_line.values()) == totals[total]
    assert sum(r["htod"] for r in by_line.values()) * MiB == totals["bytes_htod"]
    assert sum(r["dtoh"] for r in by_line.values()) * MiB == totals["bytes_dtoh"]
    assert sum(r["events"] for r in by_line.values()) == totals["events"]


def test_the_exports_are_written_outside_the_checkout(run, totals):
    cells, before, after = run
    printed = stdout(cells["export"])
    path, kib = re.search(rf"^Perfetto trace: (.+?), ({NUMBER}) KiB: open it at https://ui\.perfetto\.dev$", printed,
                          re.M).groups()
    kept, kept_kib, loaded = re.search(rf"^uvm_lab trace: (.+?), ({NUMBER}) KiB; loaded back: ({NUMBER}) events$",
                                       printed, re.M).groups()
    for file, size in ((Path(path), number(kib)), (Path(kept), number(kept_kib))):
        assert file.is_file() and file.stat().st_size > 0 and size > 0
        assert round(file.stat().st_size / 1024, 1) == size
        assert not file.resolve().is_relative_to(ROOT.resolve())
        assert file.parent.parent == Path(tempfile.gettempdir())
    assert Path(path).read_bytes()[:1] == b"\x0a"   # a protobuf Trace: field 1 (packet), length-delimited
    assert number(loaded) == totals["events"]
    assert after == before                          # the checkout stays as it was


def test_the_replay_moves_what_was_recorded(cells, totals):
    printed = stdout(cells["replay"])
    for label, key, scale in (("MiB to the GPU", "bytes_htod", MiB), ("MiB to the host", "bytes_dtoh", MiB),
                              ("GPU faults", "gpu_faults", 1), ("CPU faults", "cpu_faults", 1)):
        recorded, replayed = said(f"{label}: recorded {{n}}, replayed {{n}}", printed)
        assert recorded == replayed == totals[key] / scale, label
    recorded, replayed = said("time: recorded {n} ms, replayed {n} ms; exact: True", printed)
    assert recorded == replayed == round(totals["seconds"] * 1e3, 1)
    assert printed.rstrip().endswith("exact: True")    # and no note


def test_the_advice_names_a_pattern_and_its_gain_as_the_text_says(cells, totals):
    printed = stdout(cells["advice"])
    found = re.search(r"^advice: (\w+) in data: (.+) at In \[(\d+)\], line (\d+)$", printed, re.M)
    assert found, printed
    assert found[1] in PATTERNS and found[1] == "gpu_first_touch"
    assert (int(found[3]), int(found[4])) == (cells["record"].execution_count, 4)   # the first kernel's line
    assert said("{n} GPU faults moved {n} MiB in", found[2]) == [totals["gpu_faults"], 256]
    assert 'change: data.prefetch("gpu")' in printed
    before, after, gain = said("replayed with it: {n} ms -> {n} ms, {n}% faster", printed)
    assert before == round(totals["seconds"] * 1e3, 1) and after < before
    assert gain == round(100 * (1 - after / before))
    text = cells["advice-obs"].source
    assert "`gpu_first_touch`" in text
    assert said("moves the same {n} MiB in large blocks, with no fault, and the replay runs {n}% faster", text) == [
        256, gain]


def test_every_number_the_text_states_is_printed(cells):
    text = "".join(c.source for c in cells.values() if c.cell_type == "markdown")
    printed = "".join(stdout(c) for c in cells.values() if c.cell_type == "code") + result(cells["summary"])
    assert numbers(text) <= numbers(printed), numbers(text) - numbers(printed)
