"""Protocol-buffer wire format, written many messages at a time with numpy.

A trace of a million events is a million small messages of the same shape. Encoding them one Python
object at a time costs microseconds each; here a message's shape is described once, as columns
(:class:`Rows`: one row per message, one column per field, with a mask where a field is absent), and
every row is encoded together: each varint byte position is one numpy operation over all rows.

Every row's size is computed first (nested messages' lengths from their columns' sizes), which gives
where each row starts in the output; then each field is written at every row's cursor at once, and
the cursors move on by what was written. A message may end with a variable number of extra bytes
(:meth:`Rows.tail`): how repeated fields of uneven length are written.

For the few messages that hold strings (descriptors, interned tables), :func:`field` and
:func:`message` encode one message at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError

__all__ = ["Rows", "field", "interleave", "message", "varint", "varint_size"]

_VARINT, _FIXED64, _LENGTH = 0, 1, 2
#: The thresholds at which a varint takes one more byte: 2**7, 2**14, ... 2**63.
_STEPS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


def varint_size(values: np.ndarray) -> np.ndarray:
    """Bytes each unsigned value takes as a varint (1 to 10)."""
    values = np.asarray(values, dtype=np.uint64)
    sizes = np.ones(values.shape, dtype=np.int64)
    if not values.size:
        return sizes
    largest = values.max()
    for step in _STEPS:          # one comparison per byte the largest value needs
        if largest < step:
            break
        sizes += values >= step
    return sizes


def varint(value: int) -> bytes:
    """One unsigned (or two's-complement int64) value as a varint."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def field(number: int, value: int | bytes | str) -> bytes:
    """One field: an int as a varint, ``bytes``/``str`` as a length-delimited field (strings in UTF-8)."""
    if isinstance(value, int):
        return _key(number, _VARINT) + varint(value)
    data = value.encode("utf-8") if isinstance(value, str) else value
    return _key(number, _LENGTH) + varint(len(data)) + data


def message(number: int, *fields: bytes | Iterable[bytes]) -> bytes:
    """A nested message made of already encoded fields (or iterables of them)."""
    body = b"".join(f if isinstance(f, bytes) else b"".join(f) for f in fields)
    return field(number, body)


@dataclass
class _Column:
    key: bytes
    wire_type: int
    values: np.ndarray | Rows          # uint64 values, or the nested messages
    present: np.ndarray | None         # bool per row; None: every row
    sizes: np.ndarray | None = None    # varints: bytes of each value, once worked out


class Rows:
    """Messages of one shape, one per row, encoded together.

    Fields are added in the order they are written. A field given ``present`` is written only in the
    rows where it is True. Values are unsigned 64-bit integers (negative int64 values must be given
    as their two's complement, as protobuf writes them).

    Examples
    --------
    >>> rows = Rows(3)
    >>> rows.varint(1, np.array([1, 300, 5], dtype=np.uint64))
    >>> body = Rows(3); body.varint(2, np.arange(3, dtype=np.uint64), present=np.array([True, False, True]))
    >>> rows.message(4, body)
    >>> rows.encode().tobytes()        # the three messages, back to back
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._columns: list[_Column] = []
        self._tail: tuple[np.ndarray, np.ndarray] | None = None
        self._sizes: np.ndarray | None = None

    def _present(self, present: np.ndarray | None) -> np.ndarray | None:
        if present is None:
            return None
        present = np.asarray(present, dtype=bool)
        if present.shape != (self.n,):
            raise InvalidArgumentError(f"present has shape {present.shape}, expected ({self.n},)",
                                       value=present.shape, expected=f"one flag per row: ({self.n},)")
        return present

    def _values(self, values: np.ndarray | int) -> np.ndarray:
        self._sizes = None           # a new field: sizes worked out before are stale
        values = np.asarray(values)
        if values.shape not in ((), (self.n,)):
            raise InvalidArgumentError(f"values have shape {values.shape}, expected ({self.n},)",
                                       value=values.shape, expected=f"one value per row ({self.n},), or one for all")
        return np.broadcast_to(values.astype(np.uint64, copy=False), (self.n,))

    def varint(self, number: int, values: np.ndarray | int, present: np.ndarray | None = None) -> None:
        """A varint field (uint64, int64 as two's complement, enum, bool)."""
        self._columns.append(_Column(_key(number, _VARINT), _VARINT, self._values(values), self._present(present)))

    def fixed64(self, number: int, values: np.ndarray | int, present: np.ndarray | None = None) -> None:
        """A fixed64 field."""
        self._columns.append(_Column(_key(number, _FIXED64), _FIXED64, self._values(values), self._present(present)))

    def message(self, number: int, rows: Rows, present: np.ndarray | None = None) -> None:
        """A nested message, one row of ``rows`` in each row of this one."""
        if rows.n != self.n:
            raise InvalidArgumentError(f"nested rows has {rows.n} rows, expected {self.n}", value=rows.n,
                                       expected=str(self.n))
        self._sizes = None
        self._columns.append(_Column(_key(number, _LENGTH), _LENGTH, rows, self._present(present)))

    def tail(self, data: np.ndarray, counts: np.ndarray) -> None:
        """Bytes that end each row of this message: ``counts[i]`` of ``data`` (in row order) end row ``i``.

        Already-encoded fields of uneven length (a repeated field) go here.
        """
        counts = np.asarray(counts, dtype=np.int64)
        data = np.asarray(data, dtype=np.uint8)
        if counts.shape != (self.n,) or int(counts.sum()) != len(data) or (counts < 0).any():
            raise InvalidArgumentError("tail counts must give one count per row, adding up to len(data)",
                                       value=counts, expected=f"{self.n} counts >= 0 summing to {len(data)}")
        self._sizes = None
        self._tail = (data, counts)

    # -- sizes -------------------------------------------------------------------------------------------

    def sizes(self) -> np.ndarray:
        """Encoded bytes of each row (tails included)."""
        if self._sizes is not None:
            return self._sizes
        total = np.zeros(self.n, dtype=np.int64) if self._tail is None else self._tail[1].copy()
        for col in self._columns:
            size = self._column_size(col)
            total += size if col.present is None else np.where(col.present, size, 0)
        self._sizes = total
        return total

    def _column_size(self, col: _Column) -> np.ndarray:
        if col.wire_type == _VARINT:
            col.sizes = varint_size(col.values)             # type: ignore[arg-type]
            return len(col.key) + col.sizes
        if col.wire_type == _FIXED64:
            return np.full(self.n, len(col.key) + 8, dtype=np.int64)
        inner = col.values.sizes()                          # type: ignore[union-attr]
        return len(col.key) + varint_size(inner) + inner

    # -- encoding ----------------------------------------------------------------------------------------

    def encode(self) -> np.ndarray:
        """Every row's bytes, one after the other, as a flat ``uint8`` array."""
        sizes = self.sizes()
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        cursor = np.cumsum(sizes) - sizes        # where each row's next byte goes
        self._write(out, cursor, None)
        return out

    def _write(self, out: np.ndarray, cursor: np.ndarray, rows: np.ndarray | None) -> None:
        """Write this message's fields for ``rows`` (indices; None: all) at ``cursor``, moving it on."""
        for col in self._columns:
            mine = rows
            if col.present is not None:
                mine = np.flatnonzero(col.present) if rows is None else rows[col.present[rows]]
            if mine is not None and not len(mine):
                continue
            _write_key(out, cursor, mine, col.key)
            if col.wire_type == _VARINT:
                _write_varints(out, cursor, mine, col.values, col.sizes)   # type: ignore[arg-type]
            elif col.wire_type == _FIXED64:
                values = col.values if mine is None else col.values[mine]   # type: ignore[index]
                little = np.ascontiguousarray(values, dtype="<u8").view(np.uint8).reshape(-1, 8)
                at = cursor if mine is None else cursor[mine]
                for k in range(8):
                    out[at + k] = little[:, k]
                _advance(cursor, mine, 8)
            else:
                nested: Rows = col.values                             # type: ignore[assignment]
                lengths = nested.sizes()
                _write_varints(out, cursor, mine, lengths.astype(np.uint64), varint_size(lengths))
                nested._write(out, cursor, mine)
        if self._tail is not None:
            data, counts = self._tail
            if rows is not None:
                keep = np.zeros(self.n, dtype=bool)
                keep[rows] = True
                data, counts = data[np.repeat(keep, counts)], np.where(keep, counts, 0)
            starts = np.cumsum(counts) - counts
            out[np.repeat(cursor - starts, counts) + np.arange(len(data))] = data
            cursor += counts


def interleave(n: int, parts: list[tuple[np.ndarray, Rows]]) -> np.ndarray:
    """``n`` messages of several shapes, in order: row ``j`` of ``parts[i][1]`` is message ``parts[i][0][j]``.

    Rows of one shape have few absent fields, and fields present in every row are the quickest to write.
    """
    sizes = np.zeros(n, dtype=np.int64)
    for where, rows in parts:
        sizes[where] = rows.sizes()
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    starts = np.cumsum(sizes) - sizes
    for where, rows in parts:
        rows._write(out, starts[where], None)
    return out


def _advance(cursor: np.ndarray, rows: np.ndarray | None, by: np.ndarray | int) -> None:
    if rows is None:
        cursor += by
    else:
        cursor[rows] += by


def _write_key(out: np.ndarray, cursor: np.ndarray, rows: np.ndarray | None, key: bytes) -> None:
    """The same bytes (a field's key) at each row's cursor."""
    at = cursor if rows is None else cursor[rows]
    for k, byte in enumerate(key):
        out[at + k] = byte
    _advance(cursor, rows, len(key))


def _write_varints(out: np.ndarray, cursor: np.ndarray, rows: np.ndarray | None, values: np.ndarray,
                   sizes: np.ndarray | None) -> None:
    values = np.asarray(values, dtype=np.uint64)
    if sizes is None:
        sizes = varint_size(values)
    if rows is not None:
        values, sizes = values[rows], sizes[rows]
    at = cursor if rows is None else cursor[rows]
    widest = int(sizes.max()) if len(sizes) else 0
    if widest <= 1:
        out[at] = values.astype(np.uint8)
    else:
        rest = values.copy()
        for k in range(widest):
            byte = (rest & np.uint64(0x7F)).astype(np.uint8) | ((sizes > k + 1).astype(np.uint8) << 7)
            if k == 0:
                out[at] = byte
            else:
                longer = sizes > k
                out[at[longer] + k] = byte[longer]
            rest >>= np.uint64(7)
    _advance(cursor, rows, sizes)


