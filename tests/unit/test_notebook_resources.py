"""The choosing-a-resource notebook ranks the resources as its text says, with the numbers it prints."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("jupyter_bokeh")

from tests.unit.test_notebooks import _execute, number, result, stdout
from uvm_lab.units import PAGE_SIZE

NOTEBOOK = "07-choosing-a-resource.ipynb"
GiB = 1 << 30
DEVICE = ("cuda", "async", "pool over async", "arena over async")   # the resources of device memory
RAN = re.compile(r"^(.+?): ([\d.]+) ms \(([\d.]+) loading, ([\d.]+) in the kernels\), ([\d,]+) faults, "
                 r"([\d.]+) GiB to the GPU, ([\d.]+) GiB to the host \(([\d.]+) GiB evicted\)$", re.M)


@pytest.fixture(scope="module")
def resources():
    """The notebook, executed once; returns {cell id: cell}."""
    return {c.id: c for c in _execute(NOTEBOOK)}


def _named(line: str, unit: str = "") -> dict[str, float]:
    """``"a 1.0 ms, b c 2.0 ms"`` as ``{"a": 1.0, "b c": 2.0}``."""
    return {m[1]: number(m[2]) for m in (re.fullmatch(rf"(.+) ([\d.,]+){unit}", item) for item in line.split(", "))}


def _said(text: str, pattern: str) -> tuple[str, ...]:
    """The groups of ``pattern`` in markdown ``text``, its line breaks read as spaces."""
    found = re.search(pattern, " ".join(text.split()))
    assert found, f"the text no longer says {pattern!r}"
    return found.groups()


@pytest.fixture(scope="module")
def fits(resources):
    """What the fitting workload's findings cell printed."""
    printed = stdout(resources["fits-findings"])
    steps, times = re.search(r"^(\d+) steps: (.*)$", printed, re.M).groups()
    return {"steps": int(steps), "ms": _named(times, " ms"),
            "ratio": float(re.search(r"^managed over async: ([\d.]+)x$", printed, re.M)[1]),
            "allocations": _named(re.search(r"^allocations that reached the device: (.*)$", printed, re.M)[1]),
            "faults": _named(re.search(r"^GPU faults: (.*)$", printed, re.M)[1])}


@pytest.fixture(scope="module")
def larger(resources):
    """What the larger-than-the-GPU findings cell printed: refusals by setup, and the runs' numbers."""
    printed = stdout(resources["larger-findings"])
    refused = dict(re.findall(r"^(.+?): refused: (.*)$", printed, re.M))
    names = ("ms", "loading", "kernels", "faults", "to_gpu", "to_host", "evicted")
    ran = {m[0]: dict(zip(names, map(number, m[1:]), strict=True)) for m in RAN.findall(printed)}
    return refused, ran


def test_device_memory_is_the_fastest_where_it_fits_and_the_clock_cannot_tell_it_apart(fits, resources):
    ms = fits["ms"]
    assert set(DEVICE) < set(ms) and len(ms) == 6
    assert len({ms[r] for r in DEVICE}) == 1                       # "take the same ... ms"
    assert min(ms.values()) == ms["async"] < ms["pool over managed"] < ms["managed"]
    assert fits["ratio"] == round(ms["managed"] / ms["async"], 1)
    text = resources["fits-findings-md"].source
    (same,) = _said(text, r"take the same ([\d.]+) ms")
    assert float(same) == ms["async"]
    managed, ratio = _said(text, r"`managed` takes ([\d.]+) ms, ([\d.]+)x `async`")
    assert float(managed) == ms["managed"] and float(ratio) == fits["ratio"]
    (pooled,) = _said(text, r"That pool takes ([\d.]+) ms")
    assert float(pooled) == ms["pool over managed"]


def test_pools_reach_the_device_once_where_cudamalloc_reaches_it_every_step(fits, resources):
    allocations = fits["allocations"]
    assert allocations["cuda"] == allocations["managed"] == fits["steps"]
    assert all(allocations[r] == 1 for r in ("async", "pool over async", "arena over async", "pool over managed"))
    (times,) = _said(resources["fits-findings-md"].source, r"`cuda` reached the device (\d+) times")
    assert int(times) == allocations["cuda"]


