"""Residency maps: where each page of an allocation lives, as coloured cells (bokeh).

:class:`ResidencyMap` draws the selected allocation as a grid, one cell per page or, for large
allocations, per run of pages (coloured by the category most of its pages are in; the hover gives the
exact pages per category). :class:`ResidencyOverview` draws every live allocation as one horizontal
strip. Colours come from :data:`uvm_lab.jupyter.palette.PALETTE`, as in the lab panel; the legend and
the hover list each GPU of the device, "unknown", and any other category that holds pages.
All columns are numpy arrays, so bokeh ships them to the browser as binary buffers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, FixedTicker, HoverTool, LinearColorMapper, Range1d
from bokeh.models.annotations import Legend, LegendItem
from bokeh.plotting import figure

from uvm_lab.page_states import CATEGORY_NAMES
from uvm_lab.units import format_bytes

from ..palette import PALETTE
from .base import BokehView, DashboardComponent, described_again, update_source
from .collect import bin_states, category_table, shown_categories

__all__ = ["ResidencyMap", "ResidencyOverview"]


def _color_mapper() -> LinearColorMapper:
    # low/high at the half-steps map each category code to exactly one palette entry.
    return LinearColorMapper(palette=[PALETTE[name] for name in CATEGORY_NAMES], low=-0.5,
                             high=len(CATEGORY_NAMES) - 0.5)


def _count_tooltip(shown: tuple[str, ...]) -> str:
    # Braces: a column name such as "gpu:0" is not a bare identifier to bokeh.
    return " · ".join(f"{name} @{{{name}}}" for name in shown)


class _Legend:
    """A legend over a figure, listing the categories a snapshot's device can show (and any that hold pages).

    Every category has its entry from the start; :meth:`show` picks which the legend lists. The entries
    share one renderer of NaN points, one per category in code order, each entry showing its own point's
    glyph: nothing is drawn in the plot, but the legend has a glyph to show (an empty renderer has none).
    One renderer rather than one per category: every model in the document slows each change to it.
    """

    def __init__(self, fig: Any, hover: HoverTool, head: list[tuple[str, str]]) -> None:
        n = len(CATEGORY_NAMES)
        swatches = fig.scatter(x=[math.nan] * n, y=[math.nan] * n, marker="square", size=11,
                               color=[PALETTE[name] for name in CATEGORY_NAMES])
        self.items = {name: LegendItem(label=name, renderers=[swatches], index=code)  # type: ignore[list-item]
                      for code, name in enumerate(CATEGORY_NAMES)}
        self.legend = Legend(items=[], orientation="horizontal", location="top_left", border_line_alpha=0,
                             background_fill_alpha=0, margin=0, padding=2,  # type: ignore[arg-type]  # bokeh's stubs
                             spacing=12)
        fig.add_layout(self.legend, "above")
        self.hover, self.head = hover, head
        self.shown: tuple[str, ...] = ()
        self.show(shown_categories(1))

    def show(self, shown: tuple[str, ...]) -> None:
        if shown == self.shown:
            return   # every assignment is a document patch
        self.shown = shown
        self.legend.items = [self.items[name] for name in shown]
        self.hover.tooltips = [*self.head, ("", _count_tooltip(shown))]

    def follow(self, snapshot: Mapping[str, Any], allocations: list[Mapping[str, Any]]) -> None:
        """List the snapshot's device's categories, and any of ``allocations``' that hold pages."""
        held = np.flatnonzero(category_table(allocations).any(axis=0)).tolist()
        present = [CATEGORY_NAMES[i] for i in held]
        self.show(shown_categories(snapshot["device_count"], present))


def _new_figure(width: int, height: int, title: str, y_range: Range1d) -> Any:
    fig = figure(width=width, height=height, title=title, x_range=Range1d(start=0, end=1), y_range=y_range,
                 tools="", toolbar_location=None, min_border_left=4, min_border_right=4)
    fig.grid.visible = False
    fig.outline_line_color = None
    return fig


