"""The Dask cluster the views show: the latest :class:`~uvm_lab.dask.ClusterMonitor` made in this process.

A monitor publishes itself as it is made and withdraws as it closes; each message it folds in says so with
:func:`changed`. A view subscribes and reads :func:`current` when told. Light on purpose: the lab view's comm
imports it without ``distributed``. Callbacks run on whichever thread folded the message in (the Dask client's
event loop): they must be cheap, a flag and a wake.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .subscribers import Subscribers

__all__ = ["changed", "current", "publish", "subscribe", "withdraw"]

log = logging.getLogger("uvm_lab.cluster_feed")

_lock = threading.Lock()
_current: Any = None
_subscribers = Subscribers(log, "a cluster change")


def publish(monitor: Any) -> None:
    """Make ``monitor`` the cluster the views show (the latest made wins), and tell each subscriber."""
    global _current
    with _lock:
        _current = monitor
    _tell()


def withdraw(monitor: Any) -> None:
    """``monitor`` closed: the views show no cluster, unless another was published since."""
    global _current
    with _lock:
        if _current is not monitor:
            return
        _current = None
    _tell()


def changed(monitor: Any) -> None:
    """``monitor`` folded a message in: tell the subscribers, if it is the one they show."""
    with _lock:
        if _current is not monitor:
            return
    _tell()


def current() -> Any:
    """The monitor published last and not withdrawn, or None."""
    with _lock:
        return _current


def subscribe(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback()`` whenever the cluster shown changes; returns what unsubscribes it."""
    return _subscribers.subscribe(callback)


def _tell() -> None:
    _subscribers.tell()
