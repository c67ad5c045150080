"""The widget dashboard on the simulator: collectors agree with ul.residency, the controls act on the
kernel-side buffer through its public entry points, and the bokeh sources show the result."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("bokeh")
pytest.importorskip("jupyter_bokeh")

from bokeh.models import ColumnDataSource, HoverTool

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.jupyter.dashboard import Dashboard, collect_snapshot
from uvm_lab.jupyter.dashboard import dashboard as dashboard_module
from uvm_lab.jupyter.dashboard.base import update_source
from uvm_lab.jupyter.dashboard.collect import (
    EventTotals,
    LiveAllocations,
    bin_states,
    category_pages,
    shown_categories,
)
from uvm_lab.jupyter.dashboard.residency import ResidencyMap, ResidencyOverview
from uvm_lab.jupyter.dashboard.statistics import statistics_rows
from uvm_lab.jupyter.dashboard.text import format_status
from uvm_lab.jupyter.palette import PALETTE
from uvm_lab.page_states import CATEGORY_NAMES
from uvm_lab.units import format_bytes

from .clocks import ManualClock
from .waiting import eventually

# Category codes (page_states.CATEGORY_NAMES), as the maps colour them.
NOWHERE, HOST, BOTH, UNKNOWN, GPUS, GPU0, GPU1 = 0, 1, 2, 3, 4, 5, 6
NO_PAGES = dict.fromkeys(CATEGORY_NAMES, 0)
MiB = 1 << 20


@pytest.fixture
def sim(sim_backend):
    """The conftest's fresh simulated 4 GiB GPU, with plain managed memory as the current resource."""
    ul.mr.set_current_device_resource(ul.mr.ManagedMemoryResource())
    return sim_backend


@pytest.fixture
def dash(sim):
    d = Dashboard(interval=0.05)
    yield d
    d.close()


def grid_counts(component):
    """Pages per category over every cell a residency view draws."""
    data = component.source.data
    return {name: int(np.sum(data[name])) for name in CATEGORY_NAMES}


def legend_labels(component):
    return [item.label.value for item in component.legend.legend.items]


def two_gpu_snapshot(sim, states):
    """A snapshot as a two-GPU device with one allocation holding ``states`` would give (the simulator has one)."""
    buf = ul.DeviceBuffer(size=len(states) * 4096, label="mixed")
    snap = collect_snapshot()
    alloc = next(a for a in snap["allocations"] if a["id"] == buf.id)
    alloc.update(states=states, category_pages=category_pages(states))
    return {**snap, "device_count": 2, "allocations": [alloc]}, buf


# -- collectors: plain data that agrees with the public API ---------------------------------------

def test_snapshot_matches_residency_and_mem_info(sim):
    a = ul.DeviceBuffer(size="8MiB", label="a")
    b = ul.DeviceBuffer(size="2MiB", label="b")
    a.prefetch("gpu")
    ul.touch(b, on="host", mode="write")
    snap = collect_snapshot()
    assert snap["backend"] == "sim"
    free, total = sim.mem_info()
    assert snap["memory"] == {"free": free, "total": total, "used": total - free,
                              "devices": [{"device": 0, "free": free, "total": total, "used": total - free}]}
    by_id = {x["id"]: x for x in snap["allocations"]}
    assert [x["id"] for x in snap["allocations"]][-2:] == [a.id, b.id]   # oldest first
    for buf in (a, b):
        res = ul.residency(buf)
        got = by_id[buf.id]
        assert got["label"] == buf.label and got["size"] == buf.size and got["is_managed"]
        assert np.array_equal(got["states"], res.states)
        assert sum(got["category_pages"].values()) == len(res.states)
        assert got["advice"] == {"read_mostly": False, "preferred_location": None, "accessed_by": ()}
    assert by_id[a.id]["category_pages"] == {**NO_PAGES, "gpu:0": 2048}
    assert by_id[b.id]["category_pages"] == {**NO_PAGES, "host": 512}


def test_the_status_statistics_and_header_show_each_gpus_memory():
    ul.use_backend("sim", devices=2, device_memory="256MiB")
    buf = ul.DeviceBuffer(size="8MiB", label="on-gpu1")
    try:
        buf.prefetch("gpu:1")
        snap = collect_snapshot()
        memory = snap["memory"]
        assert memory["devices"] == [
            {"device": 0, "free": 256 * MiB, "total": 256 * MiB, "used": 0},
            {"device": 1, "free": 248 * MiB, "total": 256 * MiB, "used": 8 * MiB}]
        assert (memory["free"], memory["total"]) == (256 * MiB, 256 * MiB)   # the current GPU's, as before
        status = format_status(snap).splitlines()
        assert "GPU 0 memory: 0 B used, 256 MiB free, 256 MiB total" in status
        assert "GPU 1 memory: 8 MiB used, 248 MiB free, 256 MiB total" in status
        rows = dict(statistics_rows(snap))
        assert rows["GPU 0 memory used"] == "0 B of 256 MiB (0.0%)"
        assert rows["GPU 1 memory used"] == "8 MiB of 256 MiB (3.1%)" and rows["GPU 1 memory free"] == "248 MiB"
        assert "device memory used" not in rows
        header = dashboard_module.Dashboard._header(snap)
        assert "GPU 0 memory 0 B used of 256 MiB · GPU 1 memory 8 MiB used of 256 MiB" in header
    finally:
        buf.close()


