"""The component contract, after distributed's ``DashboardComponent``.

A component has a bokeh ``ColumnDataSource`` ``source`` (the data it renders), a ``root`` (the
ipywidget that shows it) and ``update(snapshot)``, which renders a snapshot from
:func:`~uvm_lab.jupyter.dashboard.collect.collect_snapshot` and does nothing when nothing changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource
from jupyter_bokeh import BokehModel

__all__ = ["BokehView", "DashboardComponent", "close_widget_tree", "columns_equal", "update_source"]


class BokehView(BokehModel):
    """jupyter_bokeh's ``BokehModel`` (a bokeh layout shown as an ipywidget), closable more than once.

    ``BokehModel.close`` raises KeyError the second time, and ipywidgets closes every widget again
    when it is garbage-collected.
    """

    _closed_once = False

    def resync(self) -> None:
        """Rebuild the bundle a new view renders from. Patches reach only views that exist, so a view
        created later (the dashboard displayed after it was built, or displayed again) would otherwise
        start from the document as it was when this widget was made."""
        self.update_from_model(self._model)

    def close(self) -> None:
        if self._closed_once:
            return
        self._closed_once = True
        super().close()


class DashboardComponent:
    """Base of every dashboard component: ``source``, ``root`` and ``update(snapshot)``."""

    source: ColumnDataSource
    root: Any

    def update(self, snapshot: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Close the component's widgets (the dashboard calls this when it closes)."""
        close_widget_tree(self.root)


def close_widget_tree(widget: Any) -> None:
    """Close ``widget`` and every widget inside it (a closed box does not close its children)."""
    for child in getattr(widget, "children", ()):
        close_widget_tree(child)
    close = getattr(widget, "close", None)
    if close is not None:
        close()


def columns_equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype.kind == b.dtype.kind and bool(np.array_equal(a, b))
    return list(a) == list(b)


def update_source(source: ColumnDataSource, data: Mapping[str, Sequence[Any] | np.ndarray]) -> bool:
    """Replace ``source.data`` with ``data`` unless every column is already equal; True if it changed.

    Skipping no-op updates matters: every assignment is a document patch sent to the browser.
    """
    old = source.data
    if set(old) == set(data) and all(columns_equal(old[k], data[k]) for k in data):
        return False
    source.data = dict(data)
    return True


def described_again(drawn: Sequence[Mapping[str, Any]], allocs: Sequence[Mapping[str, Any]]) -> list[int] | None:
    """The rows of ``allocs`` whose description is not the one a view drew them from, where they are the same
    allocations in the same order as ``drawn``; None where they are not (the rows must be made again)."""
    if [a["id"] for a in allocs] != [a["id"] for a in drawn]:
        return None
    return [r for r, (old, new) in enumerate(zip(drawn, allocs, strict=True)) if old is not new]
