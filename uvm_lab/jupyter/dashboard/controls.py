"""Controls: prefetch buttons and memory advice for the selected allocation.

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

from .base import DashboardComponent, update_source

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
    """Two buttons, "to GPU" and "to host" (``buffer.prefetch("gpu" | "host")``), and where the pages are now."""

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        super().__init__(on_change)
        self.source = ColumnDataSource(data={"id": [], "gpu": [], "host": [], "both": [], "nowhere": []})
        button = widgets.Layout(width="132px")
        self.to_gpu = widgets.Button(description="to GPU", icon="arrow-right", tooltip="buffer.prefetch('gpu')",
                                     layout=button)
        self.to_host = widgets.Button(description="to host", icon="arrow-left", tooltip="buffer.prefetch('host')",
                                      layout=button)
        self.to_gpu.on_click(lambda _: self._run("prefetch to gpu", lambda b: b.prefetch("gpu")))
        self.to_host.on_click(lambda _: self._run("prefetch to host", lambda b: b.prefetch("host")))
        self.where = widgets.HTML(value="")
        self.root = widgets.VBox([widgets.HBox([self.to_gpu, self.to_host]), self.where, self.message])

    def update(self, snapshot: Mapping[str, Any]) -> None:
        alloc = self._find(snapshot, self.selected)
        if alloc is None:
            data: dict[str, Any] = {"id": [], "gpu": [], "host": [], "both": [], "nowhere": []}
        else:
            data = {"id": np.array([alloc["id"]], dtype=np.int64),
                    **{k: np.array([alloc["summary"][k]]) for k in ("gpu", "host", "both", "nowhere")}}
        if not update_source(self.source, data) and self.where.value:
            return
        disabled = alloc is None or not alloc["is_managed"]
        self.to_gpu.disabled = self.to_host.disabled = disabled
        if alloc is None:
            self.where.value = "no allocation selected"
        else:
            parts = [f"{k} {100 * alloc['summary'][k]:.0f}%" for k in ("gpu", "host", "both", "nowhere")
                     if alloc["summary"][k] > 0]
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
