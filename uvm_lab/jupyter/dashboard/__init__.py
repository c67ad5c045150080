"""The widget dashboard (ipywidgets + bokeh), after distributed's dashboard components.

``collect`` returns plain data (a snapshot dict); each component renders a snapshot and nothing
else; :class:`Dashboard` composes them and keeps them live. Importing this package is cheap: the
widget and plotting libraries load only when a component is first used, so ``%uvm status`` works
without them.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "AdviceControls",
    "AllocationList",
    "Dashboard",
    "DashboardComponent",
    "EventTotals",
    "PrefetchControls",
    "ResidencyMap",
    "ResidencyOverview",
    "Statistics",
    "collect_snapshot",
]

_WHERE = {
    "AdviceControls": ".controls",
    "AllocationList": ".allocations",
    "Dashboard": ".dashboard",
    "DashboardComponent": ".base",
    "EventTotals": ".collect",
    "PrefetchControls": ".controls",
    "ResidencyMap": ".residency",
    "ResidencyOverview": ".residency",
    "Statistics": ".statistics",
    "collect_snapshot": ".collect",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_WHERE[name], __name__), name)


def __dir__() -> list[str]:
    return sorted(__all__)
