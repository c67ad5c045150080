"""The client's side: every worker × GPU of a cluster, kept current from the workers' deltas.

:class:`ClusterMonitor` subscribes to the workers' topic and folds each delta (:mod:`.wire`) into one
:class:`WorkerLanes` per worker: memory used and total per GPU as last read, what moved and faulted since it
joined, and a bounded history for its lanes. A worker that leaves, dies or restarts keeps its lanes, marked
gone, and nothing of the others changes; a restarted worker comes back under a new address, as new lanes.

Commands go to the worker that owns the buffer, through ``client.run`` of the fixed functions of
:mod:`.worker`, which check them as the panel's are checked.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from .. import cluster_feed
from ..errors import InvalidArgumentError, InvalidStateError, ProtocolError, shown
from . import wire
from .scheduler import WorkerExits
from .worker import ROUTED, TOPIC, answer_timeline, describe_buffers, run_command

__all__ = ["ClusterMonitor", "WorkerLanes"]

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


class ClusterMonitor:
    """Every worker × GPU of ``client``'s cluster, from the deltas of the :class:`~.worker.UvmLab` plugin.

    Registers the scheduler plugin that tells when a worker is gone (:class:`~.scheduler.WorkerExits`) and
    subscribes to :data:`~.worker.TOPIC`. ``clock`` gives wall time in ms (a test's own; ``time.time`` by default).
    """

    def __init__(self, client: Any, *, clock: Any = None) -> None:
        if not all(hasattr(client, a) for a in ("subscribe_topic", "run", "register_plugin")):
            raise InvalidArgumentError(f"client must be a distributed.Client, got {shown(client)}", value=client,
                                       expected="a distributed.Client")
        self.client = client
        self._wall_ms = clock or (lambda: time.time() * 1000)
        self._lock = threading.Lock()
        self._workers: dict[str, WorkerLanes] = {}
        self._changed = threading.Event()
        self.messages = 0
        self.bytes = 0            # the deltas' payloads received
        self.bad = 0              # messages that were not deltas of this version: counted, dropped
        self.forgotten = 0        # workers past MAX_WORKERS, the longest gone first
        client.register_plugin(WorkerExits())
        client.subscribe_topic(TOPIC, self._on_event)
        self._closed = False
        cluster_feed.publish(self)   # the latest monitor made is the one the lab view shows

    def close(self) -> None:
        """Stop listening; what is held stays readable (but no longer in the lab view)."""
        if not self._closed:
            self._closed = True
            self.client.unsubscribe_topic(TOPIC)
            cluster_feed.withdraw(self)

    def __enter__(self) -> ClusterMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what arrives -----------------------------------------------------------------------------------------

    def _on_event(self, event: tuple[float, Any]) -> None:
        _, message = event
        try:
            self.receive(message)
        except ProtocolError:
            with self._lock:
                self.bad += 1

    def receive(self, message: Mapping[str, Any]) -> None:
        """Fold one message of the topic in: a worker joined, sent a delta, left, or is gone.

        Raises
        ------
        ProtocolError
            ``message`` is none of those (it is counted in :attr:`bad` by the subscription, and dropped).
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
        self._changed.set()
        cluster_feed.changed(self)

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

    # -- what a view reads ------------------------------------------------------------------------------------

    def wait(self, timeout: float) -> bool:
        """Wait until something arrives (or ``timeout`` seconds pass); whether it did. Clears the flag."""
        arrived = self._changed.wait(timeout)
        self._changed.clear()
        return arrived

    def workers(self) -> dict[str, WorkerLanes]:
        """Every worker known, by address, in the order they joined (a copy of the dict; the lanes are live)."""
        with self._lock:
            return dict(self._workers)

    def rows(self) -> list[dict[str, Any]]:
        """One row per worker × GPU (see :meth:`WorkerLanes.rows`)."""
        with self._lock:
            return [row for lanes in self._workers.values() for row in lanes.rows()]

    def table(self) -> Any:
        """:meth:`rows` as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.rows())

    # -- what a view asks of a worker -------------------------------------------------------------------------

    def command(self, worker: str, command: Mapping[str, Any]) -> dict[str, Any]:
        """Carry out ``command`` (a ``prefetch`` or ``set_advice`` of the panel's protocol) on ``worker``, which
        owns the buffer; its result, as the panel's: a refused command's typed error is in ``result["error"]``."""
        seq = command.get("seq") if isinstance(command, Mapping) else None
        kind = command.get("type") if isinstance(command, Mapping) else None
        result: dict[str, Any] = {"type": "result", "seq": seq if type(seq) is int else None,
                                  "command": kind if kind in ROUTED else None, "ok": True, "error": None}
        try:
            self.run(worker, command)
        except Exception as err:   # the worker's error (pickled across) or ours: the command's answer
            result["ok"] = False
            result["error"] = {"type": type(err).__name__, "message": str(err)[:500]}
        return result

    def run(self, worker: str, command: Mapping[str, Any]) -> None:
        """Carry out ``command`` on ``worker``, raising its typed error here.

        Raises
        ------
        InvalidArgumentError
            ``worker`` is not one this monitor knows.
        InvalidStateError
            ``worker`` is gone.
        ProtocolError, UvmLabError
            From the worker: the command is malformed, or its entry point refused it.
        """
        self._live(worker)
        self.client.run(run_command, dict(command), workers=[worker])

    def prefetch(self, worker: str, buffer_id: int, location: str, *, first_page: int = 0,
                 pages: int | None = None) -> None:
        """Prefetch pages of buffer ``buffer_id`` of ``worker`` to ``location`` (as :meth:`run`)."""
        self.run(worker, {"type": "prefetch", "seq": 0, "id": buffer_id, "location": location,
                          "first_page": first_page, "pages": pages})

    def set_advice(self, worker: str, buffer_id: int, advice: str, value: Any) -> None:
        """Set ``advice`` of buffer ``buffer_id`` of ``worker`` (as :meth:`run`)."""
        self.run(worker, {"type": "set_advice", "seq": 0, "id": buffer_id, "advice": advice, "value": value})

    def timeline(self, worker: str, start: int, end: int, width: int, lanes: list[int] | None = None,
                 ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """``worker``'s timeline of [start, end] ns for ``width`` pixels: the rows' message and its columns."""
        from ..jupyter.protocol import TIMELINE_COLUMNS

        self._live(worker)
        query = {"type": "timeline", "seq": 0, "start": start, "end": end, "width": width, "lanes": lanes}
        rows, buffers = self.client.run(answer_timeline, query, workers=[worker])[worker]
        return rows, {name: np.frombuffer(data, dtype=dtype) for (name, dtype), data in
                      zip(TIMELINE_COLUMNS, buffers, strict=True)}

    def buffers(self, worker: str, limit: int = 1000) -> list[dict[str, Any]]:
        """``worker``'s live buffers, oldest first: id, label, size, and pages per place."""
        self._live(worker)
        return self.client.run(describe_buffers, limit, workers=[worker])[worker]

    def _live(self, worker: object) -> None:
        with self._lock:
            lanes = self._workers.get(worker) if isinstance(worker, str) else None
            known = list(self._workers)
        if lanes is None:
            raise InvalidArgumentError(f"no worker {shown(worker)} here; the workers are {', '.join(known) or 'none'}",
                                       value=worker, expected="the address of a worker this monitor knows")
        if lanes.state != "live":
            raise InvalidStateError(f"worker {worker} is {lanes.state}: commands go to live workers")
