"""A page in Dask's own dashboard, as distributed's RMM plot is one: every worker × GPU, at ``/uvm_lab``.

:class:`ClusterPage` is a scheduler plugin. It folds the workers' messages into its own
:class:`~.picture.ClusterPicture` as the scheduler logs them (``SchedulerPlugin.log_event``), and serves them from
the scheduler's HTTP server, beside the dashboard: ``/uvm_lab`` as a table that reloads itself every two seconds,
``/uvm_lab.json`` as rows (:meth:`~.picture.WorkerLanes.rows`). No client need be connected::

    client.register_plugin(ClusterPage())
    # then open <the dashboard's address>/uvm_lab
"""

from __future__ import annotations

import html
import json
from typing import Any, Final

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado import web

from ..errors import ProtocolError
from ..units import format_bytes
from .picture import ClusterPicture
from .worker import TOPIC

__all__ = ["PATH", "ClusterPage"]

#: Where the page is served, on the scheduler's HTTP server (the dashboard's).
PATH: Final = "/uvm_lab"

_COLUMNS: Final = (("name", "worker"), ("worker", "address"), ("gpu", "GPU"), ("state", "state"),
                   ("used", "used"), ("total", "capacity"), ("htod_bytes", "HtoD"), ("dtoh_bytes", "DtoH"),
                   ("dtod_bytes", "peer in"), ("gpu_faults", "GPU faults"), ("evicted_bytes", "evicted"),
                   ("pages", "pages held"), ("events", "events"), ("lost", "deltas lost"))
_BYTES: Final = {"used", "total", "htod_bytes", "dtoh_bytes", "dtod_bytes", "evicted_bytes"}


class ClusterPage(SchedulerPlugin):
    """Every worker × GPU on a page of the scheduler's dashboard (see the module)."""

    name = "uvm_lab-page"
    idempotent = True

    picture: ClusterPicture | None = None   # made on the scheduler: the plugin travels there pickled

    async def start(self, scheduler: Any) -> None:
        self.picture = ClusterPicture()
        handlers = [(PATH + r"(\.json)?", _Page, {"picture": self.picture})]
        scheduler.http_application.add_handlers(r".*", handlers)

    def log_event(self, topic: str, msg: Any) -> None:
        if topic != TOPIC or self.picture is None:
            return
        try:
            self.picture.receive(msg)
        except ProtocolError:
            self.picture.count_bad()


class _Page(web.RequestHandler):
    def initialize(self, picture: ClusterPicture) -> None:
        self.picture = picture

    def get(self, json_suffix: str | None = None) -> None:
        rows = self.picture.rows()
        if json_suffix:
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps({"rows": rows, "bad": self.picture.bad, "forgotten": self.picture.forgotten}))
            return
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(render(rows, bad=self.picture.bad))


def render(rows: list[dict[str, Any]], *, bad: int = 0) -> str:
    """The page: a table of ``rows``, a gone worker's greyed; every text escaped."""
    def cell(key: str, value: Any) -> str:
        text = format_bytes(int(value)) if key in _BYTES else (f"{value:,}" if isinstance(value, int) else str(value))
        return f"<td>{html.escape(text)}</td>"

    head = "".join(f"<th>{html.escape(title)}</th>" for _, title in _COLUMNS)
    body = "".join(
        f'<tr class="{"gone" if row["state"] != "live" else "live"}">'
        + "".join(cell(key, row[key]) for key, _ in _COLUMNS) + "</tr>" for row in rows)
    workers = len({row["worker"] for row in rows})
    note = f" · {bad:,} bad messages dropped" if bad else ""
    return ("<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='2'>"
            "<title>uvm_lab: workers × GPUs</title><style>body{font:13px sans-serif;margin:16px}"
            "table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}"
            "tr.gone{color:#9e9e9e}</style></head><body>"
            f"<h3>uvm_lab: {workers} worker(s), {len(rows)} GPU lane(s){html.escape(note)}</h3>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></body></html>")
