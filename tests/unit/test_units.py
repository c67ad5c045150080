"""Sizes and locations as users write them."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidLocationError, InvalidSizeError
from uvm_lab.location import Location


@pytest.mark.parametrize(("text", "nbytes"), [
    ("512MiB", 512 << 20), ("2GiB", 2 << 30), ("2 GB", 2_000_000_000), ("4096", 4096), ("1.5KiB", 1536),
    ("64kib", 64 << 10), (0, 0), (7, 7), ("1TiB", 1 << 40),
])
def test_parse_size(text, nbytes):
    assert ul.parse_size(text) == nbytes


@pytest.mark.parametrize("bad", ["", "MiB", "-1MiB", "1.3B", "5 furlongs", -4, 2.0, None, True, b"1"])
def test_parse_size_rejects(bad):
    with pytest.raises(InvalidSizeError) as info:
        ul.parse_size(bad)
    assert info.value.value == bad and "512MiB" in info.value.expected


def test_parse_size_positive():
    with pytest.raises(InvalidSizeError, match="positive"):
        ul.parse_size(0, allow_zero=False)


def test_format_bytes():
    assert [ul.format_bytes(n) for n in (0, 1536, 512 << 20, 3 << 30)] == ["0 B", "1.5 KiB", "512 MiB", "3 GiB"]


@pytest.mark.parametrize(("text", "loc"), [
    ("host", Location(-1)), ("CPU", Location(-1)), ("gpu", Location(0)), ("cuda:1", Location(1)),
    ("device", Location(0)), (1, Location(1)), (-1, Location(-1)), (Location(0), Location(0)),
])
def test_parse_location(text, loc):
    assert Location.parse(text, device_count=2) == loc


@pytest.mark.parametrize("bad", ["tpu", "gpu:2", 2, -2, 1.0, None, "gpu:x"])
def test_parse_location_rejects(bad):
    with pytest.raises(InvalidLocationError) as info:
        Location.parse(bad, device_count=2)
    assert info.value.value == bad and "host" in info.value.expected
