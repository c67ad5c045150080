"""uvm_lab on a Dask cluster: every worker's unified memory in the client's views.

    from distributed import Client, LocalCluster
    from uvm_lab.dask import ClusterMonitor, UvmLab

    client = Client(LocalCluster(n_workers=4))
    monitor = ClusterMonitor(client)                  # listens before the workers start reporting
    client.register_plugin(UvmLab(backend="sim", devices=2, device_memory="4GiB"))
    monitor.table()                                   # one row per worker x GPU

With ``dask_cuda.LocalCUDACluster`` each worker has its GPU: ``UvmLab(managed_memory=True, pool_size="2GiB")``
puts uvm_lab's chain under it, as ``rmm_managed_memory`` and ``rmm_pool_size`` put RMM's, and CuPy, Numba and
torch allocate from it. Needs ``distributed`` (``pip install uvm_lab[dask]``).

- :mod:`.worker`: the plugin, and the fixed functions a client runs on a worker;
- :mod:`.wire`: the binary delta a worker sends each interval;
- :mod:`.scheduler`: the scheduler plugin that says when a worker is gone;
- :mod:`.picture`: every worker x GPU, folded from the workers' messages;
- :mod:`.client`: the client's monitor of that picture, and its commands to the workers;
- :mod:`.page`: the same picture as a page of Dask's own dashboard (``client.register_plugin(ClusterPage())``).
"""

from __future__ import annotations

from .client import ClusterMonitor
from .page import ClusterPage
from .picture import ClusterPicture, WorkerLanes
from .scheduler import WorkerExits
from .worker import TOPIC, UvmLab

__all__ = ["TOPIC", "ClusterMonitor", "ClusterPage", "ClusterPicture", "UvmLab", "WorkerExits", "WorkerLanes"]
