"""Observing the real device: CUPTI's unified-memory counters and the host-residency oracle.

- :class:`CuptiCollector` streams real GPU/CPU page faults, migrations, thrashing, throttling and
  remote maps onto the event bus (needs the ``cupti`` extra and a GPU; says why once where it cannot).
- :func:`decode_buffer` / :func:`decode_records` turn CUPTI's raw activity records into events, in bulk.
- :class:`AllocationIndex` / :func:`attribute` say which allocation each record belongs to.
- :func:`host_resident` / :func:`oracle_agreement`: the host's page tables as an exact check of a map;
  :func:`reconcile` (and :meth:`CuptiCollector.check_host`): what lost records missed, as events.
- :func:`watch` / :class:`HostWatcher`: the host's page tables read at a low rate, keeping maps true with
  tracing off (on by default on a real GPU); :mod:`~uvm_lab.tracing.inference`: what a completed prefetch implies.
- :func:`to_perfetto` / :func:`to_chrome_trace` / :func:`to_rmm_csv`: a trace for Perfetto (its protobuf format,
  or JSON), or for RMM's tools.
"""

from .attribution import AllocationIndex, attribute, cause_names
from .cupti import CuptiCollector, TracingUnavailableWarning, cupti_status, measures
from .decode import CUPTI_UM_COUNTER3_DTYPE, decode_buffer, decode_records, encode_records
from .export import to_chrome_trace, to_perfetto, to_rmm_csv
from .pagemap import OracleAgreement, host_resident, oracle_agreement
from .reconcile import Reconciliation, host_truth, reconcile
from .watcher import DEFAULT_INTERVAL, HostWatcher, check_host, get_watcher, unwatch, watch

__all__ = [
    "CUPTI_UM_COUNTER3_DTYPE",
    "DEFAULT_INTERVAL",
    "AllocationIndex",
    "CuptiCollector",
    "HostWatcher",
    "OracleAgreement",
    "Reconciliation",
    "TracingUnavailableWarning",
    "attribute",
    "cause_names",
    "check_host",
    "cupti_status",
    "decode_buffer",
    "decode_records",
    "encode_records",
    "get_watcher",
    "host_resident",
    "host_truth",
    "measures",
    "oracle_agreement",
    "reconcile",
    "to_chrome_trace",
    "to_perfetto",
    "to_rmm_csv",
    "unwatch",
    "watch",
]
