"""The advisor notebook finds the ReadMostly trap first, and its changes, made in the code, measure what the advisor
predicted, as its text says."""

from __future__ import annotations

import re

import pytest

from uvm_lab.advisor import MIN_GAIN

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from tests.unit.test_notebooks import NUMBER, ROOT, _execute, number, numbers, said, stdout  # noqa: E402

NAME = "08-the-advisor.ipynb"
#: The cells the tests read, by id.
IDS = ("intro", "setup", "workload", "record", "advise", "findings", "findings-md", "apply", "apply-findings-md",
       "what-if", "what-if-md", "what-if-findings-md", "without-accesses")
MiB = 1 << 20
PAGE = 4096
#: The changes, as the text gives them.
KEEP_ON_HOST = 'inputs.preferred_location = "host"; inputs.accessed_by = "gpu"'
PREFETCH = 'inputs.prefetch("gpu")   # before the kernel'



@pytest.fixture(scope="module")
def cells():
    """The notebook, executed once; {cell id: cell}."""
    return {c.id: c for c in _execute(NAME)}


@pytest.fixture(scope="module")
def run(cells):
    """What the record cell printed: the sizes, and the recorded run's ms, MiB each way and GPU faults."""
    printed = stdout(cells["record"])
    weights, head, inputs, steps = said("weights {n} MiB (the optimizer writes its last {n} MiB), inputs {n} MiB, "
                                        "{n} steps", printed)
    ms, htod, dtoh, faults = said("recorded: {n} ms, {n} MiB to the GPU, {n} MiB back, {n} GPU faults", printed)
    return {"weights": weights, "head": head, "inputs": inputs, "steps": steps, "ms": ms, "htod": htod,
            "dtoh": dtoh, "faults": faults}


@pytest.fixture(scope="module")
def advice(cells):
    """What the findings cell printed: each recommendation in rank order, the baseline, and the trap's cost."""
    printed = stdout(cells["findings"])
    recs = [{"rank": int(rank), "pattern": pattern, "name": name, "cell": int(cell), "line": int(line),
             "evidence": evidence, "code": code, "before": number(before), "after": number(after),
             "gain": number(gain), "faults": (number(f0), number(f1)), "moved": (number(m0), number(m1))}
            for rank, pattern, name, cell, line, evidence, code, before, after, gain, f0, f1, m0, m1 in re.findall(
                rf"^(\d+)\. (\w+) in (\w+), at In \[(\d+)\], line (\d+): (.*)\n   (.*)\n   ({NUMBER}) ms -> "
                rf"({NUMBER}) ms, ({NUMBER})% faster; GPU faults ({NUMBER}) -> ({NUMBER}); MiB moved ({NUMBER}) -> "
                rf"({NUMBER})$", printed, re.M)]
    baseline, recorded = said("replayed as recorded: {n} ms; recorded: {n} ms", printed)
    faults, ms, us = said("the trap: {n} GPU faults more under ReadMostly, {n} ms, {n} µs a fault", printed)
    assert recs, printed
    return {"recs": recs, "baseline": baseline, "recorded": recorded, "trap": (faults, ms, us), "text": printed}


@pytest.fixture(scope="module")
def applied(cells):
    """What the apply cell printed: predicted and measured ms and the speed-up by run; change 2's savings."""
    printed = stdout(cells["apply"])
    row = (rf"^(as recorded|change 1|changes 1 and 2): predicted ({NUMBER}) ms, measured ({NUMBER}) ms, "
           rf"({NUMBER})x as fast as recorded$")
    rows = {name: {"predicted": number(p), "measured": number(m), "x": number(x)}
            for name, p, m, x in re.findall(row, printed, re.M)}
    assert set(rows) == {"as recorded", "change 1", "changes 1 and 2"}, printed
    alone, alone_pct, after, after_pct = said("change 2 saves {n} ms of the run as recorded ({n}%), {n} ms after "
                                              "change 1 ({n}%)", printed)
    return rows | {"alone": (alone, alone_pct), "after": (after, after_pct), "text": printed}


@pytest.fixture(scope="module")
def what_if(cells):
    """What the what-if cell printed, by device memory in MiB: ms, MiB evicted, GPU faults."""
    printed = stdout(cells["what-if"])
    rows = {number(size) * (1024 if unit == "GiB" else 1): {"ms": number(ms), "evicted": number(ev),
                                                           "faults": number(f)}
            for size, unit, ms, ev, f in re.findall(rf"^({NUMBER})(MiB|GiB): ({NUMBER}) ms, ({NUMBER}) MiB evicted, "
                                                    rf"({NUMBER}) GPU faults$", printed, re.M)}
    assert set(rows) == {192, 4 * 1024, 80 * 1024}, printed
    return rows | {"text": printed}


