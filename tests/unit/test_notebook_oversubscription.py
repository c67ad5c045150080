"""The oversubscription notebook shows the cliff, and the policies that soften it, where its text says it does."""

from __future__ import annotations

import ast
import re

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("jupyter_bokeh")

from tests.unit.test_notebooks import NUMBER, ROOT, _execute, number, result, stdout  # noqa: E402

NAME = "06-oversubscription.ipynb"
#: The cells the tests read, by id.
IDS = ("setup", "compare", "cliff", "cliff-md", "findings", "findings-md", "plot")


def numbers(text: str) -> list[float]:
    return [number(n) for n in re.findall(NUMBER, text)]


def said(pattern: str, text: str) -> list[float]:
    """The numbers ``pattern`` (with ``{n}`` for each number) captures in ``text``; fails where it is not there."""
    found = re.search(pattern.replace("{n}", f"({NUMBER})"), text, re.M)
    assert found, f"not found: {pattern!r}"
    return [number(n) for n in found.groups()]


@pytest.fixture(scope="module")
def cells():
    """The notebook, executed once; returns {cell id: cell}."""
    return {c.id: c for c in _execute(NAME)}


@pytest.fixture(scope="module")
def table(cells) -> dict[str, dict[float, float]]:
    """The GB/s table the compare cell shows: policy -> ratio -> GB/s."""
    header, *rows = result(cells["compare"]).splitlines()
    ratios = numbers(header)
    out = {}
    for row in rows:
        name, *values = row.split()
        if values:                                     # the index's name has a line of its own
            out[name] = dict(zip(ratios, map(float, values), strict=True))
    return out


@pytest.fixture(scope="module")
def policies(cells) -> tuple[str, ...]:
    return ast.literal_eval(result(cells["setup"]))


def test_the_committed_notebook_has_the_cells_the_tests_read():
    nb = nbformat.read(ROOT / "notebooks" / NAME, as_version=4)
    ids = [c.id for c in nb.cells]
    assert set(IDS) <= set(ids) and len(ids) == len(set(ids))
    assert 8 <= len(nb.cells) <= 14


def test_the_grid_ran_every_policy_at_every_ratio(cells, table, policies):
    assert set(policies) == {"faults", "prefetch", "read_mostly", "remote"}
    assert set(table) == set(policies)
    ratios = set(table["faults"])
    assert min(ratios) < 1 < max(ratios) and all(set(row) == ratios for row in table.values())
    assert all(v > 0 for row in table.values() for v in row.values())


def test_the_cliff_is_where_the_text_says(cells, table):
    printed, text = stdout(cells["cliff"]), cells["cliff-md"].source
    below, above, evicted = said(r"nothing evicted up to {n}; at {n}, {n} GiB evicted", printed)
    assert said(r"The cliff is at {n}", text) == [below]
    # No ratio was tried between the two: the cliff lies between neighbours of the grid.
    ratios = sorted(table["faults"])
    assert ratios.index(above) == ratios.index(below) + 1
    # Flat where it fits, and a wall past it: every oversubscribed ratio runs at under a third of the speed.
    faults = table["faults"]
    assert len({faults[r] for r in ratios if r <= below}) == 1
    assert all(faults[r] < faults[below] / 3 for r in ratios if r >= above)
    at, gpu, data = said(r"At {n}, a GPU of\s+{n} MiB for {n} MiB of data", text)
    assert at == above
    assert said(r"^{n} MiB read", stdout(cells["compare"])) == [data] and gpu < data
    assert said(rf"{{n}} MiB \({above}\)", stdout(cells["compare"])) == [gpu]
    ms_below, ms_above, slower = said(r"passes: {n} ms at [\d.]+, {n} ms at [\d.]+ \({n}x slower\)", printed)
    assert said(r"take {n}x as long \({n} ms against {n}\)", text) == [slower, ms_above, ms_below]
    assert ms_above / ms_below == pytest.approx(slower, rel=0.03)
    assert said(r"and {n} GiB is evicted", text) == [evicted]