def test_one_gpus_memory_reads_as_it_always_did(sim):
    buf = ul.DeviceBuffer(size="8MiB", label="one")
    buf.prefetch("gpu")
    snap = collect_snapshot()
    free, total = sim.mem_info()
    assert f"device memory: 8 MiB used, {format_bytes(free)} free, {format_bytes(total)} total" in format_status(snap)
    assert dict(statistics_rows(snap))["device memory free"] == format_bytes(free)
    assert "device memory 8 MiB used of" in dashboard_module.Dashboard._header(snap)


def test_snapshot_is_a_copy(sim):
    a = ul.DeviceBuffer(size="1MiB")
    snap = collect_snapshot()
    states = next(x for x in snap["allocations"] if x["id"] == a.id)["states"].copy()
    a.prefetch("host")
    assert np.array_equal(next(x for x in snap["allocations"] if x["id"] == a.id)["states"], states)


def test_bin_states_counts_every_page_once_by_category():
    # host x5, gpu:0 x3, both x2, nowhere, gpu:1, unknown x2, host+unknown, gpu:0+gpu:1
    states = np.array([1] * 5 + [2] * 3 + [3] * 2 + [0, 4, 0x80, 0x80, 0x81, 6], dtype=np.uint8)
    bins = bin_states(states, 4)
    assert list(bins["first"]) == [0, 4, 8, 12] and list(bins["last"]) == [3, 7, 11, 15]
    assert {name: int(bins[name].sum()) for name in CATEGORY_NAMES} == {
        **NO_PAGES, "host": 5, "gpu:0": 3, "both": 2, "nowhere": 1, "gpu:1": 1, "unknown": 3, "gpus": 1}
    assert bins["gpu:1"].tolist() == [0, 0, 1, 0] and bins["unknown"].tolist() == [0, 0, 0, 3]
    # the majority of each bin: host x4 | host, gpu:0 x3 | both x2, nowhere, gpu:1 | unknown x3, gpus
    assert bins["category"].tolist() == [HOST, GPU0, BOTH, UNKNOWN]
    assert all(len(v) == 0 for v in bin_states(np.zeros(0, np.uint8), 8).values())


def test_bin_states_page_by_page_keeps_every_category():
    states = np.array([0, 1, 2, 4, 3, 0x80, 0x81, 6], dtype=np.uint8)
    bins = bin_states(states, 100)
    assert bins["category"].tolist() == [NOWHERE, HOST, GPU0, GPU1, BOTH, UNKNOWN, UNKNOWN, GPUS]
    assert list(bins["first"]) == list(bins["last"]) == list(range(8))


def test_bin_states_refuses_bad_input():
    with pytest.raises(InvalidArgumentError, match="n_bins"):
        bin_states(np.zeros(4, np.uint8), 0)
    with pytest.raises(InvalidArgumentError, match="1-D"):
        bin_states(np.zeros((2, 2), np.uint8), 4)
    with pytest.raises(InvalidArgumentError, match=r"0\.\.255"):
        bin_states(np.array([300]), 4)


def test_shown_categories_name_each_gpu_of_the_device_and_unknown():
    assert shown_categories(1) == ("gpu:0", "host", "both", "unknown", "nowhere")
    assert shown_categories(2) == ("gpu:0", "gpu:1", "gpus", "host", "both", "unknown", "nowhere")
    assert shown_categories(0) == ("host", "both", "unknown", "nowhere")
    # a category holding pages is listed even where the device would not have it
    assert shown_categories(1, {"gpu:3"}) == ("gpu:0", "gpu:3", "host", "both", "unknown", "nowhere")
    with pytest.raises(InvalidArgumentError, match="'gpu'"):
        shown_categories(1, {"gpu"})
    with pytest.raises(InvalidArgumentError, match="device_count"):
        shown_categories(-1)