def source_line(cells, cell: int, line: int) -> str:
    """Line ``line`` of the code cell that ran as ``In [cell]``."""
    (ran,) = [c for c in cells.values() if c.cell_type == "code" and c.execution_count == cell]
    return ran.source.splitlines()[line - 1]


def test_the_committed_notebook_has_the_cells_the_tests_read():
    nb = nbformat.read(ROOT / "notebooks" / NAME, as_version=4)
    ids = [c.id for c in nb.cells]
    assert set(IDS) <= set(ids) and len(ids) == len(set(ids))
    assert "%load_ext uvm_lab" in nb.cells[ids.index("setup")].source   # sources name the notebook's cells


def test_the_run_as_recorded_moves_and_faults_what_the_text_says(run, cells):
    pages = run["inputs"] * MiB // PAGE                     # one batch
    assert (run["weights"], run["head"], run["inputs"], run["steps"]) == (256, 2, 16, 4)
    assert run["htod"] == run["weights"] + run["steps"] * run["inputs"]   # the prefetch, and every batch
    assert run["dtoh"] == (run["steps"] - 1) * run["inputs"]              # all the batches but the last
    assert run["faults"] == run["steps"] * pages + run["head"] * MiB // PAGE
    text = cells["findings-md"].source
    assert said("moved {n} MiB to the GPU (the weights' prefetch, {n} MiB, and the batches) and {n} MiB back, and "
                "took {n} GPU faults: the batches' {n} and the head's {n}.", text) == [
        run["htod"], run["weights"], run["dtoh"], run["faults"], run["steps"] * pages, run["head"] * MiB // PAGE]


def test_the_top_recommendation_is_the_read_mostly_trap_at_the_line_that_sets_it(advice, cells):
    first, second, third = advice["recs"]
    assert (first["pattern"], first["name"], first["code"]) == ("read_mostly_written", "weights",
                                                                "weights.read_mostly = False")
    assert source_line(cells, first["cell"], first["line"]).strip() == "weights.read_mostly = True"
    assert (second["pattern"], second["name"], second["code"]) == ("ping_pong", "inputs", KEEP_ON_HOST)
    assert (third["pattern"], third["name"], third["code"]) == ("gpu_first_touch", "inputs", PREFETCH)
    # "at the kernel's read of the batch"; "the same line".
    assert (second["cell"], second["line"]) == (third["cell"], third["line"])
    assert source_line(cells, second["cell"], second["line"]).strip().startswith('ul.touch(inputs, on="gpu"')
    text = cells["findings-md"].source
    for rec in (first, second, third):
        assert f"**`{rec['pattern']}`, in `{rec['name']}`**" in text and rec["code"].split("   #")[0] in text


def test_the_gains_are_real_and_ranked(advice, run, cells):
    recs = advice["recs"]
    assert [r["rank"] for r in recs] == list(range(1, len(recs) + 1))
    # A replay on the simulator is exact: the baseline is the recording's time.
    assert advice["baseline"] == advice["recorded"] == run["ms"]
    assert all(r["before"] == advice["baseline"] for r in recs)
    gains = [r["gain"] for r in recs]
    assert all(g >= MIN_GAIN * 100 for g in gains) and gains == sorted(gains, reverse=True)
    assert [r["after"] for r in recs] == sorted(r["after"] for r in recs)
    for r in recs:
        assert r["gain"] == pytest.approx((1 - r["after"] / r["before"]) * 100, abs=0.1)
    assert said("keeps only the changes that save at least {n}% of the time", cells["intro"].source) == [
        MIN_GAIN * 100]


def test_the_patterns_are_made_as_the_text_says(advice, run):
    trap, ping_pong, first_touch = advice["recs"]
    head_pages = run["head"] * MiB // PAGE
    faults, ms, us = advice["trap"]
    # The trap: one more fault for each page of the head, once; the same bytes moved.
    assert faults == head_pages == trap["faults"][0] - trap["faults"][1]
    assert ms == pytest.approx(trap["before"] - trap["after"], abs=0.15) and ms > trap["after"]
    assert us == pytest.approx(ms * 1e3 / faults, abs=0.1)
    assert trap["moved"][0] == trap["moved"][1] == run["htod"] + run["dtoh"]
    # Ping-pong: every batch in, all but the last back; kept on the host, the GPU faults only the head and moves
    # only the weights' prefetch.
    assert said("{n} MiB to the GPU and {n} MiB back on demand, of {n} MiB", ping_pong["evidence"]) == [
        run["steps"] * run["inputs"], run["dtoh"], run["inputs"]]
    assert ping_pong["faults"][1] == head_pages and ping_pong["moved"][1] == run["weights"]
    # First touch: one fault for each page of each batch; the prefetch ends them but still moves the batches.
    assert said("{n} GPU faults moved", first_touch["evidence"]) == [run["steps"] * run["inputs"] * MiB // PAGE]
    assert first_touch["faults"][1] == head_pages and first_touch["moved"][1] == first_touch["moved"][0]
    assert first_touch["after"] > ping_pong["after"]


def test_the_changes_made_in_the_code_measure_what_was_predicted(applied, advice):
    recorded, one, both = applied["as recorded"], applied["change 1"], applied["changes 1 and 2"]
    for row in (recorded, one, both):
        assert row["measured"] == pytest.approx(row["predicted"], rel=0.01)
    assert recorded["predicted"] == advice["baseline"] and one["predicted"] == advice["recs"][0]["after"]
    assert both["measured"] < one["measured"] < recorded["measured"] and recorded["x"] == 1.0
    for row in (one, both):
        assert row["x"] == pytest.approx(recorded["measured"] / row["measured"], abs=0.01)
    # Change 2 saves the same ms with or without change 1: a larger share once change 1 is made.
    alone, after = applied["alone"], applied["after"]
    second = advice["recs"][1]
    assert alone[0] == pytest.approx(second["before"] - second["after"], abs=0.15) and alone[1] == second["gain"]
    assert after[0] == pytest.approx(one["measured"] - both["measured"], abs=0.15)
    assert after[1] == pytest.approx(after[0] / one["measured"] * 100, abs=0.1) and after[1] > alone[1]


def test_less_memory_than_the_weights_is_slower_and_more_changes_nothing(what_if, applied, run):
    less, recorded_on, more = what_if[192], what_if[4 * 1024], what_if[80 * 1024]
    assert run["weights"] > 192                                            # "less than the weights"
    assert less["ms"] > recorded_on["ms"] == more["ms"] == applied["changes 1 and 2"]["measured"]
    assert recorded_on["evicted"] == more["evicted"] == 0 and recorded_on["faults"] == more["faults"] == 0
    # "every step faults every page of them back in"; "more than four times the weights".
    assert less["faults"] == run["steps"] * run["weights"] * MiB // PAGE
    assert less["evicted"] > run["steps"] * run["weights"]


def test_every_number_the_text_states_is_printed(cells, run, advice, applied, what_if):
    printed = "".join(stdout(c) for c in cells.values() if c.cell_type == "code")
    for cell in cells.values():
        if cell.cell_type == "markdown" and cell.id != "intro":   # the intro's one number: MIN_GAIN, above
            assert numbers(cell.source) <= numbers(printed), (cell.id, numbers(cell.source) - numbers(printed))
    trap, ping_pong, first_touch = advice["recs"]
    text = cells["findings-md"].source
    assert said("The trace replayed as recorded takes {n} ms", text) == [advice["baseline"]]
    assert said("{n} GPU faults more, one for each page of the head, that cost {n} ms, {n} µs a fault", text) == list(
        advice["trap"])
    assert said("takes the run to {n} ms, {n}% faster, with the same {n} MiB moved", text) == [
        trap["after"], trap["gain"], trap["moved"][1]]
    assert said("{n} MiB to the GPU and {n} MiB back, for a batch of {n} MiB", text) == [
        run["steps"] * run["inputs"], run["dtoh"], run["inputs"]]
    assert said('inputs.accessed_by = "gpu"`, {n} ms, {n}% faster', text) == [ping_pong["after"], ping_pong["gain"]]
    assert said("the {n} GPU faults left are the head's, and the {n} MiB moved", text) == [
        ping_pong["faults"][1], ping_pong["moved"][1]]
    assert said("the same line: {n} GPU faults", text) == [first_touch["faults"][0] - first_touch["faults"][1]]
    assert said("both ways ({n} MiB, as before): {n} ms, {n}% faster", text) == [
        first_touch["moved"][1], first_touch["after"], first_touch["gain"]]
    text = cells["apply-findings-md"].source
    one, both = applied["change 1"], applied["changes 1 and 2"]
    assert said("the run takes {n} ms, as predicted: {n}x", text) == [one["measured"], one["x"]]
    assert said("With both changes it takes {n} ms, as predicted too: {n}x", text) == [both["measured"], both["x"]]
    assert applied["alone"][0] == applied["after"][0]                      # "the same ms with or without"
    assert said("saves the same {n} ms with or without the first, but that was {n}% of the run as recorded and is "
                "{n}% of the run", text) == [applied["after"][0], applied["alone"][1], applied["after"][1]]
    text = cells["what-if-findings-md"].source
    less, recorded_on, more = what_if[192], what_if[4 * 1024], what_if[80 * 1024]
    assert said("On {n} MiB the weights no longer fit", text) == [192]
    assert said("{n} GPU faults over the {n} steps, and {n} MiB are evicted", text) == [
        less["faults"], run["steps"], less["evicted"]]
    assert said("The run takes {n} ms, against {n} ms on {n} GiB. On {n} GiB it takes {n} ms", text) == [
        less["ms"], recorded_on["ms"], 4, 80, more["ms"]]
