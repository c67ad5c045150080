"""The colour of each page category and of each event cause, for every view: the lab's views, the bokeh
dashboard.

Its twin is ``extension/src/palette.ts``; ``tests/unit/test_protocol.py`` checks that the two agree, that
every name of :data:`uvm_lab.page_states.CATEGORY_NAMES` has a colour in :data:`PALETTE` and every name of
:data:`uvm_lab.events.causes.CAUSE_NAMES` one in :data:`CAUSE_PALETTE`.

Why these colours:

- The processors get Okabe and Ito's colour-blind safe hues (their eight are designed to stay apart for
  the three common kinds of colour blindness): the host blue, GPU 0 bluish green, GPU 1 orange, GPU 2 sky
  blue, GPU 3 vermillion, GPU 4 yellow. A seventh processor hue is not in their set: GPU 5 takes Paul Tol's
  indigo, which stays apart from them all. "both" (the host and a GPU: a read-duplicated page) is their
  reddish purple, the same in every view, and "gpus" (several GPUs, not the host) their black.
- "nowhere" (never touched: no data anywhere) is a very light grey, close to the page it is drawn on, so
  empty memory recedes. "unknown" (the map cannot know whether a GPU holds the page) is a dark neutral grey:
  no hue, because it claims no processor, and dark, so that a page that may well hold data never reads as
  empty. The two greys are far apart in lightness, which every kind of colour vision sees.
- Simulated protanopia, deuteranopia and tritanopia (Machado et al. 2009) keep every pair at least 15
  CIE76 units apart; the twin test checks it.
- The causes (the timeline's colours) are a legend of their own, drawn on white: the same eight hues, so
  that a demand fault is vermillion and a prefetch blue wherever they appear, and a mid grey for what
  was inferred rather than recorded (no hue: it claims no cause the driver reported). The same test
  holds them 15 CIE76 units apart under each kind of colour blindness.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = ["CAUSE_PALETTE", "PALETTE"]

#: Category name (:data:`uvm_lab.page_states.CATEGORY_NAMES`) -> ``#rrggbb``. Read-only.
PALETTE: Final[Mapping[str, str]] = MappingProxyType({
    "nowhere": "#eeeeee",
    "host": "#0072b2",
    "both": "#cc79a7",
    "unknown": "#4d4d4d",
    "gpus": "#000000",
    "gpu:0": "#009e73",
    "gpu:1": "#e69f00",
    "gpu:2": "#56b4e9",
    "gpu:3": "#d55e00",
    "gpu:4": "#f0e442",
    "gpu:5": "#332288",
})

#: Cause name (:data:`uvm_lab.events.causes.CAUSE_NAMES`) -> ``#rrggbb``. Read-only.
CAUSE_PALETTE: Final[Mapping[str, str]] = MappingProxyType({
    "demand fault": "#d55e00",
    "prefetch": "#0072b2",
    "eviction": "#e69f00",
    "coherence": "#cc79a7",
    "thrashing": "#000000",
    "remote map": "#56b4e9",
    "inferred": "#666666",
    "allocation": "#009e73",
    "advice": "#f0e442",
})
