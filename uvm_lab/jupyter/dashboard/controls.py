"""Controls: prefetch buttons (one per GPU, and the host) and memory advice for the selected allocation.

They call only what a user's code calls: ``DeviceBuffer.prefetch`` and the advice properties
(``read_mostly``, ``preferred_location``, ``accessed_by``), on the buffer ``ul.find_buffer(id)``
returns. Any error is shown in the widget, never raised into a callback nobody sees. The widgets'
values are always read back from the snapshot (that is, from the backend), never assumed.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as widgets
import numpy as np
from bokeh.models import ColumnDataSource

import uvm_lab as ul
from uvm_lab.page_states import CATEGORY_NAMES

from .base import DashboardComponent, update_source
from .collect import shown_categories

__all__ = ["AdviceControls", "PrefetchControls"]

log = logging.getLogger("uvm_lab.jupyter")

#: The PreferredLocation dropdown's value for "no preferred location" (a Dropdown cannot hold None).
NONE = "none"


class _BufferAction(DashboardComponent):
    """What both control panels share: the selected allocation, running an action, the message line."""

    def __init__(self, on_change: Callable[[], None] | None) -> None:
        self.on_change = on_change
        self.selected: int | None = None
        self.message = widgets.HTML(value="", layout=widgets.Layout(min_height="1.5em"))

    def _run(self, what: str, action: Callable[[Any], object]) -> bool:
        """Run ``action(buffer)`` on the selected allocation; report success or the error in the widget."""
        if self.selected is None:
            self._say("select an allocation first", error=True)
            return False
        try:
            action(ul.find_buffer(self.selected))
        except Exception as err:  # shown to the person who clicked; a widget callback has no caller
            log.debug("dashboard action %r failed", what, exc_info=True)
            self._say(f"{what} failed: {type(err).__name__}: {err}", error=True)
            ok = False
        else:
            self._say(f"{what}: done")
            ok = True
        if self.on_change is not None:
            self.on_change()
        return ok

    def _say(self, text: str, *, error: bool = False) -> None:
        color = "var(--jp-error-color1, #c62828)" if error else "var(--jp-ui-font-color2, #555)"
        self.message.value = f'<span style="color:{color}">{html.escape(text)}</span>'

    @staticmethod
    def _find(snapshot: Mapping[str, Any], alloc_id: int | None) -> Mapping[str, Any] | None:
        return next((a for a in snapshot["allocations"] if a["id"] == alloc_id), None)


class PrefetchControls(_BufferAction):
    """One button per place to send the pages, each GPU of the device and the host
    (``buffer.prefetch("gpu:N" | "host")``), and where the pages are now, per category."""

    def __init__(self, on_change: Callable[[], None] | None = None, *, device_count: int = 1) -> None:
        super().__init__(on_change)
        self.source = ColumnDataSource(data=self._columns(None))
        #: The buttons by location: "gpu:0", ..., "host".
        self.buttons: dict[str, widgets.Button] = {}
        for location in [f"gpu:{d}" for d in range(device_count)] + ["host"]:
            button = widgets.Button(description=f"to {location}",
                                    icon="arrow-left" if location == "host" else "arrow-right",
                                    tooltip=f"buffer.prefetch({location!r})", layout=widgets.Layout(width="auto"))
            button.on_click(lambda _, where=location: self._run(f"prefetch to {where}", lambda b: b.prefetch(where)))
            self.buttons[location] = button
        self.where = widgets.HTML(value="")
        row = widgets.HBox(list(self.buttons.values()), layout=widgets.Layout(flex_flow="row wrap"))
        self.root = widgets.VBox([row, self.where, self.message])

    @staticmethod
    def _columns(alloc: Mapping[str, Any] | None) -> dict[str, Any]:
        if alloc is None:
            return {"id": [], **{name: [] for name in CATEGORY_NAMES}}
        pages = max(len(alloc["states"]), 1)
        return {"id": np.array([alloc["id"]], dtype=np.int64),
                **{name: np.array([n / pages]) for name, n in alloc["category_pages"].items()}}

    def update(self, snapshot: Mapping[str, Any]) -> None:
        alloc = self._find(snapshot, self.selected)
        if not update_source(self.source, self._columns(alloc)) and self.where.value:
            return
        disabled = alloc is None or not alloc["is_managed"]
        for button in self.buttons.values():
            button.disabled = disabled
        if alloc is None:
            self.where.value = "no allocation selected"
            return
        pages = alloc["category_pages"]
        total = max(len(alloc["states"]), 1)
        present = {name for name, n in pages.items() if n}
        parts = [f"{name} {100 * pages[name] / total:.0f}%"
                 for name in shown_categories(snapshot["device_count"], present) if pages[name]]
        note = "" if alloc["is_managed"] else " (device memory: it does not migrate)"
        self.where.value = html.escape("pages now: " + (", ".join(parts) or "none") + note)


class AdviceControls(_BufferAction):
    """ReadMostly (checkbox), PreferredLocation (none / gpu / host) and AccessedBy (one checkbox per processor)."""

    def __init__(self, on_change: Callable[[], None] | None = None, *, device_count: int = 1) -> None:
        super().__init__(on_change)
        self.source = ColumnDataSource(data={"id": [], "read_mostly": [], "preferred_location": [],
                                             "accessed_by": []})
        self._syncing = False
        self.locations = ["host"] + [f"gpu:{d}" for d in range(device_count)]
        gpu_options = [("gpu", "gpu:0")] if device_count == 1 else [(f"gpu:{d}", f"gpu:{d}")
                                                                     for d in range(device_count)]
        self.read_mostly = widgets.Checkbox(value=False, description="ReadMostly", indent=False)
        self.preferred = widgets.Dropdown(options=[("none", NONE), *gpu_options, ("host", "host")], value=NONE,
                                          description="PreferredLocation",
                                          style={"description_width": "initial"},
                                          layout=widgets.Layout(width="270px"))
        self.accessed_by = {loc: widgets.Checkbox(value=False, description=loc, indent=False,
                                                  layout=widgets.Layout(width="auto"))
                            for loc in self.locations}
        self.read_mostly.observe(self._read_mostly_changed, names="value")
        self.preferred.observe(self._preferred_changed, names="value")
        for box in self.accessed_by.values():
            box.observe(self._accessed_by_changed, names="value")
        self.root = widgets.VBox([
            self.read_mostly,
            self.preferred,
            widgets.HBox([widgets.Label("AccessedBy"), *self.accessed_by.values()]),
            self.message,
        ])
        self._set_enabled(False)

    # -- user -> buffer --------------------------------------------------------------------------
    def _read_mostly_changed(self, change: Mapping[str, Any]) -> None:
        if not self._syncing:
            value = bool(change["new"])
            self._run(f"read_mostly = {value}", lambda b: setattr(b, "read_mostly", value))

    def _preferred_changed(self, change: Mapping[str, Any]) -> None:
        if not self._syncing:
            value = None if change["new"] == NONE else change["new"]
            self._run(f"preferred_location = {value!r}", lambda b: setattr(b, "preferred_location", value))

    def _accessed_by_changed(self, change: Mapping[str, Any]) -> None:
        if not self._syncing:
            value = tuple(loc for loc, box in self.accessed_by.items() if box.value)
            self._run(f"accessed_by = {value!r}", lambda b: setattr(b, "accessed_by", value))

    # -- backend -> widgets --------------------------------------------------------------------------
    def update(self, snapshot: Mapping[str, Any]) -> None:
        alloc = self._find(snapshot, self.selected)
        advice = alloc["advice"] if alloc is not None else None
        if alloc is None or advice is None:
            data: dict[str, Any] = {"id": [], "read_mostly": [], "preferred_location": [], "accessed_by": []}
        else:
            data = {"id": [alloc["id"]], "read_mostly": [advice["read_mostly"]],
                    "preferred_location": [advice["preferred_location"] or NONE],
                    "accessed_by": [",".join(advice["accessed_by"])]}
        # Always re-sync the widgets: a failed or refused change must snap back to what the backend holds.
        update_source(self.source, data)
        self._syncing = True
        try:
            self._set_enabled(advice is not None)
            if advice is None:
                return
            self.read_mostly.value = advice["read_mostly"]
            preferred = advice["preferred_location"] or NONE
            if preferred in [v for _, v in self.preferred.options]:
                self.preferred.value = preferred
            for loc, box in self.accessed_by.items():
                box.value = loc in advice["accessed_by"]
        finally:
            self._syncing = False

    def _set_enabled(self, enabled: bool) -> None:
        for w in (self.read_mostly, self.preferred, *self.accessed_by.values()):
            w.disabled = not enabled