def test_the_cliff_is_in_the_re_reads_and_no_deeper_past_it(cells, table):
    printed, text = stdout(cells["cliff"]), cells["cliff-md"].source
    first_below, first_above = said(r"pass 1: {n} GB/s at [\d.]+, {n} GB/s at", printed)
    assert said(r"about the same on both sides of the cliff \({n} against {n} GB/s\)", text) == [
        first_below, first_above]
    assert first_above / first_below > 0.9
    fits, over, slower, moved, evicted = said(
        r"pass 2: {n} GB/s at [\d.]+, {n} GB/s at [\d.]+ \({n}x slower\), moving {n} MiB in and evicting {n} MiB",
        printed)
    assert said(r"at {n} GB/s where\s+the buffer fits, and at {n} GB/s where it does not, {n}x slower", text) == [
        fits, over, slower]
    assert slower > 100 and fits / over == pytest.approx(slower, rel=0.02)
    data = said(r"^{n} MiB read", stdout(cells["compare"]))[0]
    assert moved == evicted == data                  # "faults all 256 MiB back in and evicts all 256 MiB again"
    assert said(r"back in and evicts all {n} MiB", text) == [data]
    # "pass 2 runs at 7.6 GB/s at every ratio up to 3.0"
    past = re.findall(rf"({NUMBER}) GB/s at ({NUMBER})", printed.split("past the cliff:")[1])
    speed, last = said(r"pass 2 runs at {n} GB/s at every ratio up to {n}", text)
    assert {number(s) for s, _ in past} == {speed} == {over}
    assert [number(r) for _, r in past] == [r for r in sorted(table["faults"]) if r > 1]
    assert number(past[-1][1]) == last == max(table["faults"])
    start, end = said(r"from {n} to {n} GB/s", text)
    assert (start, end) == (table["faults"][number(past[0][1])], table["faults"][last]) and end < start


def test_past_the_cliff_the_policies_rank_as_the_text_says(cells, table, policies):
    printed, text = stdout(cells["findings"]), cells["findings-md"].source
    at = said(r"^at {n}, GB/s over", printed)[0]
    gbps = {p: (number(v), number(x)) for p, v, x in re.findall(rf"(\w+) ({NUMBER}) \(({NUMBER})x\)",
                                                               printed.splitlines()[0])}
    assert set(gbps) == set(policies)
    assert {p: v for p, (v, _) in gbps.items()} == {p: table[p][at] for p in policies}
    assert said(r"Past the cliff \({n} here", text) == [at]
    assert said(r"against the {n} GB/s of faulting", text) == [gbps["faults"][0]]
    # "remote ... is the fastest", then prefetch, then read_mostly, then faults.
    assert gbps["remote"][0] > gbps["prefetch"][0] > gbps["read_mostly"][0] > gbps["faults"][0]
    assert said(r"`remote` removes the cliff: {n} GB/s at every ratio, {n}x faulting", text) == list(gbps["remote"])
    assert said(r"`prefetch` keeps most of the speed: {n} GB/s, {n}x", text) == list(gbps["prefetch"])
    for v, x in gbps.values():
        assert v / gbps["faults"][0] == pytest.approx(x, rel=0.02)   # the factor is the GB/s over faulting's
    rereads = dict(re.findall(rf"(\w+) ({NUMBER}) GB/s", re.search(r"^pass 2 at [\d.]+: (.*)$", printed, re.M)[1]))
    x, v, pass2 = said(r"`read_mostly` softens it by {n}x \({n} GB/s; pass 2 at {n}\)", text)
    assert (v, x) == gbps["read_mostly"] and pass2 == number(rereads["read_mostly"])
    assert said(r"pass 2 runs at {n} GB/s, against {n}", text) == [number(rereads["prefetch"]),
                                                                    number(rereads["faults"])]


def test_remote_is_flat_and_read_mostly_moves_nothing_back(cells, table):
    printed, text = stdout(cells["findings"]), cells["findings-md"].source
    (flat,) = said(r"^remote, every ratio: {n} GB/s,", printed)     # one value: the set of them printed
    assert set(table["remote"].values()) == {flat}
    over_link, faults = said(r"reading {n} GiB over the link with {n} faults", printed)
    assert faults == 0 and said(r"over the link \({n} GiB over the 3 passes\), with {n} faults", text) == [
        over_link, faults]
    back = {p: number(v) for p, v in re.findall(rf"(\w+) ({NUMBER}) GiB", printed.split("moved back to the host:")[1]
                                                .splitlines()[0])}
    assert back["read_mostly"] == back["remote"] == 0 and back["faults"] == back["prefetch"] > 0
    assert said(r"\({n} GiB moved back to the host, as much as faulting\)", text) == [back["prefetch"]]
    assert said(r"moves nothing back \({n} GiB against {n}\)", text) == [back["read_mostly"], back["faults"]]


