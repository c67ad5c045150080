"""The memory-advice notebook ranks the three advices, and springs the ReadMostly write trap, as its text says."""

from __future__ import annotations

import re

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("jupyter_bokeh")

from tests.unit.test_notebooks import NUMBER, _execute, number, numbers, said, stdout  # noqa: E402

NAME = "05-memory-advice.ipynb"
ADVICES = ("none", "read_mostly", "preferred_location", "accessed_by")



@pytest.fixture(scope="module")
def cells():
    """The notebook, executed once; {cell id: cell}."""
    return {c.id: c for c in _execute(NAME)}


@pytest.fixture(scope="module")
def findings(cells):
    """What the findings cell printed (pages; ms, speed-up and faults by (steps, advice); MiB each way at 16
    steps), and the markdown that explains it."""
    printed = stdout(cells["findings"])
    pages = number(re.search(rf"the table: 256 MiB, ({NUMBER}) pages of 4 KiB", printed)[1])
    ms, speedup, faults, moved = {}, {}, {}, {}
    for steps, line in re.findall(r"^(\d+) steps?: (.*)$", printed, re.M):
        for advice, t, x in re.findall(rf"(\w+) ({NUMBER}) ms \(({NUMBER})x\)", line):
            ms[int(steps), advice], speedup[int(steps), advice] = number(t), number(x)
    for steps, line in re.findall(r"^faults, (\d+) steps?: (.*)$", printed, re.M):
        for advice, n in re.findall(rf"(\w+) ({NUMBER})", line):
            faults[int(steps), advice] = number(n)
    line = re.search(r"^MiB to the GPU / to the host, 16 steps: (.*)$", printed, re.M)[1]
    for advice, htod, dtoh in re.findall(rf"(\w+) ({NUMBER}) / ({NUMBER})", line):
        moved[advice] = (number(htod), number(dtoh))
    keys = {(s, a) for s in (1, 16) for a in ADVICES}
    assert set(ms) == set(speedup) == set(faults) == keys and set(moved) == set(ADVICES), printed
    return {"text": printed, "md": cells["findings-md"].source, "pages": pages, "ms": ms, "x": speedup,
            "faults": faults, "moved": moved}


@pytest.fixture(scope="module")
def trap(cells):
    """What the trap cell printed, by advice: the write's faults, MiB moved and invalidated (and where), ms and µs a
    fault, and the whole run's ms."""
    printed = stdout(cells["trap"])
    rows = {}
    for advice, faults, moved, dropped, where, ms, us, run in re.findall(
            rf"^(none|read_mostly|read_mostly, off to write): the write took ({NUMBER}) faults, moved ({NUMBER}) MiB "
            rf"to the GPU, invalidated ({NUMBER}) MiB of copies(?: on ([\w:, ]+))?, ({NUMBER}) ms \(({NUMBER}) µs a "
            rf"fault\); the run ({NUMBER}) ms$", printed, re.M):
        rows[advice] = {"faults": number(faults), "moved": number(moved), "dropped": number(dropped), "on": where,
                        "ms": number(ms), "us": number(us), "run": number(run)}
    assert set(rows) == {"none", "read_mostly", "read_mostly, off to write"}, printed
    return rows | {"text": printed}


def test_every_advice_beats_none_and_each_wins_where_the_text_says(findings):
    ms, x = findings["ms"], findings["x"]
    for steps in (1, 16):
        none = ms[steps, "none"]
        assert all(ms[steps, a] < none for a in ADVICES[1:]), ms
        assert x[steps, "none"] == 1.0 and all(x[steps, a] > 1.0 for a in ADVICES[1:])
    # "Read once, it [AccessedBy] is the fastest"; "Read often, it [ReadMostly] is the fastest".
    assert min(ADVICES, key=lambda a: ms[1, a]) == "accessed_by"
    assert min(ADVICES, key=lambda a: ms[16, a]) == "read_mostly"
    # "The mapping advices pay the link at every read": more steps cost them more than they cost ReadMostly.
    grown = {a: ms[16, a] - ms[1, a] for a in ADVICES}
    assert grown["read_mostly"] < min(grown["accessed_by"], grown["preferred_location"])


def test_the_faults_and_bytes_are_made_as_the_text_says(findings):
    pages, faults, moved = findings["pages"], findings["faults"], findings["moved"]
    assert pages == 256 * 2**20 // 4096
    fill = faults[16, "accessed_by"]                     # "768, the fill's alone"
    assert faults[1, "accessed_by"] == fill and all(f >= fill for f in faults.values())   # "which every row has"
    gpu, host = said("16 steps of {n} for the GPU and {n} for the host", findings["md"])
    assert gpu == pages and host == fill                # one fault a page for the GPU; the host as in its fill
    assert faults[16, "none"] == fill + 16 * (gpu + host)
    # ReadMostly and PreferredLocation: the GPU's first read faults each page once, whatever the steps.
    for advice in ("read_mostly", "preferred_location"):
        assert faults[1, advice] == faults[16, advice] == pages + fill
    assert moved["none"] == (16 * 256, 16 * 256)        # the table each way, every step
    assert moved["read_mostly"] == (256, 0)             # one copy to the GPU, nothing back
    assert moved["preferred_location"] == moved["accessed_by"] == (0, 0)


