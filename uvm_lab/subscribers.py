"""Callbacks a source tells of what it has, for the feeds views follow (:mod:`.experiment_feed`,
:mod:`.cluster_feed`). Thread-safe; a callback that raises is logged and skipped, so a view never fails the
source that feeds it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Subscribers"]


class Subscribers:
    """The callbacks to tell; ``what`` names what they are told of, in the log of one that fails."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log, self._what = log, what
        self._lock = threading.Lock()
        self._callbacks: list[Callable[..., None]] = []

    def subscribe(self, callback: Callable[..., None]) -> Callable[[], None]:
        """Tell ``callback`` from now on; returns what unsubscribes it."""
        with self._lock:
            self._callbacks.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return unsubscribe

    def tell(self, *args: Any) -> None:
        """Call every callback with ``args``, on this thread."""
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(*args)
            except Exception:
                self._log.exception("a view failed to take %s", self._what)
