"""The residency map is built from events only; it must agree with the simulator's own page states.

A stateful property test drives random sequences of allocation, prefetch, advice, access and
free on a small GPU (so evictions happen) and checks, after every step, that the map the tracker
rebuilt from the event stream equals the simulator's ground truth, page by page.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import uvm_lab as ul
from uvm_lab.units import PAGE_SIZE

SIZES = st.sampled_from([4096, 12 << 10, 64 << 10, 1 << 20, 2 << 20, 3 << 20 | 4096, 6 << 20])
WHERE = st.sampled_from(["gpu", "host"])
MODES = st.sampled_from(["read", "write", "atomic"])


class ResidencyAgreesWithSimulator(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.backend = ul.use_backend("sim", device_memory="8MiB")   # four 2 MiB blocks: eviction is common
        self.mr = ul.mr.ManagedMemoryResource(allow_oversubscription=True)
        self.buffers: list[ul.DeviceBuffer] = []

    @precondition(lambda self: len(self.buffers) < 3)   # few buffers, so rules meet the same pages often
    @rule(size=SIZES)
    def allocate(self, size: int) -> None:
        self.buffers.append(ul.DeviceBuffer(size=size, mr=self.mr))

    @precondition(lambda self: self.buffers)
    @rule(i=st.integers(0, 99))
    def free(self, i: int) -> None:
        self.buffers.pop(i % len(self.buffers)).close()

    @precondition(lambda self: self.buffers)
    @rule(i=st.integers(0, 99), where=WHERE, frac=st.tuples(st.floats(0, 1), st.floats(0, 1)))
    def prefetch(self, i: int, where: str, frac: tuple[float, float]) -> None:
        buf = self.buffers[i % len(self.buffers)]
        lo, hi = sorted(int(f * buf.size) for f in frac)
        if hi > lo:
            self.backend.prefetch(buf.ptr + lo, hi - lo, ul.Location.parse(where, device_count=1))

    @precondition(lambda self: self.buffers)
    @rule(i=st.integers(0, 99), where=WHERE, mode=MODES, frac=st.tuples(st.floats(0, 1), st.floats(0, 1)))
    def touch(self, i: int, where: str, mode: str, frac: tuple[float, float]) -> None:
        buf = self.buffers[i % len(self.buffers)]
        lo, hi = sorted(int(f * buf.size) for f in frac)
        if hi > lo:
            ul.touch(buf, on=where, mode=mode, offset=lo, size=hi - lo)

    @precondition(lambda self: self.buffers)
    @rule(i=st.integers(0, 99), advice=st.sampled_from(["read_mostly", "preferred_location", "accessed_by"]),
          value=st.sampled_from([None, "gpu", "host", True, False]))
    def advise(self, i: int, advice: str, value: object) -> None:
        buf = self.buffers[i % len(self.buffers)]
        if advice == "read_mostly":
            buf.read_mostly = bool(value)
        elif advice == "preferred_location":
            buf.preferred_location = value if value in (None, "gpu", "host") else None
        else:
            buf.accessed_by = value if value in ("gpu", "host") else ()

    @invariant()
    def map_equals_ground_truth(self) -> None:
        for buf in self.buffers:
            truth = self.backend._segments[buf.ptr].state   # the simulator's own page states
            rebuilt = ul.residency(buf).states
            assert rebuilt.shape == (-(-buf.size // PAGE_SIZE),)
            mismatch = np.flatnonzero(truth != rebuilt)
            assert not len(mismatch), f"{buf}: pages {mismatch[:8]} are {truth[mismatch[:8]]} in the simulator " \
                                      f"but {rebuilt[mismatch[:8]]} in the map"

    @invariant()
    def device_memory_never_overcommitted(self) -> None:
        free, total = self.backend.mem_info()
        assert 0 <= free <= total

    def teardown(self) -> None:
        for buf in self.buffers:
            buf.close()


ResidencyAgreesWithSimulator.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
test_residency_agrees_with_simulator = ResidencyAgreesWithSimulator.TestCase
