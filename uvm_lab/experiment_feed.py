"""The latest experiment's result, for the views that show it (the lab view draws its chart).

``ul.compare`` publishes each result here as it ends; a view subscribes. Only the latest is kept: a view that
attaches later is shown that one. Light on purpose: a view imports it without pandas or bokeh.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .subscribers import Subscribers

__all__ = ["latest", "publish", "subscribe"]

log = logging.getLogger("uvm_lab.experiment_feed")

_lock = threading.Lock()
_latest: Any = None
_subscribers = Subscribers(log, "an experiment's result")


def publish(result: Any) -> None:
    """Keep ``result`` (an :class:`~uvm_lab.experiment.Experiment`) as the latest and hand it to each subscriber.
    A subscriber that raises is logged and skipped: a view must never fail the experiment."""
    global _latest
    with _lock:
        _latest = result
    _subscribers.tell(result)


def latest() -> Any:
    """The latest result published, or None."""
    with _lock:
        return _latest


def subscribe(callback: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``callback(result)`` with each result published from now on; returns what unsubscribes it."""
    return _subscribers.subscribe(callback)