def test_event_totals_add_up_to_the_trace_summary(sim):
    a = ul.DeviceBuffer(size="4MiB")
    a.prefetch("host")
    with ul.record() as trace:
        ul.touch(a, on="gpu", mode="read")
    whole = trace.summary()
    totals = EventTotals()
    totals.feed(trace.events[:3])
    totals.feed(trace.events[3:])
    got = totals.snapshot()
    assert got["bytes_htod"] == whole["bytes_htod"] == 4 << 20
    assert got["gpu_faults"] == whole["gpu_faults"] > 0
    assert got["counts"] == whole["counts"] and got["events"] == whole["events"]


# -- components render the snapshot ----------------------------------------------------------------

def test_dashboard_shows_every_allocation_and_selects_the_newest(sim, dash):
    a = ul.DeviceBuffer(size="4MiB", label="first")
    b = ul.DeviceBuffer(size="2MiB", label="second")
    dash.refresh()
    ids = [v for _, v in dash.allocations.root.options]
    assert ids[-2:] == [a.id, b.id]
    assert list(dash.allocations.source.data["id"][-2:]) == [a.id, b.id]
    assert dash.allocations.selected == b.id
    dash.select(a.id)
    assert dash.residency.selected == dash.prefetch.selected == dash.advice.selected == a.id
    # the overview has one strip per allocation
    names = set(dash.overview.source.data["name"])
    assert any("first" in n for n in names) and any("second" in n for n in names)
    labels = dash.overview.figure.yaxis[0].major_label_overrides
    assert len(labels) == len(ul.live_buffers())
    assert labels[len(labels) - 1].startswith(f"#{b.id} second")   # newest at the bottom


def test_residency_map_agrees_with_ul_residency(sim, dash):
    a = ul.DeviceBuffer(size="6MiB", label="a")
    a.prefetch("gpu")
    dash.refresh()
    dash.select(a.id)
    pages = len(ul.residency(a).states)
    assert ul.residency(a).counts()["gpu"] == pages
    assert grid_counts(dash.residency) == {**NO_PAGES, "gpu:0": pages}
    assert dash.residency.source.data["last"][-1] == pages - 1
    assert set(dash.residency.source.data["category"]) == {GPU0}


