"""Scripted experiments: a workload over a grid of configurations, as a table a user can trust and keep."""

from __future__ import annotations

import sys

import pandas as pd
import pytest

import uvm_lab as ul
from uvm_lab import experiment, workloads
from uvm_lab.clock import Clock
from uvm_lab.errors import BackendError, InvalidArgumentError


class TickingClock(Clock):
    """Each look at the time finds it ``step`` seconds later: a run takes ``step`` seconds."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now


def test_every_configuration_runs_and_agrees_with_running_it_directly():
    grid = {"policy": ["faults", "prefetch"], "device_memory": ["1GiB", "256MiB"]}
    result = ul.compare("multi_pass_stream", grid, size="256MiB", passes=2, repeats=2, progress=False)

    assert len(result.passes) == 4 * 2 * 2   # configurations x repeats x passes
    summary = result.summary
    assert list(summary[["policy", "device_memory"]].itertuples(index=False, name=None)) == [
        ("faults", "1GiB"), ("faults", "256MiB"), ("prefetch", "1GiB"), ("prefetch", "256MiB")]
    assert (summary["repeats"] == 2).all() and (summary["ran_on"] == "sim").all()
    for row in summary.itertuples():
        direct = workloads.run_sim(workloads.multi_pass_stream("256MiB", passes=2), policy=row.policy,
                                   device_memory=row.device_memory)
        assert row.seconds == pytest.approx(sum(r.seconds for r in direct))
        assert row.bytes_htod == sum(r.bytes_htod for r in direct)
        assert row.bytes_dtoh == sum(r.bytes_dtoh for r in direct)
        assert row.faults == sum(r.faults for r in direct)
    # The simulator repeats itself exactly: no spread, and it says so.
    assert (summary["spread"] == 0).all()


def test_oversubscription_sizes_the_device_from_the_workload_and_shows_evictions():
    result = ul.compare("multi_pass_stream", {"oversubscription": [0.5, 1.5]}, size="256MiB", passes=3,
                        progress=False)
    fits, over = result.summary.itertuples()
    assert fits.bytes_evicted == 0 and fits.bytes_dtoh == 0
    assert over.bytes_evicted > 0 and over.bytes_evicted <= over.bytes_dtoh
    # 256 MiB / 1.5 of device memory (which the simulator counts in whole 2 MiB blocks).
    direct = workloads.run_sim(workloads.multi_pass_stream("256MiB", passes=3), device_memory=int(256 * 2**20 / 1.5))
    assert over.seconds == pytest.approx(sum(r.seconds for r in direct))


def test_a_time_budget_measures_every_configuration_before_any_twice_and_counts_what_it_left_out():
    grid = {"policy": ["faults", "prefetch", "remote"]}
    result = ul.compare("sequential_stream", grid, size="64MiB", repeats=3, time_budget=4.5, progress=False,
                        clock=TickingClock(1.0))
    runs = result.runs
    # Each run looks at the clock once before it starts: four runs fit in 4.5 s, five do not.
    assert len(runs) == 4 and result.skipped == 9 - 4
    assert list(runs["policy"]) == ["faults", "prefetch", "remote", "faults"]
    assert "5 runs left out" in result._repr_html_()


def test_a_users_function_runs_on_a_device_of_each_configuration_and_its_traffic_is_counted():
    seen = []

    def step(prefetch: bool) -> None:
        seen.append(ul.get_backend().device_memory)
        buf = ul.DeviceBuffer(size="32MiB")
        ul.touch(buf, on="host", mode="write")
        if prefetch:
            buf.prefetch("gpu")
        ul.touch(buf, on="gpu", mode="read")
        buf.close()

    before = ul.get_backend()
    result = ul.compare(step, {"prefetch": [False, True]}, device_memory="512MiB", progress=False)
    assert ul.get_backend() is before   # the device the user had is current again
    assert seen == [512 * 2**20] * 2
    faults, prefetched = result.summary.itertuples()
    # Both write it on the host first (the same CPU faults); only the one that did not prefetch faults on the GPU,
    # once per 64 KiB the reads touch, at most.
    assert 0 < faults.faults - prefetched.faults <= 32 * 2**20 // 4096
    assert faults.bytes_htod == prefetched.bytes_htod == 32 * 2**20
    assert prefetched.seconds < faults.seconds


def test_a_function_is_given_only_the_names_it_was_given():
    calls = []

    def step(policy: str = "mine", **rest: object) -> None:
        calls.append((policy, rest))

    ul.compare(step, {"size": [1, 2]}, progress=False)
    assert calls == [("mine", {"size": 1}), ("mine", {"size": 2})]


@pytest.mark.parametrize(("suffix", "sidecar"), [(".parquet", None), (".csv", ".json")])
def test_a_saved_experiment_reads_back_the_same(tmp_path, suffix, sidecar):
    result = ul.compare("strided", {"policy": ["faults", "remote"]}, size="64MiB", repeats=2, progress=False)
    path = result.save(tmp_path / f"strided{suffix}")
    if sidecar:
        assert path.with_suffix(sidecar).exists()
    back = experiment.load(path)
    pd.testing.assert_frame_equal(back.summary, result.summary, check_dtype=False)
    assert back.metadata == result.metadata and back.parameters == ["policy"]
    assert back.metadata["fixed"] == {"size": "64MiB"} and back.metadata["grid"] == {"policy": ["faults", "remote"]}


def test_saving_and_loading_name_the_formats(tmp_path):
    result = ul.compare("strided", size="64MiB", progress=False)
    with pytest.raises(InvalidArgumentError, match=r"\.parquet or \.csv"):
        result.save(tmp_path / "out.xlsx")
    assert not list(tmp_path.iterdir())
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(InvalidArgumentError, match="not an experiment"):
        experiment.load(tmp_path / "other.csv")


def test_without_pyarrow_parquet_is_refused_and_csv_offered(tmp_path, monkeypatch):
    result = ul.compare("strided", size="64MiB", progress=False)
    saved = result.save(tmp_path / "kept.parquet")
    with monkeypatch.context() as without:
        for name in ("pyarrow", "pyarrow.parquet"):
            without.setitem(sys.modules, name, None)   # as if it were not installed
        with pytest.raises(InvalidArgumentError, match=r"needs pyarrow.*a \.csv path"):
            result.save(tmp_path / "new.parquet")
        with pytest.raises(InvalidArgumentError, match="needs pyarrow"):
            experiment.load(saved)
    assert not (tmp_path / "new.parquet").exists()
    assert experiment.load(result.save(tmp_path / "new.csv")).parameters == []


def test_the_progress_bar_counts_the_runs(capsys):
    ul.compare("sequential_stream", {"policy": ["faults", "prefetch"]}, size="16MiB", repeats=2)
    assert "4/4" in capsys.readouterr().err


def test_the_plot_has_a_bar_per_configuration():
    pytest.importorskip("bokeh")   # uvm_lab[jupyter]'s: the table needs no plotting package
    result = ul.compare("sequential_stream", {"policy": ["faults", "prefetch", "remote"]}, size="16MiB",
                        progress=False)
    fig = result.plot()
    bars = next(r for r in fig.renderers if type(r.glyph).__name__ == "HBar")
    assert list(bars.data_source.data["name"]) == ["faults", "prefetch", "remote"]
    assert list(bars.data_source.data["y"]) == pytest.approx(list(result.summary["seconds"]))
    with pytest.raises(InvalidArgumentError, match="no column 'speed'"):
        result.plot("speed")


def test_the_prefetch_strategy_and_the_advice_cross_as_two_names():
    grid = {"prefetch": ["none", "chunked"], "advice": ["none", "read_mostly"]}
    result = ul.compare("host_then_device", grid, size="128MiB", progress=False)
    summary = result.summary.set_index(["prefetch", "advice"])

    assert len(summary) == 4 and result.parameters == ["prefetch", "advice"]
    for (prefetch, advice), policy in {("none", "none"): "faults", ("chunked", "none"): "prefetch",
                                       ("none", "read_mostly"): "read_mostly",
                                       ("chunked", "read_mostly"): "prefetch+read_mostly"}.items():
        direct = workloads.run_sim(workloads.host_then_device("128MiB"), policy=policy)
        assert summary.loc[(prefetch, advice), "seconds"] == pytest.approx(sum(r.seconds for r in direct))
    assert summary.loc[("chunked", "none"), "faults"] < summary.loc[("none", "none"), "faults"]


@pytest.mark.parametrize(("call", "match"), [
    (lambda f: ul.compare(lambda size: None, {"colour": [1]}), "takes no 'colour'"),
    (lambda f: ul.compare("strided", {"colour": [1]}), "takes no 'colour'"),
    (lambda f: ul.compare("strided", {"policy": []}), "is empty"),
    (lambda f: ul.compare("strided", {"policy": "faults"}), "must be a list"),
    (lambda f: ul.compare("strided", {"policy": ["faults", "fastest"]}), "policy must be one of"),
    (lambda f: ul.compare("strided", {"platform": ["x86-pcie5", "mars"]}), "unknown platform 'mars'"),
    (lambda f: ul.compare("strided", {"prefetch": ["none", "always"]}), "prefetch must be one of none, chunked"),
    (lambda f: ul.compare("strided", {"advice": ["none", "pinned"]}), "advice must be one of none, read_mostly"),
    (lambda f: ul.compare("strided", {"advice": ["none"]}, policy="remote"), "not both"),
    (lambda f: ul.compare("strided", {"policy": ["faults"]}, policy="remote"), "given as a keyword too"),
    (lambda f: ul.compare("strided", device_memory="1GiB", oversubscription=1.5), "not both"),
    (lambda f: ul.compare("strided", {"oversubscription": [1.5, -1]}), "oversubscription must be a positive"),
    (lambda f: ul.compare("strided", {"on": ["sim", "cloud"]}), "on must be 'sim', 'gpu' or 'auto'"),
    (lambda f: ul.compare("strided", repeats=0), "repeats must be"),
    (lambda f: ul.compare("strided", time_budget=-1), "time_budget must be"),
    (lambda f: ul.compare("nonesuch"), "unknown workload 'nonesuch'"),
    (lambda f: ul.compare(42), "workload must be"),
    (lambda f: ul.compare(f, oversubscription=1.5), "oversubscription needs the workload's size"),
])
def test_bad_input_is_refused_before_anything_runs(call, match):
    ran = []

    def step(**values: object) -> None:
        ran.append(values)

    backend = ul.get_backend()
    with pytest.raises(InvalidArgumentError, match=match):
        call(step)
    assert ran == [] and ul.get_backend() is backend


def test_on_gpu_without_one_says_what_to_do_instead():
    if workloads.gpu_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(BackendError, match="on='sim'"):
        ul.compare("strided", on="gpu", progress=False)
    # "auto" runs the simulator here, and says so.
    assert set(ul.compare("strided", size="16MiB", on="auto", progress=False).summary["ran_on"]) == {"sim"}


def test_a_function_runs_on_the_simulator_where_there_is_no_gpu():
    if workloads.gpu_available():
        pytest.skip("this machine has a GPU")
    result = ul.compare(lambda: ul.DeviceBuffer(size="4MiB").close(), on="auto", progress=False)
    assert list(result.summary["ran_on"]) == ["sim"]
    with pytest.raises(BackendError, match="on='sim'"):
        ul.compare(lambda: None, on="gpu", progress=False)


def test_the_experiment_and_the_catalog_are_attributes_of_a_fresh_import():
    import subprocess

    code = "import uvm_lab as ul; print(ul.workloads.POLICIES[0], ul.experiment.compare is not None); ul.nothing"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["faults", "True"]
    assert "has no attribute 'nothing'" in done.stderr   # any other name is still an AttributeError


def test_an_experiment_leaves_the_backend_as_it_found_it_even_none():
    import subprocess

    # In a fresh process no backend is current until something picks one: a user's function run by compare must
    # not leave its simulated device behind for the buffers the user makes next.
    code = ("import uvm_lab as ul\n"
            "def step(n):\n    ul.touch(ul.DeviceBuffer(size='1MiB'), on='gpu')\n"
            "ul.compare(step, {'n': [1, 2]}, progress=False)\n"
            "print(ul.backends.has_backend())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False"], done.stderr
    previous = ul.get_backend()
    experiment.compare(lambda: None, progress=False)
    assert ul.get_backend() is previous


def test_a_resource_chain_is_an_axis_for_a_functions_buffers():
    chains = []

    def step() -> None:
        chains.append([type(mr).__name__ for mr in ul.mr.resource_chain(ul.mr.get_current_device_resource())])
        for _ in range(20):
            buf = ul.DeviceBuffer(size="8MiB")
            ul.touch(buf, on="gpu", mode="write")
            buf.close()

    mine = ul.mr.StatisticsResourceAdaptor(ul.mr.ManagedMemoryResource())
    ul.mr.set_current_device_resource(mine)
    result = ul.compare(step, {"resource": ["managed", "pool(managed)", "prefetch(managed)"]}, progress=False)
    at = result.summary.set_index("resource")

    assert chains == [["ManagedMemoryResource"], ["PoolMemoryResource", "ManagedMemoryResource"],
                      ["PrefetchResourceAdaptor", "ManagedMemoryResource"]]
    # The pool hands the same pages back: made on the GPU once, they fault there once; fresh managed memory each
    # time faults every time; prefetched on allocation, it never faults.
    assert at.faults["prefetch(managed)"] == 0 < at.faults["pool(managed)"] < at.faults["managed"]
    assert ul.mr.get_current_device_resource() is mine   # the user's resource is current again


def test_a_resource_chain_is_checked_and_is_for_functions_only():
    for chain in ("pool(managed", "managed(pool)", "fast", 3):
        with pytest.raises(InvalidArgumentError, match="resource chain"):
            ul.compare(lambda: None, {"resource": ["managed", chain]}, progress=False)
    with pytest.raises(InvalidArgumentError, match="resource is for a function's buffers"):
        ul.compare("strided", resource="pool(managed)", progress=False)
    seen = []
    ul.compare(lambda resource: seen.append(resource), {"resource": ["mine", "yours"]}, progress=False)
    assert seen == ["mine", "yours"]   # a function that takes resource itself gets the value as it is