def test_where_it_fits_the_order_turns_over(cells, table):
    printed, text = stdout(cells["findings"]), cells["findings-md"].source
    fits = said(r"passes where it fits \({n}\)", printed)[0]
    total = {p: number(v) for p, v in re.findall(rf"(\w+) ({NUMBER}) GB/s",
                                                  re.search(r"where it fits \([\d.]+\): (.*)$", printed, re.M)[1])}
    assert total == {p: table[p][fits] for p in total}
    assert total["prefetch"] > total["remote"] > total["read_mostly"] > total["faults"]
    assert said(r"`prefetch` is the fastest at {n} GB/s,\s+then `remote` at {n}, `read_mostly` at {n} and "
                r"`faults` at {n}", text) == [total[p] for p in ("prefetch", "remote", "read_mostly", "faults")]
    rereads = {p: number(v) for p, v in re.findall(rf"(\w+) ({NUMBER}) GB/s",
                                                    re.search(rf"^pass 2 at {fits}: (.*)$", printed, re.M)[1])}
    # Remote reads over the link on every pass; the others re-read from GPU memory, far faster.
    assert rereads["remote"] * 5 < min(rereads[p] for p in ("faults", "read_mostly", "prefetch"))
    assert said(r"`faults` and `read_mostly` at {n} GB/s, `prefetch` at\s+{n}", text) == [
        rereads["faults"], rereads["prefetch"]]
    assert rereads["faults"] == rereads["read_mostly"]
    assert said(r"reads over the link at {n} GB/s on every pass", text) == [rereads["remote"]]


def test_prefetch_loses_where_its_chunk_does_not_fit(cells, table):
    printed, text = stdout(cells["findings"]), cells["findings-md"].source
    ratio, prefetch, faults, gpu, chunk, moved, faulted = said(
        r"prefetch at {n}: {n} GB/s against faults' {n}; the GPU's {n} MiB is less than one {n}MiB chunk, "
        r"and it moved {n} GiB in \(faults {n}\)", printed)
    assert gpu < chunk and prefetch < faults and moved == 2 * faulted
    assert (prefetch, faults) == (table["prefetch"][ratio], table["faults"][ratio])
    assert ratio == max(table["prefetch"])
    # Only there: at every other oversubscribed ratio prefetch beats faulting several times over.
    assert all(table["prefetch"][r] > 3 * table["faults"][r] for r in table["prefetch"] if 1 < r < ratio)
    assert said(r"At {n} the GPU has {n} MiB, less than one {n}MiB chunk", text) == [ratio, gpu, chunk]
    assert said(r"\({n} GiB in, against faulting's {n}\): {n} GB/s, slower than faulting's {n}", text) == [
        moved, faulted, prefetch, faults]


def test_every_number_the_text_states_is_one_the_notebook_prints(cells):
    shown = set()
    for cell in cells.values():
        if cell.cell_type == "code":
            shown |= set(numbers(stdout(cell)))
            shown |= {n for o in cell.outputs if o.output_type == "execute_result"
                      for n in numbers(o.data.get("text/plain", ""))}
    # The introduction names the simulated platform (H200, PCIe 5) and states no measurement.
    for cell in cells.values():
        if cell.cell_type == "markdown" and cell.id != "intro":
            missing = [n for n in numbers(cell.source) if n not in shown]
            assert missing == [], f"{cell.id} states numbers the notebook does not print"


def test_it_ends_with_a_bokeh_figure_of_one_line_per_policy(cells, policies):
    code = [c for c in cells.values() if c.cell_type == "code"]
    assert code[-1].id == "plot"
    scripts = [o.data["application/javascript"] for o in code[-1].outputs
               if o.output_type == "display_data" and "application/vnd.bokehjs_exec.v0+json" in o.data]
    assert len(scripts) == 1
    legend = re.findall(r'"name":"LegendItem","id":"\w+","attributes":\{"label":\{"type":"value","value":"(\w+)"\},'
                        r'"renderers":\[(.*?)\]', scripts[0])
    assert [name for name, _ in legend] == list(policies)
    assert all(renderers.count('"id"') == 2 for _, renderers in legend)   # a line and its markers, each
