"""Every worker × GPU of a cluster, folded from the workers' messages: the client's picture and the scheduler's.

:class:`ClusterPicture` folds each message of :data:`~.worker.TOPIC` (a worker joined, sent a delta, left, or is
gone) into one :class:`WorkerLanes` per worker: memory used and total per GPU as last read, what moved and faulted
since it joined, and a bounded history for its lanes. A worker that leaves, dies or restarts keeps its lanes,
marked gone, and nothing of the others changes; a restarted worker comes back under a new address, as new lanes.
The client's :class:`~.client.ClusterMonitor` keeps one, and so does the scheduler's page (:mod:`.scheduler`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from ..errors import ProtocolError, shown
from . import wire

__all__ = ["COUNTED", "HISTORY", "MAX_WORKERS", "ClusterPicture", "WorkerLanes"]

#: Deltas a worker's history keeps (25 minutes at the default four a second).
HISTORY: Final = 6000
#: Workers a monitor keeps; past it, the longest gone are forgotten (and counted).
MAX_WORKERS: Final = 1024
#: The counters of a row that add up over deltas.
COUNTED: Final = ("htod_bytes", "dtoh_bytes", "dtod_bytes", "gpu_faults", "evicted_bytes")


@dataclass
class WorkerLanes:
    """One worker as the client knows it."""

    address: str
    name: str = ""
    pid: int = 0
    backend: str = ""
    gpus: int = 0
    routed: dict[str, str] = field(default_factory=dict)
    #: "live"; "left" (closed cleanly); "gone" (the scheduler removed it: dead, restarted or retired).
    state: str = "live"
    last: wire.Delta | None = None
    totals: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=wire.ROW))   # COUNTED summed per GPU
    events: int = 0
    cpu_faults: int = 0
    lost: int = 0       # deltas that never came (gaps in seq)
    latency_ms: float = 0.0   # the last delta's: from its oldest event to its arrival here
    #: The last HISTORY deltas, each with when it arrived here (wall ms): the worker's lanes.
    history: deque[tuple[float, wire.Delta]] = field(default_factory=lambda: deque(maxlen=HISTORY))

    def rows(self) -> list[dict[str, Any]]:
        """One row per GPU: what was last read, and what was counted since the worker joined."""
        if self.last is None:
            return []
        head, out = self.last.header, []
        for d, row in enumerate(self.last.rows):
            out.append({
                "worker": self.address, "name": self.name, "gpu": d, "state": self.state,
                "used": int(row["used"]), "total": int(row["total"]), "available": int(row["total"] - row["used"]),
                "pages": int(row["pages"]), **{k: int(self.totals[d][k]) for k in COUNTED},
                "events": self.events, "cpu_faults": self.cpu_faults, "allocated": int(head["allocated"]),
                "buffers": int(head["buffers"]), "lost": self.lost, "dropped": int(head["dropped"]),
            })
        return out


class ClusterPicture:
    """The workers' messages folded into :class:`WorkerLanes`. Thread-safe. ``clock`` gives wall time in ms (a
    test's own; ``time.time`` by default): when each delta arrived."""

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        self._wall_ms = clock or (lambda: time.time() * 1000)
        self._lock = threading.Lock()
        self._workers: dict[str, WorkerLanes] = {}
        self.messages = 0
        self.bytes = 0            # the deltas' payloads received
        self.bad = 0              # messages that were not uvm_lab worker messages: counted, dropped
        self.forgotten = 0        # workers past MAX_WORKERS, the longest gone first

    def count_bad(self) -> None:
        """Count a message :meth:`receive` refused."""
        with self._lock:
            self.bad += 1

    def receive(self, message: Mapping[str, Any]) -> None:
        """Fold one message of the topic in: a worker joined, sent a delta, left, or is gone.

        Raises
        ------
        ProtocolError
            ``message`` is none of those (nothing is changed; a subscriber counts it with :meth:`count_bad`).
        """
        if not isinstance(message, Mapping) or not isinstance(message.get("worker"), str):
            raise ProtocolError(f"not a uvm_lab worker message: {shown(message)}", command=message)
        address = message["worker"]
        now = self._wall_ms()
        delta = wire.decode(message["delta"]) if "delta" in message else None
        with self._lock:
            lanes = self._workers.get(address)
            if lanes is None:
                if "gone" in message:
                    return   # a worker that never ran the plugin
                lanes = self._workers[address] = WorkerLanes(address)
                self._forget()
            if "joined" in message:
                joined = message["joined"]
                lanes.name, lanes.pid = str(joined.get("name", "")), int(joined.get("pid", 0))
                lanes.backend, lanes.gpus = str(joined.get("backend", "")), int(joined.get("gpus", 0))
                lanes.routed = dict(joined.get("routed", {}))
            elif delta is not None:
                self._fold(lanes, delta, now)
                self.bytes += len(message["delta"])
            elif "left" in message:
                lanes.state = "left"
            elif "gone" in message:
                lanes.state = "gone" if lanes.state == "live" else lanes.state
            else:
                raise ProtocolError(f"a worker message says joined, delta, left or gone; got {sorted(message)}",
                                    command=message)
            self.messages += 1

    def _fold(self, lanes: WorkerLanes, delta: wire.Delta, now: float) -> None:
        if lanes.last is not None and delta.seq > lanes.last.seq + 1:
            lanes.lost += delta.seq - lanes.last.seq - 1
        if len(lanes.totals) < len(delta.rows):
            grown = np.zeros(len(delta.rows), dtype=wire.ROW)
            grown[:len(lanes.totals)] = lanes.totals
            lanes.totals = grown
        for name in COUNTED:
            lanes.totals[name][:len(delta.rows)] += delta.rows[name]
        lanes.events += int(delta.header["events"])
        lanes.cpu_faults += int(delta.header["cpu_faults"])
        oldest = float(delta.header["oldest_ms"])
        lanes.latency_ms = now - oldest if oldest else 0.0
        lanes.gpus = max(lanes.gpus, len(delta.rows))
        lanes.last = delta
        lanes.history.append((now, delta))

    def _forget(self) -> None:
        """Past MAX_WORKERS, drop the workers that left longest ago (lock held)."""
        while len(self._workers) > MAX_WORKERS:
            done = next((a for a, w in self._workers.items() if w.state != "live"), None)
            if done is None:
                return   # every one is live: a cluster that large is kept whole
            del self._workers[done]
            self.forgotten += 1

    def workers(self) -> dict[str, WorkerLanes]:
        """Every worker known, by address, in the order they joined (a copy of the dict; the lanes are live)."""
        with self._lock:
            return dict(self._workers)

    def rows(self) -> list[dict[str, Any]]:
        """One row per worker × GPU (see :meth:`WorkerLanes.rows`)."""
        with self._lock:
            return [row for lanes in self._workers.values() for row in lanes.rows()]
