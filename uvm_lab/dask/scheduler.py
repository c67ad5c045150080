"""The scheduler's side: it alone knows when a worker is gone, dead or restarted, so it tells the clients."""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from .worker import TOPIC

__all__ = ["WorkerExits"]


class WorkerExits(SchedulerPlugin):
    """Says on :data:`~.worker.TOPIC` that a worker left the cluster, however it left: a worker that dies
    sends nothing more itself, and its lanes must still be marked gone."""

    name = "uvm_lab-worker-exits"
    idempotent = True

    def remove_worker(self, scheduler: Any, worker: str, *, stimulus_id: str, **kwargs: Any) -> None:
        scheduler.log_event(TOPIC, {"worker": worker, "gone": stimulus_id})
