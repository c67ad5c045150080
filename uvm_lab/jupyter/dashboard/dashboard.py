"""The dashboard: composes the components, listens to the event bus, refreshes at most ~5 times a second.

Events may be published on any thread (a simulated kernel in a cell, a widget callback on a comm
subshell, a user's worker thread). The bus callback only feeds running totals and wakes the dashboard's
refresh thread, which collects one snapshot and renders it, so a burst of a thousand events costs one
refresh; a refresh describes again only the allocations whose pages changed (:class:`LiveAllocations`): the
selected one, and of the others the ``OTHERS_PER_REFRESH`` that waited longest.
Rendering is serialised by a lock, so a click and the thread never render at the same time.
"""

from __future__ import annotations

import html
import logging
import threading
from typing import Any

import ipywidgets as widgets
import numpy as np

import uvm_lab as ul
from uvm_lab.clock import SYSTEM_CLOCK, Clock, checked_clock, checked_seconds
from uvm_lab.events import get_bus
from uvm_lab.units import format_bytes

from ..throttle import Budget, FineSwitching
from .allocations import AllocationList
from .base import BokehView, DashboardComponent, close_widget_tree
from .collect import EventTotals, LiveAllocations, collect_snapshot
from .controls import AdviceControls, PrefetchControls
from .residency import ResidencyMap, ResidencyOverview
from .statistics import Statistics
from .text import gpu_memories

__all__ = ["Dashboard", "load_bokehjs"]

#: Changed maps other than the selected one read again a refresh, at most, the longest waiting first: a loop that
#: changes every map of a thousand then costs each refresh a bounded time, and the throttle its share.
OTHERS_PER_REFRESH = 64

log = logging.getLogger("uvm_lab.jupyter")

_bokehjs_loaded = False


def load_bokehjs(force: bool = False) -> None:
    """Load BokehJS into the notebook's page once per kernel, inline (works offline, no CDN)."""
    global _bokehjs_loaded
    if _bokehjs_loaded and not force:
        return
    from bokeh.io import output_notebook
    from bokeh.resources import INLINE

    output_notebook(resources=INLINE, hide_banner=True)
    _bokehjs_loaded = True


