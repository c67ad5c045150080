"""Sizes: the page geometry of unified memory, and parsing "2GiB"-style strings."""

from __future__ import annotations

import re
from fractions import Fraction
from numbers import Integral

from .errors import InvalidSizeError, shown

__all__ = ["BIG_PAGE_SIZE", "BLOCK_SIZE", "MAX_SIZE", "PAGE_SIZE", "format_bytes", "parse_size"]

#: The residency page: the CPU's page size on x86-64 (the driver tracks residency per page).
PAGE_SIZE = 4 << 10
#: The big page: GPU migrations move whole 64 KiB big pages.
BIG_PAGE_SIZE = 64 << 10
#: The VA block: the driver's unit of GPU memory allocation, prefetch and eviction.
BLOCK_SIZE = 2 << 20

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
#: The largest size there is: what a 64-bit size_t holds.
MAX_SIZE = (1 << 64) - 1
# Digits past what any size needs are refused before they are read (2**64 has 20 digits; decimals may trail zeros).
_MAX_DIGITS = 64
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)


def parse_size(value: object, *, name: str = "size", allow_zero: bool = True) -> int:
    """Return ``value`` as a number of bytes.

    Accepts a non-negative integer or a string such as ``"512MiB"``, ``"2 GB"`` or ``"4096"``
    (binary units KiB/MiB/GiB/TiB, decimal units kB/MB/GB/TB, case-insensitive).

    Raises
    ------
    InvalidSizeError
        For anything else, naming the value and what would be valid.
    """
    if type(value) is int and (0 < value <= MAX_SIZE or (value == 0 and allow_zero)):
        return value   # the hot path: a plain byte count
    expected = 'a whole number of bytes from 0 to 2**64 - 1, or a string such as "512MiB" or "2GB"'
    if isinstance(value, bool) or not isinstance(value, (Integral, str)):
        raise InvalidSizeError(f"{name} must be {expected}, got {shown(value)} ({type(value).__name__})",
                               value=value, expected=expected)
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS or len(match.group(1)) > _MAX_DIGITS:
            raise InvalidSizeError(f"{name} must be {expected}, got {shown(value)}", value=value, expected=expected)
        number = Fraction(match.group(1)) * _UNITS[unit]   # exact: no float between the digits and the bytes
        if number.denominator != 1:
            raise InvalidSizeError(f"{name} must be a whole number of bytes, got {value!r} = {float(number)} bytes",
                                   value=value, expected=expected)
        size = int(number)
    else:
        size = int(value)
    if size < 0 or (size == 0 and not allow_zero) or size > MAX_SIZE:
        bound = "positive" if not allow_zero else "non-negative"
        raise InvalidSizeError(f"{name} must be {bound} and at most 2**64 - 1 bytes, got {shown(value)}",
                               value=value, expected=f"{bound}: {expected}")
    return size


def format_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``; exact multiples print without decimals (``"512 MiB"``)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            q = n / scale
            return f"{q:.0f} {unit}" if q == int(q) else f"{q:.1f} {unit}"
    return f"{n} B"
