"""The latest experiment's result, for the views that show it (the lab view draws its chart).

``ul.compare`` publishes each result here as it ends; a view subscribes. Only the latest is kept: a view that
attaches later is shown that one. Light on purpose: a view imports it without pandas or bokeh.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["latest", "publish", "subscribe"]

log = logging.getLogger("uvm_lab.experiment_feed")

_lock = threading.Lock()
_latest: Any = None
_subscribers: list[Callable[[Any], None]] = []


def publish(result: Any) -> None:
    """Keep ``result`` (an :class:`~uvm_lab.experiment.Experiment`) as the latest and hand it to each subscriber.
    A subscriber that raises is logged and skipped: a view must never fail the experiment."""
    global _latest
    with _lock:
        _latest = result
        subscribers = list(_subscribers)
    for callback in subscribers:
        try:
            callback(result)
        except Exception:
            log.exception("a view failed to take an experiment's result")


def latest() -> Any:
    """The latest result published, or None."""
    with _lock:
        return _latest


def subscribe(callback: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``callback(result)`` with each result published from now on; returns what unsubscribes it."""
    with _lock:
        _subscribers.append(callback)

    def unsubscribe() -> None:
        with _lock:
            if callback in _subscribers:
                _subscribers.remove(callback)

    return unsubscribe