def test_every_number_the_findings_state_is_printed(findings):
    text = findings["md"]
    assert numbers(text) <= numbers(findings["text"]), numbers(text) - numbers(findings["text"])
    ms, x, faults, moved = findings["ms"], findings["x"], findings["faults"], findings["moved"]
    pages = findings["pages"]
    assert said("from {n} ms to {n} ms, with {n} MiB moved each way and {n} faults", text) == [
        ms[1, "none"], ms[16, "none"], moved["none"][0], faults[16, "none"]]
    assert said("each of the {n} pages", text) == [pages]
    assert said("nothing back, {n} faults: the {n} and the fill's {n}", text) == [
        faults[16, "read_mostly"], pages, faults[16, "accessed_by"]]
    assert said("only from {n} ms (one step) to {n} ms", text) == [ms[1, "read_mostly"], ms[16, "read_mostly"]]
    assert said("Read often, it is the fastest: {n}x at 16 steps", text) == [x[16, "read_mostly"]]
    assert said("faults the same {n} times", text) == [faults[1, "preferred_location"] - faults[1, "accessed_by"]]
    assert said("Read once, it is the fastest: {n} ms ({n}x), where PreferredLocation's {n} mapping faults cost it "
                "{n} ms", text) == [ms[1, "accessed_by"], x[1, "accessed_by"],
                                    faults[1, "preferred_location"] - faults[1, "accessed_by"],
                                    ms[1, "preferred_location"]]
    assert said("AccessedBy goes from {n} ms to {n} ms and PreferredLocation from {n} ms to {n} ms, while "
                "ReadMostly's one copy pays for itself ({n} ms)", text) == [
        ms[1, "accessed_by"], ms[16, "accessed_by"], ms[1, "preferred_location"], ms[16, "preferred_location"],
        ms[16, "read_mostly"]]


def test_the_read_mostly_write_trap_costs_what_the_text_says(trap, findings):
    none, advised, off = trap["none"], trap["read_mostly"], trap["read_mostly, off to write"]
    pages = findings["pages"]
    # The same faults, one per page, in all three writes.
    assert none["faults"] == advised["faults"] == off["faults"] == pages
    # Under ReadMostly the write moves nothing and drops the host's copy of every page ...
    assert advised["moved"] == 0 and advised["dropped"] == 256 and advised["on"] == "host"
    assert none["moved"] == 256 and none["dropped"] == 0 and none["on"] == ""
    # ... one page at a time: hundreds of times what a fault costs without the advice.
    assert advised["us"] > 100 * none["us"] and advised["ms"] > 100 * none["ms"]
    assert advised["us"] == pytest.approx(advised["ms"] * 1e3 / advised["faults"], abs=0.05)
    # Off before the write: the GPU's copies go at once, and the write costs what it does without advice.
    assert off["dropped"] == 256 and off["on"] == "gpu:0" and off["moved"] == 256 and off["ms"] == none["ms"]
    # The runs: ReadMostly's reads are the cheapest, yet its run is the slowest; off to write is the fastest.
    assert advised["run"] > 10 * none["run"] and off["run"] < none["run"]
    assert advised["run"] > advised["ms"] > none["run"]


def test_every_number_the_trap_text_states_is_printed(cells, trap, findings):
    text = cells["trap-findings-md"].source
    printed = trap["text"] + findings["text"]
    assert numbers(text) <= numbers(printed), numbers(text) - numbers(printed)
    none, advised, off = trap["none"], trap["read_mostly"], trap["read_mostly, off to write"]
    assert said("All three writes take the same {n} faults", text) == [none["faults"]]
    assert said("pull {n} MiB over", text) == [none["moved"]]
    assert said("services together: {n} ms, {n} µs a fault", text) == [none["ms"], none["us"]]
    assert said("moves nothing ({n} MiB)", text) == [advised["moved"]]
    assert said("({n} MiB of copies on host)", text) == [advised["dropped"]]
    assert said("page by page, {n} µs a fault: {n} ms", text) == [advised["us"], advised["ms"]]
    assert said("({n} ms for 16 steps, against {n} ms without advice)", text) == [
        findings["ms"][16, "read_mostly"], findings["ms"][16, "none"]]
    assert said("ends the slowest run here: {n} ms, against {n} ms", text) == [advised["run"], none["run"]]
    assert said("the same {n} MiB invalidated, this time the GPU's (on gpu:0)", text) == [off["dropped"]]
    assert said("as with no advice, {n} MiB in {n} ms", text) == [off["moved"], off["ms"]]
    assert said("fastest of the three, {n} ms", text) == [off["run"]]
    assert off["run"] == min(r["run"] for r in (none, advised, off))


def test_the_notebook_ends_with_the_experiment_drawn(cells):
    plot = cells["plot"]
    kinds = {kind for o in plot.outputs if o.output_type == "display_data" for kind in o.data}
    assert "application/vnd.bokehjs_exec.v0+json" in kinds, kinds
    assert list(cells)[-1] == "plot"