class Dashboard:
    """The uvm_lab widget dashboard: allocations, residency maps, statistics, prefetch and advice.

    Parameters
    ----------
    interval:
        Least time between two refreshes caused by events, in seconds (1.0: at most one a second). A refresh
        reads and redraws every changed map it reaches, so its cost to a running loop follows how often it runs
        (``benchmarks/README.md``, "The dashboard once a second"): a shorter interval draws sooner and costs
        more, up to the throttle's share of the kernel.
    live:
        Subscribe to the event bus (the default). With ``live=False`` the dashboard changes only
        when :meth:`refresh` is called.
    """

    def __init__(self, *, interval: float = 1.0, live: bool = True, clock: Clock = SYSTEM_CLOCK) -> None:
        self.interval = checked_seconds(interval, "interval")
        self._clock = checked_clock(clock)   # what the throttle goes by (a test moves its own)
        backend = ul.get_backend()
        bus = get_bus()
        # Live, the totals take what the bus published from its history at each refresh (the history itself first):
        # the loop does nothing for them. Otherwise they count the history as it is now.
        self._reader = bus.reader("the dashboard", history=True) if live else None
        self.totals = EventTotals(None if live else bus.history())
        self.allocations = AllocationList(on_select=self._on_select)
        self.residency = ResidencyMap()
        self.overview = ResidencyOverview()
        self.statistics = Statistics()
        self.prefetch = PrefetchControls(on_change=self.refresh, device_count=backend.device_count())
        self.advice = AdviceControls(on_change=self.refresh, device_count=backend.device_count())
        self.components: tuple[DashboardComponent, ...] = (
            self.allocations, self.residency, self.overview, self.statistics, self.prefetch, self.advice)
        self.header = widgets.HTML()

        def heading(text: str) -> widgets.HTML:
            return widgets.HTML(f"<b>{text}</b>", layout=widgets.Layout(margin="6px 0 0 0"))

        left = widgets.VBox([heading("Allocations"), self.allocations.root, heading("Prefetch"), self.prefetch.root,
                             heading("Advice"), self.advice.root],
                            layout=widgets.Layout(flex="0 0 280px", width="280px", margin="0 16px 0 0"))
        right = widgets.VBox([self.residency.root, self.overview.root], layout=widgets.Layout(flex="1 1 auto"))
        self.root = widgets.VBox([self.header, widgets.HBox([left, right]), heading("Statistics"),
                                  self.statistics.root])
        self.snapshot: dict[str, Any] | None = None
        self.refreshes = 0
        self.live_allocations = LiveAllocations()
        self._render_lock = threading.RLock()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last = 0.0
        self._budget = Budget()   # what live refreshes have taken of the kernel (..throttle)
        self._closed = False
        # Inline, for the wake alone (one flag): a thread of its own, woken as a loop publishes, would take the
        # interpreter from the loop far more often than the refreshes do.
        self._subscription = bus.subscribe(self._on_events, inline=True, name="the dashboard") if live else None
        self.refresh()
        # Its refreshes run beside the kernel's code: in fine grains of the interpreter's lock (..throttle).
        self._switching = FineSwitching() if live else None
        if live:
            threading.Thread(target=self._run, name="uvm_lab-dashboard", daemon=True).start()

    # -- rendering --------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Collect a snapshot now, every changed map read again, and render it in every component."""
        self._refresh(others=None)

    def _refresh(self, *, others: int | None) -> None:
        with self._render_lock:
            if self._closed:
                return
            self._last = self._clock.monotonic()
            try:
                if self._reader is not None:
                    get_bus().flush(wait=False)   # the totals: every event published so far
                    self.totals.feed(self._reader.take())
                selected = self.allocations.selected
                snapshot = collect_snapshot(self.totals, self.live_allocations, others=others,
                                            first=() if selected is None else (selected,))
                self.snapshot = snapshot
                # The list first: it may change the selection that the others render.
                self.allocations.update(snapshot)
                self._propagate_selection(self.allocations.selected)
                for component in self.components[1:]:
                    component.update(snapshot)
                self.header.value = self._header(snapshot)
                self.refreshes += 1
            except Exception as err:  # a broken refresh must not kill the timer thread or the kernel
                log.exception("uvm_lab dashboard refresh failed")
                self.header.value = f'<span style="color:#c62828">refresh failed: {html.escape(repr(err))}</span>'

    @staticmethod
    def _header(snapshot: dict[str, Any]) -> str:
        ev = snapshot["events"]
        memory = " · ".join(f"{name} {format_bytes(mem['used'])} used of {format_bytes(mem['total'])}"
                            for name, mem in gpu_memories(snapshot["memory"]))
        return (f"<b>uvm_lab</b> · backend <code>{html.escape(snapshot['backend'])}</code> · {memory} · "
                f"{len(snapshot['allocations'])} live allocation(s) · {ev['published']:,} events"
                + (f", {ev['dropped']:,} dropped from history" if ev["dropped"] else ""))

    def select(self, alloc_id: int | None) -> None:
        """Select an allocation (what picking it in the list does)."""
        self.allocations.select(alloc_id)

    def _on_select(self, alloc_id: int | None, by_user: bool) -> None:
        with self._render_lock:
            self._propagate_selection(alloc_id)
            if by_user:  # a message about the previous allocation no longer applies
                self.prefetch.message.value = self.advice.message.value = ""
            if self.snapshot is not None:
                for component in (self.residency, self.prefetch, self.advice):
                    component.update(self.snapshot)

    def _propagate_selection(self, alloc_id: int | None) -> None:
        for component in (self.residency, self.prefetch, self.advice):
            component.selected = alloc_id

    # -- live updates -------------------------------------------------------------------------------
    def _on_events(self, records: np.ndarray) -> None:
        # In the publisher's thread, under the bus's lock: wake, nothing more (a refresh reads the records)...
        if not self._wake.is_set():   # setting a set Event still takes its lock and notifies
            self._wake.set()
        # ... unless half the bus's history went by with no refresh (its budget held it back): then the totals take
        # it here, so that they miss nothing.
        if self._reader is not None and self._reader.falling_behind(len(records)):
            self.totals.feed(self._reader.take())

    def _run(self) -> None:
        clock = self._clock
        while not self._stop.is_set():
            clock.wait(self._wake, None)
            # The throttle (..throttle): at most one refresh an interval and 5% of the kernel's time; what
            # arrives meanwhile is drawn in that one.
            if clock.wait(self._stop, max(0.0, max(self._last + self.interval, self._budget.ready_at())
                                          - clock.monotonic())):
                break
            self._wake.clear()   # events from here on wake the next round
            started, cpu = clock.monotonic(), clock.thread_time()
            self._refresh(others=OTHERS_PER_REFRESH)
            self._budget.spend(started, clock.thread_time() - cpu)   # see ..throttle: the time taken, not waited

    @property
    def live(self) -> bool:
        """Whether the dashboard is listening to the event bus."""
        return self._subscription is not None and not self._closed

    # -- lifetime -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop listening to events and close every widget. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._wake.set()
        if self._subscription is not None:
            self._subscription.close()
        if self._reader is not None:
            self._reader.close()
        if self._switching is not None:
            self._switching.release()
        with self._render_lock:
            close_widget_tree(self.root)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        load_bokehjs()
        with self._render_lock:
            for component in self.components:
                if isinstance(component.root, BokehView):
                    component.root.resync()
        return self.root._repr_mimebundle_(**kwargs)