def test_managed_memory_faults_every_new_buffer_in_and_a_pool_only_the_first(fits, resources):
    faults = fits["faults"]
    assert all(faults[r] == 0 for r in DEVICE)
    assert faults["managed"] == fits["steps"] * faults["pool over managed"] > 0
    total, times, pooled = _said(resources["fits-findings-md"].source,
                                 r"([\d,]+) faults in all, (\d+) times the ([\d,]+) that `pool over managed` takes")
    assert (number(total), int(times), number(pooled)) == (faults["managed"], fits["steps"],
                                                             faults["pool over managed"])


def test_device_memory_refuses_data_larger_than_the_gpu_and_measures_nothing(larger, resources):
    refused, ran = larger
    assert set(refused) == {"cuda", "async", "pool over async", "managed"}
    assert all("cannot allocate 1.5 GiB" in message for message in refused.values())
    assert "oversubscription is off" in refused["managed"]
    assert set(ran) and all(name.startswith("oversubscribing managed") for name in ran)
    # The table's rows for them: "refused", and 0 ms.
    rows = [line.split() for line in result(resources["larger"]).splitlines() if " refused " in line]
    assert len(rows) == len(refused)
    assert all(float(row[row.index("refused") + 1]) == 0 for row in rows)


def test_prefetching_each_piece_is_the_fastest_way_past_the_gpu(larger):
    _, ran = larger
    faulting = ran["oversubscribing managed"]
    adaptor = ran["oversubscribing managed + adaptor"]
    piece = ran["oversubscribing managed + piece prefetch"]
    assert piece["ms"] < adaptor["ms"] < faulting["ms"]
    # The same bytes every way; the kernels' faults are one per page they read, and prefetching takes them away.
    assert piece["to_gpu"] == adaptor["to_gpu"] == faulting["to_gpu"]
    assert faulting["faults"] - piece["faults"] == faulting["to_gpu"] * GiB / PAGE_SIZE
    # The adaptor's kernels cost what faulting's do: it gains in loading alone.
    assert adaptor["kernels"] == faulting["kernels"] and adaptor["loading"] < faulting["loading"]
    assert piece["kernels"] < faulting["kernels"]


def test_the_larger_than_the_gpu_text_states_the_numbers_printed(larger, resources):
    _, ran = larger
    faulting = ran["oversubscribing managed"]
    adaptor = ran["oversubscribing managed + adaptor"]
    piece = ran["oversubscribing managed + piece prefetch"]
    text = resources["larger-findings-md"].source
    moved, evicted = _said(text, r"once a pass \(([\d.]+) GiB\) and evicts ([\d.]+) GiB")
    assert all(run["to_gpu"] == float(moved) for run in ran.values())
    assert faulting["evicted"] == piece["evicted"] == float(evicted) < adaptor["evicted"]
    assert tuple(map(number, _said(text, r"Faulting alone takes ([\d.]+) ms and ([\d,]+) faults"))) == (
        faulting["ms"], faulting["faults"])
    assert tuple(map(number, _said(text, r"takes ([\d.]+) ms with ([\d,]+) faults, all of them the host's"))) == (
        piece["ms"], piece["faults"])
    assert tuple(map(float, _said(text, r"its kernels take ([\d.]+) ms against ([\d.]+),"))) == (
        piece["kernels"], faulting["kernels"])
    assert tuple(map(float, _said(text, r"`PrefetchResourceAdaptor` takes ([\d.]+) ms, and its kernels the same "
                                        r"([\d.]+) ms"))) == (adaptor["ms"], adaptor["kernels"])
    assert tuple(map(float, _said(text, r"loading, ([\d.]+) ms against ([\d.]+),"))) == (
        adaptor["loading"], faulting["loading"])
    assert tuple(map(float, _said(text, r"\(([\d.]+) GiB to the host, ([\d.]+) of them evicted\)"))) == (
        adaptor["to_host"], adaptor["evicted"])


def test_the_notebook_ends_with_a_bokeh_figure(resources):
    kinds = [k for o in resources["plot"].outputs if o.output_type == "display_data" for k in o.data]
    assert "application/vnd.bokehjs_exec.v0+json" in kinds
