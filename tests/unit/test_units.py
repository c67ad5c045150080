"""Sizes and locations as users write them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


@pytest.mark.parametrize(("text", "nbytes"), [
    ("1.001KB", 1001), ("0.5KiB", 512), (str(2**53 + 1), 2**53 + 1), (2**64 - 1, 2**64 - 1),
    (str(2**64 - 1), 2**64 - 1), ("16777216TiB", 2**64), ("0.000001MB", 1),
])
def test_sizes_are_read_exactly(text, nbytes):
    if nbytes > ul.units.MAX_SIZE:
        with pytest.raises(InvalidSizeError, match=r"at most 2\*\*64 - 1"):
            ul.parse_size(text)
    else:
        assert ul.parse_size(text) == nbytes


@given(st.integers(0, 2**64 - 1), st.sampled_from(["", "B", "KiB", "kB", "MiB", "GB"]))
def test_any_size_up_to_2_to_the_64_is_read_exactly(n, unit):
    nbytes = n * {"": 1, "B": 1, "KiB": 1024, "kB": 1000, "MiB": 1 << 20, "GB": 10**9}[unit]
    if nbytes <= ul.units.MAX_SIZE:
        assert ul.parse_size(f"{n}{unit}") == nbytes
        assert ul.parse_size(nbytes) == nbytes
    else:
        with pytest.raises(InvalidSizeError):
            ul.parse_size(f"{n}{unit}")


@pytest.mark.parametrize("bad", [2**64, str(2**64), "1" * 400, 10**400, "1.0005KB", "1e3", "１２"])
def test_sizes_past_2_to_the_64_or_not_whole_are_typed_errors_that_name_them(bad):
    with pytest.raises(InvalidSizeError) as info:
        ul.parse_size(bad)
    assert info.value.value == bad and len(str(info.value)) < 400


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