def test_large_allocation_is_binned_into_a_bounded_grid(sim, dash):
    a = ul.DeviceBuffer(size="512MiB", label="big")
    dash.refresh()
    dash.select(a.id)
    n = len(dash.residency.source.data["x"])
    assert 0 < n <= dash.residency.columns * dash.residency.max_rows
    assert dash.residency.pages_per_cell == -(-(512 << 20) // 4096 // n)
    assert grid_counts(dash.residency) == {**NO_PAGES, "nowhere": (512 << 20) // 4096}


def test_prefetch_buttons_move_the_buffer_and_the_map_follows(sim, dash):
    a = ul.DeviceBuffer(size="8MiB", label="a")
    dash.refresh()
    dash.select(a.id)

    assert list(dash.prefetch.buttons) == ["gpu:0", "host"]   # one per GPU of the device, and the host
    dash.prefetch.buttons["host"].click()
    assert ul.residency(a).summary()["host"] == 1.0
    assert set(dash.residency.source.data["category"]) == {HOST}
    assert dash.prefetch.source.data["host"][0] == 1.0
    assert "error" not in dash.prefetch.message.value.lower()
    assert "pages now: host 100%" in dash.prefetch.where.value

    htod_before = dash.totals.snapshot()["bytes_htod"]
    dash.prefetch.buttons["gpu:0"].click()
    assert ul.residency(a).copies() == {"gpu:0": 2048}
    assert set(dash.residency.source.data["category"]) == {GPU0}
    assert grid_counts(dash.residency) == {**NO_PAGES, "gpu:0": 2048}
    assert dash.prefetch.source.data["gpu:0"][0] == 1.0
    assert "pages now: gpu:0 100%" in dash.prefetch.where.value
    # the statistics count the 8 MiB that just moved (on top of the session's earlier migrations)
    htod = dash.totals.snapshot()["bytes_htod"]
    assert htod - htod_before == 8 << 20
    row = dict(zip(dash.statistics.source.data["metric"], dash.statistics.source.data["value"], strict=True))
    assert row["migrated host → device"] == ul.format_bytes(htod)


def test_advice_controls_set_the_advice_and_read_it_back(sim, dash):
    a = ul.DeviceBuffer(size="4MiB", label="a")
    dash.refresh()
    dash.select(a.id)
    adv = dash.advice

    adv.read_mostly.value = True
    assert a.read_mostly is True
    assert adv.source.data["read_mostly"] == [True]

    adv.preferred.value = "host"
    assert a.preferred_location == "host"
    assert adv.source.data["preferred_location"] == ["host"]
    adv.preferred.value = "gpu:0"
    assert a.preferred_location == "gpu:0"
    adv.preferred.value = "none"
    assert a.preferred_location is None

    adv.accessed_by["gpu:0"].value = True
    assert a.accessed_by == ("gpu:0",)
    assert adv.source.data["accessed_by"] == ["gpu:0"]
    adv.accessed_by["gpu:0"].value = False
    assert a.accessed_by == ()

    adv.read_mostly.value = False
    assert a.read_mostly is False


def test_advice_set_in_code_shows_in_the_widgets(sim, dash):
    a = ul.DeviceBuffer(size="4MiB")
    dash.refresh()
    dash.select(a.id)
    a.read_mostly = True
    a.preferred_location = "host"
    dash.refresh()
    assert dash.advice.read_mostly.value is True
    assert dash.advice.preferred.value == "host"
    # and syncing the widgets from the backend did not call the buffer back
    assert a.read_mostly is True and a.preferred_location == "host"


def test_errors_are_shown_in_the_widget_not_raised(sim):
    # A long interval: no refresh of its own may come between the free and the click.
    with Dashboard(interval=60) as dash:
        a = ul.DeviceBuffer(size="4MiB", label="doomed")
        dash.refresh()
        dash.select(a.id)
        a_id = a.id
        a.close()                               # freed behind the dashboard's back, before it refreshed
        dash.prefetch.buttons["gpu:0"].click()  # must not raise
        msg = dash.prefetch.message.value
        assert "prefetch to gpu:0 failed" in msg and str(a_id) in msg
        assert dash.allocations.selected != a_id  # and the list has moved on


def test_no_selection_disables_the_controls(sim, dash):
    dash.select(None)
    assert dash.advice.read_mostly.disabled and dash.advice.preferred.disabled
    dash.prefetch.buttons["gpu:0"].click()
    assert "select an allocation" in dash.prefetch.message.value


def test_refresh_without_changes_sends_nothing(sim, dash):
    a = ul.DeviceBuffer(size="4MiB")
    dash.refresh()
    dash.select(a.id)
    dash.refresh()
    patches = []
    docs = {c.source.document for c in dash.components if c.source.document is not None}
    assert docs
    for doc in docs:
        doc.on_change(patches.append)
    dash.refresh()
    assert patches == []
    assert update_source(dash.residency.source, dict(dash.residency.source.data)) is False
    a.prefetch("host")
    dash.refresh()
    assert patches  # and a real change is sent


# -- live updates ------------------------------------------------------------------------------------

def test_events_from_another_thread_refresh_the_dashboard(sim, dash):
    a = ul.DeviceBuffer(size="4MiB", label="a")
    dash.refresh()
    dash.select(a.id)
    worker = threading.Thread(target=a.prefetch, args=("host",))
    worker.start()
    worker.join(5)
    assert eventually(lambda: set(dash.residency.source.data["category"]) == {HOST})


def test_a_live_refresh_reads_the_selected_map_and_a_bounded_few_others(sim, dash, monkeypatch):
    monkeypatch.setattr(dashboard_module, "OTHERS_PER_REFRESH", 0)
    a, b = ul.DeviceBuffer(size="4MiB", label="a"), ul.DeviceBuffer(size="4MiB", label="b")
    dash.refresh()
    dash.select(a.id)
    before = {alloc["id"]: alloc for alloc in dash.snapshot["allocations"]}
    b.prefetch("host")
    a.prefetch("host")
    assert eventually(lambda: set(dash.residency.source.data["category"]) == {HOST})   # the selected one, live
    assert {alloc["id"]: alloc for alloc in dash.snapshot["allocations"]}[b.id] is before[b.id]   # waits its turn
    dash.refresh()   # asked for: every changed map
    now = {alloc["id"]: alloc for alloc in dash.snapshot["allocations"]}[b.id]
    assert now["states"].tolist() == ul.residency(b).states.tolist() and now["category_pages"]["host"] == 1024


def test_bursts_of_events_are_coalesced_into_one_refresh_an_interval(sim):
    bufs = [ul.DeviceBuffer(size="64KiB") for _ in range(4)]
    clock = ManualClock()
    with Dashboard(interval=0.2, clock=clock) as d:
        start_count = d.refreshes                       # the one it draws as it opens
        for _ in range(50):                             # 400 migrations within the first interval
            for b in bufs:
                b.prefetch("gpu")
                b.prefetch("host")
        ul.events.get_bus().flush()                     # every event has reached the dashboard
        clock.settle(threads=1)
        assert d.refreshes == start_count               # it waits out the interval
        clock.advance(0.2)
        clock.settle(threads=1)
        assert d.refreshes == start_count + 1           # then draws all 400 at once
        assert {a["id"]: a["category_pages"]["host"] for a in d.snapshot["allocations"]} == {b.id: 16 for b in bufs}
        clock.advance(0.2)
        clock.settle(threads=1)
        assert d.refreshes == start_count + 1           # nothing happened since: nothing to draw


def test_a_live_dashboard_refreshes_at_most_once_a_second_unless_told_otherwise(sim):
    buf = ul.DeviceBuffer(size="64KiB")
    clock = ManualClock()
    with Dashboard(clock=clock) as d:
        start_count = d.refreshes
        buf.prefetch("gpu")
        ul.events.get_bus().flush()
        clock.settle(threads=1)
        clock.advance(0.9)
        clock.settle(threads=1)
        assert d.refreshes == start_count                    # a change waits for the second to end
        clock.advance(0.1)
        clock.settle(threads=1)
        assert d.refreshes == start_count + 1
        assert d.snapshot["allocations"][-1]["category_pages"]["gpu:0"] == 16


def test_live_refreshes_take_at_most_their_share_of_the_kernel(sim):
    buf = ul.DeviceBuffer(size="64KiB")
    clock = ManualClock(cpu_per_read=0.01)   # each refresh takes 10 ms of its thread's CPU
    with Dashboard(interval=0.05, clock=clock) as d:
        start_count = d.refreshes

        def change_and_wait(seconds: float) -> int:
            buf.prefetch("gpu")
            buf.prefetch("host")
            ul.events.get_bus().flush()
            clock.settle(threads=1)
            clock.advance(seconds)
            clock.settle(threads=1)
            return d.refreshes - start_count

        assert change_and_wait(0.05) == 1
        # 10 ms at BUSY_SHARE (5%) is paid for 0.2 s later; the next, expected to cost as much, may start once both
        # would be paid for within the burst (0.25 s): 0.15 s after the first began, not one interval (0.05 s).
        assert change_and_wait(0.1) == 1
        clock.advance(0.06)   # past 0.15 s, whatever the sums round to
        clock.settle(threads=1)
        assert d.refreshes - start_count == 2


@pytest.mark.parametrize("kwargs, message", [
    ({"interval": 0}, "interval must be a positive number of seconds"),
    ({"interval": float("nan")}, "interval must be a positive number of seconds"),
    ({"interval": "fast"}, "interval must be a positive number of seconds"),
    ({"clock": "now"}, "clock must be a uvm_lab.clock.Clock"),
])
def test_a_dashboard_refuses_a_bad_interval_or_clock(sim, kwargs, message):
    listening = len(ul.events.get_bus().subscriptions())
    with pytest.raises(InvalidArgumentError, match=message):
        Dashboard(**kwargs)
    assert len(ul.events.get_bus().subscriptions()) == listening


def test_close_stops_listening(sim):
    d = Dashboard(interval=0.01)
    assert d.live
    d.close()
    assert not d.live and d.closed
    count = d.refreshes
    b = ul.DeviceBuffer(size="1MiB")
    b.prefetch("gpu")
    ul.events.get_bus().flush()   # delivered to every subscriber: the dashboard is none of them now
    assert d.refreshes == count
    d.close()  # idempotent


def test_odd_allocations_render(sim, dash):
    empty = ul.DeviceBuffer(size=0, label="empty")
    device = ul.DeviceBuffer(size="3MiB", mr=ul.mr.CudaMemoryResource(), label="device")
    odd = ul.DeviceBuffer(size=5000, label="odd")
    dash.refresh()
    dash.select(empty.id)
    assert dash.residency.figure.title.text == "empty: 0 B, no pages"
    assert len(dash.residency.source.data["x"]) == 0
    dash.select(device.id)
    assert set(dash.residency.source.data["category"]) == {GPU0}
    assert dash.advice.read_mostly.disabled and dash.prefetch.buttons["gpu:0"].disabled   # device memory: no advice
    assert "does not migrate" in dash.prefetch.where.value
    dash.select(odd.id)
    assert len(dash.residency.source.data["x"]) == 2                             # 5000 bytes: two pages
    assert set(dash.residency.source.data["category"]) == {NOWHERE}
    assert not dash.advice.read_mostly.disabled


# -- GPUs by name, and unknown ----------------------------------------------------------------------

def test_the_maps_colour_each_category_from_the_one_palette(sim, dash):
    for view in (dash.residency, dash.overview):
        if view is dash.overview:   # one image, a row of category codes per allocation
            cells = next(r for r in view.figure.renderers if r.data_source is view.image)
            mapper = cells.glyph.color_mapper
        else:
            cells = next(r for r in view.figure.renderers if r.data_source is view.source)
            assert cells.glyph.fill_color.field == "category"
            mapper = cells.glyph.fill_color.transform
        assert list(mapper.palette) == [PALETTE[name] for name in CATEGORY_NAMES]
        assert (mapper.low, mapper.high) == (-0.5, len(CATEGORY_NAMES) - 0.5)   # code i -> palette[i]
        # a one-GPU device: its GPU, the host, both, unknown, nowhere
        assert legend_labels(view) == ["gpu:0", "host", "both", "unknown", "nowhere"]
        swatch = {item.label.value: item.renderers[0].data_source.data["fill_color"][item.index]
                  for item in view.legend.legend.items}
        assert swatch == {name: PALETTE[name] for name in swatch}


def test_two_gpus_and_unknown_are_drawn_apart(sim):
    # nowhere, host, gpu:0 x3, gpu:1 x2, host+gpu:1, unknown x2, host+unknown, gpu:0+gpu:1
    states = np.array([0, 1, 2, 2, 2, 4, 4, 5, 0x80, 0x80, 0x81, 6], dtype=np.uint8)
    snap, buf = two_gpu_snapshot(sim, states)
    grid = ResidencyMap()
    grid.selected = buf.id
    grid.update(snap)
    assert grid.source.data["category"].tolist() == [NOWHERE, HOST, GPU0, GPU0, GPU0, GPU1, GPU1, BOTH, UNKNOWN,
                                                     UNKNOWN, UNKNOWN, GPUS]
    assert grid_counts(grid) == {**NO_PAGES, "nowhere": 1, "host": 1, "gpu:0": 3, "gpu:1": 2, "both": 1,
                                 "unknown": 3, "gpus": 1}
    assert legend_labels(grid) == ["gpu:0", "gpu:1", "gpus", "host", "both", "unknown", "nowhere"]
    tooltip = grid.figure.select_one(HoverTool).tooltips[-1][1]
    assert "gpu:0 @{gpu:0}" in tooltip and "gpu:1 @{gpu:1}" in tooltip and "unknown @{unknown}" in tooltip

    overview = ResidencyOverview(bins=4)   # three pages a strip cell
    overview.update(snap)
    # nowhere host gpu:0 | gpu:0 gpu:0 gpu:1 | gpu:1 both unknown | unknown unknown gpus: ties to the lower code
    assert overview.image.data["image"][0][-1].tolist() == [NOWHERE, GPU0, BOTH, UNKNOWN]
    assert overview.source.data["unknown"][-1] == 3 and overview.source.data["gpu:1"][-1] == 2   # exact, hovered
    assert legend_labels(overview) == legend_labels(grid)


def test_a_category_that_holds_pages_is_in_the_legend_even_off_the_device(sim):
    snap, buf = two_gpu_snapshot(sim, np.array([8, 8, 0], dtype=np.uint8))   # gpu:2, on a "two-GPU" device
    grid = ResidencyMap()
    grid.selected = buf.id
    grid.update(snap)
    assert grid.source.data["category"].tolist() == [CATEGORY_NAMES.index("gpu:2")] * 2 + [NOWHERE]
    assert "gpu:2" in legend_labels(grid)


def test_prefetch_controls_offer_each_gpu(sim):
    from uvm_lab.jupyter.dashboard.controls import PrefetchControls

    controls = PrefetchControls(device_count=2)
    assert list(controls.buttons) == ["gpu:0", "gpu:1", "host"]
    snap, buf = two_gpu_snapshot(sim, np.array([2, 4, 4, 0x80], dtype=np.uint8))
    controls.selected = buf.id
    controls.update(snap)
    assert controls.where.value == "pages now: gpu:0 25%, gpu:1 50%, unknown 25%"
    controls.buttons["gpu:1"].click()     # the simulator has one GPU: the error is shown, not raised
    assert "prefetch to gpu:1 failed" in controls.message.value and "InvalidLocationError" in controls.message.value


# -- at scale: only what changed is described and drawn again ---------------------------------------

def test_live_allocations_describe_again_only_what_changed(sim):
    live = LiveAllocations()
    a, b, c = (ul.DeviceBuffer(size="4MiB", label=x) for x in "abc")
    first = dict(live.refresh())
    ul.touch(b, on="gpu", mode="write", size="1MiB")
    second = dict(live.refresh())
    assert second[a.id] is first[a.id] and second[c.id] is first[c.id]
    assert second[b.id] is not first[b.id]
    assert second[b.id]["category_pages"]["gpu:0"] == 256 == ul.residency(b).counts()["gpu"]
    b.read_mostly = True                        # advice is part of a description too
    assert live.refresh()[b.id]["advice"]["read_mostly"] is True
    c.close()
    d = ul.DeviceBuffer(size="1MiB", label="d")
    ids = list(live.refresh())
    assert c.id not in ids and ids[-1] == d.id


def test_live_allocations_ask_the_backend_for_advice_only_once_some_changed(sim, monkeypatch):
    # Reading advice takes the backend's lock, which a loop's operations hold: a view of a loop that moves pages and
    # sets no advice must not ask for it on every map it reads again.
    live = LiveAllocations()
    a, b = (ul.DeviceBuffer(size="1MiB", label=x) for x in "ab")
    live.refresh()
    asked: list[int] = []
    real = sim.range_advice
    monkeypatch.setattr(sim, "range_advice", lambda ptr, size: asked.append(ptr) or real(ptr, size))
    ul.touch(a, on="gpu", mode="write")
    b.prefetch("gpu")
    moved = dict(live.refresh())
    assert moved[a.id]["category_pages"]["gpu:0"] == moved[b.id]["category_pages"]["gpu:0"] == 256
    assert asked == []
    a.preferred_location = "host"   # through the backend, which publishes it: each map read again asks once more
    b.prefetch("host")
    advised = dict(live.refresh())
    assert advised[a.id]["advice"]["preferred_location"] == "host"
    assert advised[b.id]["advice"]["preferred_location"] is None
    assert sorted(asked) == sorted([a.ptr, b.ptr])
    ul.touch(a, on="gpu", mode="write")
    assert live.refresh()[a.id]["advice"]["preferred_location"] == "host"
    assert sorted(asked) == sorted([a.ptr, b.ptr])


def test_maps_on_screen_are_read_first_and_the_others_a_few_a_refresh(sim):
    live = LiveAllocations()
    shown, *hidden = (ul.DeviceBuffer(size="1MiB", label=f"b{i}") for i in range(4))
    before = dict(live.refresh())
    for buf in (shown, *hidden):
        ul.touch(buf, on="gpu", mode="write")
    # The shown one always; of the three others, one a refresh, oldest first.
    now = dict(live.refresh(first={shown.id}, others=1))
    assert now[shown.id] is not before[shown.id] and now[shown.id]["category_pages"]["gpu:0"] == 256
    assert [now[b.id] is before[b.id] for b in hidden] == [False, True, True]
    later = dict(live.refresh(first={shown.id}, others=1))
    assert [later[b.id] is now[b.id] for b in hidden] == [True, False, True]
    # Nothing is lost: a refresh that reads all catches up, and each map is the residency's.
    final = dict(live.refresh())
    for buf in (shown, *hidden):
        assert final[buf.id]["states"].tolist() == ul.residency(buf).states.tolist()
    new = ul.DeviceBuffer(size="1MiB", label="new")       # a new buffer is read at once, shown or not
    assert new.id in live.refresh(first=set(), others=0)


def test_maps_waiting_keep_their_turn_when_a_buffer_is_made(sim):
    live = LiveAllocations()
    first, second, third = (ul.DeviceBuffer(size="1MiB", label=f"b{i}") for i in range(3))
    live.refresh()
    ul.touch(third, on="gpu", mode="write")   # changed first: it has waited longest
    live.refresh(first=set(), others=0)
    ul.touch(first, on="gpu", mode="write")
    ul.touch(second, on="gpu", mode="write")
    new = ul.DeviceBuffer(size="1MiB", label="new")   # the list is read again: the waiting ones keep their order
    live.refresh(first=set(), others=1)
    assert live.changed == {new.id, third.id}
    live.refresh(first=set(), others=1)
    assert live.changed == {first.id}
    live.refresh(first=set(), others=1)
    assert live.changed == {second.id}
    live.refresh(first=set(), others=1)
    assert live.changed == set()
    assert {d["id"]: d["category_pages"]["gpu:0"] for d in live.described.values()} == {
        first.id: 256, second.id: 256, third.id: 256, new.id: 0}


def test_the_overview_patches_the_rows_that_changed(sim):
    overview = ResidencyOverview(bins=8)
    live = LiveAllocations()
    _a, b = ul.DeviceBuffer(size="1MiB", label="a"), ul.DeviceBuffer(size="1MiB", label="b")
    overview.update(collect_snapshot(live=live))
    image = overview.image.data["image"][0]
    row_a = image[-2].copy()
    ul.touch(b, on="gpu", mode="write")
    overview.update(collect_snapshot(live=live))
    assert overview.image.data["image"][0] is image                 # patched in place, not sent whole
    assert image[-1].tolist() == [GPU0] * 8 and image[-2].tolist() == row_a.tolist()
    assert overview.source.data["gpu:0"][-1] == 256
    c = ul.DeviceBuffer(size="1MiB", label="c")                      # a new row: the picture is redrawn
    overview.update(collect_snapshot(live=live))
    assert overview.image.data["image"][0] is not image and overview.image.data["dh"] == [len(ul.live_buffers())]
    assert overview.source.data["name"][-1].startswith(f"#{c.id} c")


def test_a_refresh_that_fails_part_way_reports_its_changes_again(sim, monkeypatch):
    from uvm_lab.jupyter.dashboard import collect

    live = LiveAllocations()
    buf = ul.DeviceBuffer(size="1MiB", label="x")
    live.refresh()
    buf.prefetch("gpu")
    real = collect.describe_buffer
    monkeypatch.setattr(collect, "describe_buffer", lambda b, **_: (_ for _ in ()).throw(RuntimeError("read failed")))
    with pytest.raises(RuntimeError):
        live.refresh()
    monkeypatch.setattr(collect, "describe_buffer", real)
    described = live.refresh()[buf.id]
    assert described["category_pages"]["gpu:0"] == 256


def test_a_live_dashboard_counts_every_event_without_a_thread_woken_for_them(sim):
    bus = ul.events.get_bus()
    listening = set(bus.subscriptions())
    with Dashboard(interval=0.01) as d:
        # Counted as published (inline): no thread of the bus's is woken for the dashboard while a loop publishes.
        assert [s.inline for s in set(bus.subscriptions()) - listening] == [True]
        b = ul.DeviceBuffer(size="1MiB")
        ul.touch(b, on="host", mode="write")
        d.refresh()
        before = d.snapshot["totals"]
        with ul.record() as trace:
            b.prefetch("gpu")
            b.prefetch("host")
        d.refresh()
        after = d.snapshot["totals"]
        assert after["events"] - before["events"] == len(trace.events)
        assert after["bytes_htod"] - before["bytes_htod"] == trace.summary()["bytes_htod"] == 1 << 20


def test_a_dashboard_held_back_while_the_bus_history_turns_over_counts_every_event(sim, monkeypatch):
    # A bus that holds 8 records, and a dashboard whose next refresh is an hour away: the loop's own thread hands the
    # totals what would otherwise leave the history unread.
    bus = ul.events.EventBus(capacity=8)
    monkeypatch.setattr(dashboard_module, "get_bus", lambda: bus)
    with Dashboard(interval=3600.0) as d:
        before = d.snapshot["totals"]
        for _ in range(40):
            bus.publish(ul.events.make_events(1, kind=ul.events.EventKind.HTOD, bytes=4096))
        assert bus.dropped == 32
        d.refresh()
        after = d.snapshot["totals"]
        assert (after["events"] - before["events"], after["bytes_htod"] - before["bytes_htod"]) == (40, 40 * 4096)


def test_the_list_follows_each_allocations_pages(sim, dash):
    a = ul.DeviceBuffer(size="1MiB", label="a")
    b = ul.DeviceBuffer(size="1MiB", label="b")
    ul.touch(a, on="host", mode="write")
    ul.touch(b, on="host", mode="write")
    dash.refresh()
    options = dash.allocations.root.options

    def fractions(buf: ul.DeviceBuffer) -> dict[str, float]:
        data = dash.allocations.source.data
        row = list(data["id"]).index(buf.id)
        return {name: float(data[name][row]) for name in ("host", "gpu:0")}

    assert fractions(a) == fractions(b) == {"host": 1.0, "gpu:0": 0.0}
    a.prefetch("gpu", size="256KiB")
    dash.refresh()
    assert fractions(a) == {"host": 0.75, "gpu:0": 0.25} and fractions(b) == {"host": 1.0, "gpu:0": 0.0}
    assert dash.allocations.root.options == options   # the same buffers: the same choices
    b.close()
    dash.refresh()
    assert [i for _, i in dash.allocations.root.options] == [i for _, i in options if i != b.id]
    assert fractions(a) == {"host": 0.75, "gpu:0": 0.25}


def test_a_renamed_allocation_is_listed_by_its_new_name(sim, dash):
    a = ul.DeviceBuffer(size="1MiB", label="before")
    dash.refresh()
    a.label = "after"
    dash.refresh()
    (shown,) = [text for text, i in dash.allocations.root.options if i == a.id]
    assert "after" in shown and "before" not in shown
    data = dash.allocations.source.data
    assert data["label"][list(data["id"]).index(a.id)] == "after"


def test_the_list_sends_nothing_for_an_allocation_whose_counts_did_not_move(sim, dash, monkeypatch):
    a = ul.DeviceBuffer(size="1MiB", label="a")
    ul.touch(a, on="host", mode="write")
    dash.refresh()
    patched: list[dict] = []
    real_patch = ColumnDataSource.patch
    monkeypatch.setattr(ColumnDataSource, "patch", lambda source, patches, *args, **kwargs: (
        patched.append(patches) if source is dash.allocations.source else None,
        real_patch(source, patches, *args, **kwargs)))
    before = {d["id"]: d for d in dash.snapshot["allocations"]}[a.id]
    a.preferred_location = "host"            # described again (its advice), its pages where they were
    dash.refresh()
    assert {d["id"]: d for d in dash.snapshot["allocations"]}[a.id] is not before
    assert patched == []
    a.prefetch("gpu", size="64KiB")
    dash.refresh()
    assert len(patched) == 1
