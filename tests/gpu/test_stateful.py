"""The stateful property tests of pool, statistics, arena and binning, on a real GPU.

The same machines as the simulator's (tests/unit): after any sequence of allocate, free, failed allocate
and release, no two live allocations overlap, nothing leaks and the statistics are exact. Upstreams stay
at a few tens of MiB of managed memory, far below what the card has free.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from ..unit import test_arena_binning_stateful as arena_binning
from ..unit import test_pool_stateful as pool

pytestmark = pytest.mark.gpu

ON_GPU: dict[str, Any] = {"name": "cuda"}


class PoolOnGpu(pool.PoolMachine):
    backend: ClassVar[dict[str, Any]] = ON_GPU


class StatisticsOnGpu(pool.StatisticsMachine):
    backend: ClassVar[dict[str, Any]] = ON_GPU


class ArenaOnGpu(arena_binning.ArenaMachine):
    backend: ClassVar[dict[str, Any]] = ON_GPU


class BinningOnGpu(arena_binning.BinningMachine):
    backend: ClassVar[dict[str, Any]] = ON_GPU


TestPoolOnGpu = PoolOnGpu.TestCase
TestPoolOnGpu.settings = pool.SETTINGS
TestStatisticsOnGpu = StatisticsOnGpu.TestCase
TestStatisticsOnGpu.settings = pool.SETTINGS
TestArenaOnGpu = ArenaOnGpu.TestCase
TestArenaOnGpu.settings = arena_binning.SETTINGS
TestBinningOnGpu = BinningOnGpu.TestCase
TestBinningOnGpu.settings = arena_binning.SETTINGS
