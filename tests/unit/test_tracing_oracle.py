"""The host-residency oracle: /proc/self/pagemap's present bits, and a map checked against them."""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np
import pytest

from uvm_lab.errors import InvalidArgumentError
from uvm_lab.residency_map import BOTH, GPU, HOST, NOWHERE, ResidencyMap
from uvm_lab.tracing import host_resident, oracle_agreement

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/pagemap is Linux's")
PAGES = 64


@pytest.fixture
def region():
    """64 fresh anonymous pages, of which pages 0, 5, 6 and 40-63 are written (so present)."""
    m = mmap.mmap(-1, PAGES * 4096)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        m.madvise(mmap.MADV_NOHUGEPAGE)   # a huge page would make untouched neighbours present
    touched = [0, 5, 6, *range(40, PAGES)]
    for p in touched:
        m[p * 4096] = 1
    address = ctypes.addressof(ctypes.c_char.from_buffer(m))
    yield address, np.isin(np.arange(PAGES), touched)
    del address
    m.close()


def test_present_bits_follow_writes(region):
    address, touched = region
    assert (host_resident(address, PAGES * 4096) == touched).all()
    assert host_resident(address + 4096 * 5 + 100, 4096).tolist() == [True, True]   # a range across two pages
    assert len(host_resident(address, 0)) == 0


def test_a_map_that_matches_agrees_fully(region):
    address, touched = region
    states = np.where(touched, HOST, GPU).astype(np.uint8)
    states[40:44] = BOTH                    # read-duplicated pages have a host copy too
    result = oracle_agreement(ResidencyMap(address, PAGES * 4096, states))
    assert (result.pages, result.agree, result.fraction) == (PAGES, PAGES, 1.0)
    assert len(result.map_only) == len(result.host_only) == 0


def test_disagreements_are_counted_and_located(region):
    address, touched = region
    states = np.where(touched, HOST, NOWHERE).astype(np.uint8)
    states[[1, 2]] = HOST                   # the map claims pages the host does not hold
    states[50] = GPU                        # and misses one it does
    result = oracle_agreement(ResidencyMap(address, PAGES * 4096, states))
    assert result.agree == PAGES - 3 and result.fraction == pytest.approx((PAGES - 3) / PAGES)
    assert result.map_only.tolist() == [1, 2] and result.host_only.tolist() == [50]


def test_bad_arguments_are_refused():
    with pytest.raises(InvalidArgumentError):
        oracle_agreement("not a map")
    with pytest.raises(InvalidArgumentError, match="inside a page"):
        oracle_agreement(ResidencyMap(4097, 4096, np.zeros(1, dtype=np.uint8)))
    with pytest.raises(InvalidArgumentError):
        host_resident(-1, 4096)
    with pytest.raises(InvalidArgumentError):
        host_resident(4096, True)