def _empty(*extra: str) -> dict[str, Any]:
    cols = {c: np.zeros(0, dtype=np.int64) for c in ("first", "last", *CATEGORY_NAMES)}
    cols.update({c: np.zeros(0, dtype=np.float64) for c in ("x", "y", *extra)})
    cols["category"] = np.zeros(0, dtype=np.uint8)
    return cols


class ResidencyMap(DashboardComponent):
    """The selected allocation's pages as a grid of ``columns`` x at most ``max_rows`` cells."""

    def __init__(self, *, columns: int = 64, max_rows: int = 32, cell_px: int = 8) -> None:
        self.columns = columns
        self.max_rows = max_rows
        self.cell_px = cell_px
        self.selected: int | None = None
        self.pages_per_cell = 0
        self.source = ColumnDataSource(data=_empty())
        fig = _new_figure(columns * cell_px + 8, self._height(1), "no allocation selected",
                          Range1d(start=0.5, end=-0.5))
        fig.x_range.update(start=-0.5, end=columns - 0.5)
        main = fig.rect(x="x", y="y", width=0.9, height=0.9, source=self.source, line_color=None,
                        fill_color={"field": "category", "transform": _color_mapper()})
        hover = HoverTool(renderers=[main])
        fig.add_tools(hover)
        self.legend = _Legend(fig, hover, [("pages", "@first – @last")])
        fig.axis.visible = False
        self.figure = fig
        self.root = BokehView(fig)

    def _height(self, rows: int) -> int:
        return rows * self.cell_px + 64

    def update(self, snapshot: Mapping[str, Any]) -> None:
        alloc = next((a for a in snapshot["allocations"] if a["id"] == self.selected), None)
        self.legend.follow(snapshot, [alloc] if alloc is not None else [])
        if alloc is None:
            update_source(self.source, _empty())
            self._set_title("no allocation selected")
            return
        states = alloc["states"]
        bins = bin_states(states, self.columns * self.max_rows)
        n_cells = len(bins["first"])
        idx = np.arange(n_cells)
        update_source(self.source, {**bins, "x": (idx % self.columns).astype(np.float64),
                                    "y": (idx // self.columns).astype(np.float64)})
        self.pages_per_cell = int(bins["last"][0] - bins["first"][0] + 1) if n_cells else 0
        rows = max(1, -(-n_cells // self.columns))
        if self.figure.y_range.start != rows - 0.5:
            self.figure.y_range.start = rows - 0.5
            self.figure.height = self._height(rows)
        name = alloc["label"] or f"#{alloc['id']}"
        if not n_cells:
            self._set_title(f"{name}: {format_bytes(alloc['size'])}, no pages")
            return
        unit = "1 page" if self.pages_per_cell == 1 else f"{self.pages_per_cell} pages"
        self._set_title(f"{name}: {format_bytes(alloc['size'])}, {len(states):,} pages of "
                        f"{format_bytes(alloc['page_size'])}; a cell is {unit}")

    def _set_title(self, text: str) -> None:
        if self.figure.title.text != text:
            self.figure.title.text = text


#: Changed rows of the overview sent as patches, at most; more go as one binary image (a patch's cells are
#: serialized one list at a time, and cost more than the whole image past a few rows).
_PATCHED_ROWS = 8


def _count_columns(allocs: list[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """A column of pages per category (named as in CATEGORY_NAMES), a row per allocation."""
    table = category_table(allocs)
    return {c: table[:, i] for i, c in enumerate(CATEGORY_NAMES)}


class ResidencyOverview(DashboardComponent):
    """Every live allocation as one strip of ``bins`` cells, oldest on top.

    The strips are one image (a row of category codes per allocation), so a thousand allocations are one
    picture to draw, not a quarter of a million rectangles; when the allocations are the same as last
    time, only the rows of those whose pages changed are sent again (a patch). Hovering a strip gives the
    allocation and its exact pages in each category.
    """

    def __init__(self, *, bins: int = 256, width: int = 520, row_px: int = 18) -> None:
        self.bins = bins
        self.row_px = row_px
        self.image = ColumnDataSource(data={"image": [np.zeros((1, bins), dtype=np.uint8)], "dh": [1.0]})
        self.source = ColumnDataSource(data=self._rows_data([]))   # one row per allocation, for the hover
        fig = _new_figure(width, self._height(0), "every live allocation", Range1d(start=0.5, end=-0.5))
        fig.image(image="image", x=0, y=-0.5, dw=1, dh="dh", source=self.image, color_mapper=_color_mapper())
        strips = fig.rect(x=0.5, y="y", width=1, height=0.8, source=self.source, fill_alpha=0, line_alpha=0)
        hover = HoverTool(renderers=[strips])
        fig.add_tools(hover)
        self.legend = _Legend(fig, hover, [("", "@name")])
        fig.xaxis.visible = False
        fig.yaxis.ticker = FixedTicker(ticks=[])
        fig.yaxis.major_tick_line_color = None
        fig.yaxis.axis_line_color = None
        self.figure = fig
        self.root = BokehView(fig)
        self._drawn: list[Mapping[str, Any]] = []   # the descriptions each row was drawn from, in order

    def _height(self, n: int) -> int:
        return max(1, n) * self.row_px + 60

    @staticmethod
    def _name(alloc: Mapping[str, Any]) -> str:
        return f"#{alloc['id']} {alloc['label']} ({format_bytes(alloc['size'])})"

    def _rows_data(self, allocs: list[Mapping[str, Any]]) -> dict[str, Any]:
        return {"name": [self._name(a) for a in allocs], "y": np.arange(len(allocs), dtype=np.float64),
                **_count_columns(allocs)}

    def _strip(self, alloc: Mapping[str, Any]) -> np.ndarray:
        """The allocation's pages as ``bins`` cells: each the category most of its pages are in."""
        if not len(alloc["states"]):
            return np.zeros(self.bins, dtype=np.uint8)
        cells = bin_states(alloc["states"], self.bins, counts=False)["category"]
        return cells[np.arange(self.bins) * len(cells) // self.bins]   # stretched to the full width

    def update(self, snapshot: Mapping[str, Any]) -> None:
        allocs = snapshot["allocations"]
        self.legend.follow(snapshot, allocs)
        again = described_again(self._drawn, allocs)
        same_rows, changed = again is not None, again or []
        if same_rows and 0 < len(changed) <= _PATCHED_ROWS:
            self.image.patch({"image": [((0, r, slice(None)), self._strip(allocs[r])) for r in changed]})
            self.source.patch({c: [(r, allocs[r]["category_pages"][c]) for r in changed] for c in CATEGORY_NAMES})
        elif changed or not same_rows:
            # Rows of allocations drawn before and unchanged (the same description) are copied, not binned again.
            drawn = {id(old): (old, row) for old, row in zip(self._drawn, self.image.data["image"][0], strict=False)}
            image = np.stack([drawn[id(a)][1] if drawn.get(id(a), (None,))[0] is a else self._strip(a)
                              for a in allocs]) if allocs else np.zeros((1, self.bins), np.uint8)
            self.image.data = {"image": [image], "dh": [float(len(image))]}
            if same_rows:   # the rows' names and places stand: only their counts go
                self.source.data.update(_count_columns(allocs))
            else:
                self.source.data = self._rows_data(allocs)
        if not same_rows:   # the axis names the rows: only when they are others
            labels = {i: self._name(a) for i, a in enumerate(allocs)}
            self.figure.yaxis.ticker = FixedTicker(ticks=list(labels))
            self.figure.yaxis.major_label_overrides = labels
            self.figure.y_range.start = max(1, len(allocs)) - 0.5
            self.figure.height = self._height(len(allocs))
        self._drawn = list(allocs)
