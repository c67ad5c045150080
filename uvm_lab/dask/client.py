"""The client's side: every worker × GPU of a cluster, kept current from the workers' deltas.

:class:`ClusterMonitor` subscribes to the workers' topic and folds each message into a
:class:`~.picture.ClusterPicture`; the lab view shows the latest monitor made (:mod:`uvm_lab.cluster_feed`).

Commands go to the worker that owns the buffer, through ``client.run`` of the fixed functions of
:mod:`.worker`, which check them as the panel's are checked.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import cluster_feed
from ..errors import InvalidArgumentError, InvalidStateError, ProtocolError, shown
from .picture import ClusterPicture, WorkerLanes
from .scheduler import WorkerExits
from .worker import ROUTED, TOPIC, answer_timeline, describe_buffers, run_command

__all__ = ["ClusterMonitor", "WorkerLanes"]

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
        self.picture = ClusterPicture(clock=clock)
        self._changed = threading.Event()
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
            self.picture.count_bad()

    def receive(self, message: Mapping[str, Any]) -> None:
        """Fold one message of the topic in (:meth:`ClusterPicture.receive`), and wake whoever waits for it.

        Raises
        ------
        ProtocolError
            ``message`` is not a uvm_lab worker message (the subscription counts it in :attr:`bad`, and drops it).
        """
        self.picture.receive(message)
        self._changed.set()
        cluster_feed.changed(self)

    @property
    def messages(self) -> int:
        return self.picture.messages

    @property
    def bytes(self) -> int:
        """The deltas' payloads received."""
        return self.picture.bytes

    @property
    def bad(self) -> int:
        """Messages that were not uvm_lab worker messages of this version: counted, dropped."""
        return self.picture.bad

    @property
    def forgotten(self) -> int:
        """Workers forgotten past MAX_WORKERS, the longest gone first."""
        return self.picture.forgotten

    # -- what a view reads ------------------------------------------------------------------------------------

    def wait(self, timeout: float) -> bool:
        """Wait until something arrives (or ``timeout`` seconds pass); whether it did. Clears the flag."""
        arrived = self._changed.wait(timeout)
        self._changed.clear()
        return arrived

    def workers(self) -> dict[str, WorkerLanes]:
        """Every worker known, by address, in the order they joined (a copy of the dict; the lanes are live)."""
        return self.picture.workers()

    def rows(self) -> list[dict[str, Any]]:
        """One row per worker × GPU (see :meth:`WorkerLanes.rows`)."""
        return self.picture.rows()

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
        workers = self.picture.workers()
        lanes = workers.get(worker) if isinstance(worker, str) else None
        known = list(workers)
        if lanes is None:
            raise InvalidArgumentError(f"no worker {shown(worker)} here; the workers are {', '.join(known) or 'none'}",
                                       value=worker, expected="the address of a worker this monitor knows")
        if lanes.state != "live":
            raise InvalidStateError(f"worker {worker} is {lanes.state}: commands go to live workers")
