"""The allocation list: every live buffer, oldest first; picking one selects it for the map and controls."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as widgets
import numpy as np
from bokeh.models import ColumnDataSource

from uvm_lab.page_states import CATEGORY_NAMES
from uvm_lab.units import format_bytes

from .base import DashboardComponent, described_again, update_source
from .collect import category_table

__all__ = ["AllocationList"]


def _option_label(alloc: Mapping[str, Any]) -> str:
    label = f" {alloc['label']}" if alloc["label"] else ""
    kind = "managed" if alloc["is_managed"] else "device"
    return f"#{alloc['id']}{label} · {format_bytes(alloc['size'])} · {kind}"


class AllocationList(DashboardComponent):
    """An ipywidgets ``Select`` of the live allocations.

    ``on_select(alloc_id | None, by_user)`` hears every change of selection; ``by_user`` is False when
    the list changed it (the selected allocation was freed, or the first one appeared).

    ``source`` holds one row per allocation: id, label, size, and the fraction of its pages in each
    category (a column per name of :data:`~uvm_lab.page_states.CATEGORY_NAMES`).
    """

    def __init__(self, on_select: Callable[[int | None, bool], None] | None = None) -> None:
        self.on_select = on_select
        self.source = ColumnDataSource(data=self._columns([]))
        self.root = widgets.Select(options=[], rows=8, description="", layout=widgets.Layout(width="270px"))
        self._syncing = False
        self._drawn: list[Mapping[str, Any]] = []   # the descriptions the source's rows were made from, in order
        self.root.observe(self._changed, names="value")

    @property
    def selected(self) -> int | None:
        return self.root.value

    def select(self, alloc_id: int | None) -> None:
        """Select ``alloc_id`` (None, or an id not in the list, clears the selection)."""
        ids = [i for _, i in self.root.options]
        self.root.value = alloc_id if alloc_id in ids else None

    @staticmethod
    def _columns(allocs: list[Mapping[str, Any]]) -> dict[str, Any]:
        pages = np.array([max(len(a["states"]), 1) for a in allocs], dtype=np.float64)
        fractions = category_table(allocs) / pages[:, None]
        return {
            "id": np.array([a["id"] for a in allocs], dtype=np.int64),
            "label": [a["label"] for a in allocs],
            "size": np.array([a["size"] for a in allocs], dtype=np.int64),
            **{name: fractions[:, i] for i, name in enumerate(CATEGORY_NAMES)},
        }

    def update(self, snapshot: Mapping[str, Any]) -> None:
        allocs = snapshot["allocations"]
        changed = described_again(self._drawn, allocs)
        if changed is not None and all(allocs[r]["label"] == self._drawn[r]["label"] for r in changed):
            # The same buffers, none renamed: no option changed, and of the rows described again only those whose
            # counts moved are patched (a patch is a message to the browser, as update_source avoids).
            moved = [r for r in changed if allocs[r]["category_pages"] != self._drawn[r]["category_pages"]]
            if moved:
                rows = self._columns([allocs[r] for r in moved])
                self.source.patch({name: list(zip(moved, rows[name].tolist(), strict=True))
                                   for name in CATEGORY_NAMES})
            self._drawn = list(allocs)
            return
        update_source(self.source, self._columns(allocs))
        self._drawn = list(allocs)
        options = [(_option_label(a), a["id"]) for a in allocs]
        if list(self.root.options) == options:
            return
        before = self.root.value
        self._syncing = True
        try:
            self.root.options = options               # selects the first option; put the old one back
            ids = [i for _, i in options]
            self.root.value = before if before in ids else (ids[-1] if ids else None)
        finally:
            self._syncing = False
        if self.root.value != before:
            self._notify(by_user=False)

    def _changed(self, change: dict[str, Any]) -> None:
        if not self._syncing:
            self._notify(by_user=True)

    def _notify(self, *, by_user: bool) -> None:
        if self.on_select is not None:
            self.on_select(self.root.value, by_user)
