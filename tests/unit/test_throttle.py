"""The live views' throttle: a share of the kernel's time, with a burst, on a clock the test gives."""

from __future__ import annotations

import itertools
import sys

import pytest

from uvm_lab.jupyter.throttle import LIVE_SWITCH_INTERVAL, Budget, FineSwitching


def run_greedy(budget: Budget, costs: list[float], interval: float = 0.0, now: float = 0.0) -> list[float]:
    """Start each piece of work as soon as the budget and the interval allow; the moments they started."""
    starts = []
    for cost in costs:
        now = max(now, budget.ready_at())
        starts.append(now)
        budget.spend(now, cost)
        now += max(cost, interval)
    return starts


def test_steady_work_takes_at_most_the_share_of_the_time():
    budget = Budget(share=0.05, burst=1.0)
    starts = run_greedy(budget, [0.01] * 500)
    # 5 s of work at 5% needs 100 s of clock, less the one-second burst it may owe at the end.
    assert starts[-1] + 0.01 == pytest.approx(100.0 - 1.0, abs=0.2)
    for t in (10.0, 30.0, 60.0):   # and at any moment, no more than the share of the time so far and the burst
        done = 0.01 * sum(1 for s in starts if s < t)
        assert done <= 0.05 * (t + 1.0) + 0.01


def test_one_costly_piece_does_not_hold_back_the_cheap_ones_after_it():
    budget = Budget(share=0.05, burst=1.0)
    # A timeline answer of 20 ms (0.4 s of clock to pay), then updates of 1 ms every 50 ms.
    budget.spend(0.0, 0.020)
    starts = run_greedy(budget, [0.001] * 10, interval=0.05)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert starts[0] == 0.0 and gaps == pytest.approx([0.05] * 9)


def test_work_beyond_the_burst_waits_until_it_and_the_next_piece_are_paid_for():
    budget = Budget(share=0.05, burst=1.0)
    budget.spend(0.0, 0.1)   # 2 s of clock, and the next piece expected to cost as much: 3 s more than may be owed
    assert budget.ready_at() == pytest.approx(3.0)
    budget.spend(1.0, 0.0)   # a piece that cost nothing: the next is expected to cost nothing too
    assert budget.ready_at() == pytest.approx(1.0)


def test_costly_pieces_keep_a_short_loop_within_the_share():
    # The dashboard's refreshes of 56 ms, at 5% with a quarter-second burst, while loops of 1-5 s run.
    for loop in (1.0, 2.5, 5.0):
        budget = Budget(share=0.05, burst=0.25)
        starts = run_greedy(budget, [0.056] * 100)
        done = 0.056 * sum(1 for s in starts if s < loop)
        # The first goes at once (a change after a quiet stretch is drawn); past it, no more than the share.
        assert done <= max(0.056, 0.05 * loop)


def test_an_idle_spell_is_not_saved_up_beyond_the_burst():
    budget = Budget(share=0.05, burst=1.0)
    budget.spend(0.0, 0.001)
    # A hundred seconds later, the same burst as at the start: 1 s of clock, 50 ms of work back to back (five
    # pieces: the one each starts is within the second too).
    starts = run_greedy(budget, [0.01] * 10, now=100.0)
    assert starts[:5] == pytest.approx([100.0 + 0.01 * i for i in range(5)])
    assert starts[5] > starts[4] + 0.01


def test_a_short_loop_pays_the_share_too():
    # A view's updates of 4 ms every 50 ms, as fast as allowed, while a one-second loop runs.
    budget = Budget(share=0.04)
    starts = run_greedy(budget, [0.004] * 100, interval=0.05)
    done = 0.004 * sum(1 for s in starts if s < 1.0)
    # Within the view's 5% of the second (its 4% share and the burst's), not a second's grace on top.
    assert done <= 0.05 + 0.004


# -- the switch interval while views refresh beside the kernel's code ---------------------------------------------

@pytest.fixture
def interval():
    """The interpreter's switch interval, put back after the test whatever it did."""
    before = sys.getswitchinterval()
    yield before
    sys.setswitchinterval(before)


def test_the_live_interval_holds_while_any_refresher_does_and_the_found_one_comes_back(interval):
    sys.setswitchinterval(0.002)
    first = FineSwitching()
    second = FineSwitching()
    assert sys.getswitchinterval() == pytest.approx(LIVE_SWITCH_INTERVAL)
    first.release()
    first.release()   # idempotent: the second holder still holds it
    assert sys.getswitchinterval() == pytest.approx(LIVE_SWITCH_INTERVAL)
    second.release()
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_an_interval_set_meanwhile_by_someone_else_stays(interval):
    held = FineSwitching()
    sys.setswitchinterval(0.003)   # the user's own, while a view is open
    held.release()
    assert sys.getswitchinterval() == pytest.approx(0.003)


def test_a_live_view_session_and_a_live_dashboard_each_hold_it_until_closed(interval, sim_backend):
    from uvm_lab.jupyter.comm import PanelSession
    from uvm_lab.jupyter.dashboard import Dashboard

    class Sink:
        def send(self, data=None, metadata=None, buffers=None): ...
        def on_msg(self, callback): ...
        def on_close(self, callback): ...
        def close(self, data=None, metadata=None, buffers=None): ...

    found = sys.getswitchinterval()
    session = PanelSession(Sink())
    assert sys.getswitchinterval() == pytest.approx(LIVE_SWITCH_INTERVAL)
    dashboard = Dashboard(live=True)
    session.close()
    assert sys.getswitchinterval() == pytest.approx(LIVE_SWITCH_INTERVAL)   # the dashboard still refreshes
    dashboard.close()
    assert sys.getswitchinterval() == pytest.approx(found)
    quiet = PanelSession(Sink(), start=False)   # no thread of its own: nothing runs beside the kernel's code
    assert sys.getswitchinterval() == pytest.approx(found)
    quiet.close()
