"""The comm protocol between the kernel and the UVM Lab panel.

Its twin is ``extension/src/protocol.ts``: every message below has a same-named type there, with
the same fields, and ``tests/unit/test_protocol.py`` checks that the two stay in step.

Every message is a JSON object with a ``type``. The front end may send only the four commands
below; :func:`parse_command` checks every field of each before the kernel acts on it, and nothing
a message carries is ever evaluated::

    front end -> kernel (commands)
        hello       {seq}                      send a full snapshot
        prefetch    {seq, id, location}        location: "gpu" | "host"
        set_advice  {seq, id, advice, value}   read_mostly: bool
                                               preferred_location: "host" | "gpu" | "gpu:N" | null
                                               accessed_by: a list of those locations ([] unsets)
        pause       {seq, paused}              stop (true) or restart (false) updates

    kernel -> front end
        snapshot    {version, page_size, cell_limit, device, allocations}   + one buffer each
        update      {device, allocations}                                   + one buffer each
        removed     {ids}
        result      {seq, command, ok, error}  one per command; error: {type, message} or null

Residency never travels as a JSON list. The i-th binary buffer of a ``snapshot`` or ``update``
holds the page states of ``allocations[i]``: one byte per 4 KiB page (0 nowhere, 1 host, 2 gpu,
3 both, as in :mod:`uvm_lab.residency`). An allocation of more than ``CELL_LIMIT`` pages is sent
as ``cells`` bytes, each standing for ``cell_pages`` consecutive pages (the last cell may hold
fewer) and holding the state most of those pages are in; ``counts`` always gives the exact number
of pages in each state, so nothing is lost to the downsampling but the picture's resolution.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal, TypedDict

import numpy as np

from ..errors import ProtocolError
from .dashboard.collect import bin_states

__all__ = [
    "ADVICE_NAMES",
    "CELL_LIMIT",
    "COMMANDS",
    "COMM_TARGET",
    "LOCATIONS",
    "PROTOCOL_VERSION",
    "AdviceState",
    "AllocationInfo",
    "Command",
    "DeviceInfo",
    "ErrorInfo",
    "Hello",
    "PageCounts",
    "Pause",
    "Prefetch",
    "Removed",
    "Result",
    "SetAdvice",
    "Snapshot",
    "Update",
    "pack_states",
    "parse_command",
]

COMM_TARGET: Final = "uvm_lab"
PROTOCOL_VERSION: Final = 1

#: Above this many pages an allocation's map is sent downsampled, in cells of several pages.
CELL_LIMIT: Final = 16384

#: Where a prefetch from the panel may send an allocation.
LOCATIONS: Final = ("gpu", "host")
ADVICE_NAMES: Final = ("read_mostly", "preferred_location", "accessed_by")

# JavaScript numbers are exact only up to 2**53; ids and sequence numbers stay below.
_MAX_INT = 2**53 - 1
# "host", "gpu" or "gpu:N"; whether device N exists is the backend's question, not the protocol's.
_ADVICE_LOCATION = re.compile(r"(?:host|gpu(?::[0-9]{1,3})?)\Z")
_MAX_ACCESSED_BY = 64


# --- front end -> kernel ------------------------------------------------------------------------


class Hello(TypedDict):
    type: Literal["hello"]
    seq: int


class Prefetch(TypedDict):
    type: Literal["prefetch"]
    seq: int
    id: int
    location: Literal["gpu", "host"]


class SetAdvice(TypedDict):
    type: Literal["set_advice"]
    seq: int
    id: int
    advice: Literal["read_mostly", "preferred_location", "accessed_by"]
    value: bool | str | list[str] | None


class Pause(TypedDict):
    type: Literal["pause"]
    seq: int
    paused: bool


Command = Hello | Prefetch | SetAdvice | Pause


# --- kernel -> front end ------------------------------------------------------------------------


class AdviceState(TypedDict):
    read_mostly: bool
    preferred_location: str | None
    accessed_by: list[str]


class PageCounts(TypedDict):
    gpu: int
    host: int
    both: int
    nowhere: int


class AllocationInfo(TypedDict):
    id: int
    label: str
    size: int
    is_managed: bool
    advice: AdviceState
    pages: int
    cell_pages: int
    cells: int
    counts: PageCounts


class DeviceInfo(TypedDict):
    backend: str
    free: int
    total: int


class Snapshot(TypedDict):
    type: Literal["snapshot"]
    version: int
    page_size: int
    cell_limit: int
    device: DeviceInfo
    allocations: list[AllocationInfo]


class Update(TypedDict):
    type: Literal["update"]
    device: DeviceInfo
    allocations: list[AllocationInfo]


class Removed(TypedDict):
    type: Literal["removed"]
    ids: list[int]


class ErrorInfo(TypedDict):
    type: str
    message: str


class Result(TypedDict):
    type: Literal["result"]
    seq: int | None
    command: str | None
    ok: bool
    error: ErrorInfo | None


# --- validation ---------------------------------------------------------------------------------

COMMANDS: Final[dict[str, tuple[str, ...]]] = {
    "hello": ("seq",),
    "prefetch": ("seq", "id", "location"),
    "set_advice": ("seq", "id", "advice", "value"),
    "pause": ("seq", "paused"),
}


def parse_command(data: object) -> Command:
    """Check that ``data`` is one of the known commands, field by field, and return it.

    Raises :class:`~uvm_lab.errors.ProtocolError` naming the bad value and what would be valid.
    Only the message's shape is checked here; whether the allocation still exists, or the device
    is there, is for the entry point the command calls to say.
    """
    if not isinstance(data, Mapping):
        raise ProtocolError(f"a command must be a JSON object, got {type(data).__name__}", command=data)
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in COMMANDS:
        raise ProtocolError(
            f"unknown command type {kind!r}; the commands are {', '.join(COMMANDS)}", command=data
        )
    fields = COMMANDS[kind]
    got = set(data) - {"type"}
    if missing := [f for f in fields if f not in got]:
        raise ProtocolError(f"{kind} is missing {_names(missing)}; its fields are {', '.join(fields)}", command=data)
    if extra := sorted(got - set(fields)):
        raise ProtocolError(f"{kind} got unexpected {_names(extra)}; its fields are {', '.join(fields)}", command=data)

    seq = _integer(data, "seq", low=0)
    if kind == "hello":
        return Hello(type="hello", seq=seq)
    if kind == "pause":
        return Pause(type="pause", seq=seq, paused=_boolean(data, "paused"))
    alloc_id = _integer(data, "id", low=1)
    if kind == "prefetch":
        location = data["location"]
        if location not in LOCATIONS or not isinstance(location, str):
            raise ProtocolError(f"prefetch location must be one of {_choices(LOCATIONS)}, got {location!r}",
                                command=data)
        return Prefetch(type="prefetch", seq=seq, id=alloc_id, location=location)  # type: ignore[typeddict-item]
    advice = data["advice"]
    if advice not in ADVICE_NAMES or not isinstance(advice, str):
        raise ProtocolError(f"advice must be one of {_choices(ADVICE_NAMES)}, got {advice!r}", command=data)
    value = _advice_value(data, advice)
    return SetAdvice(type="set_advice", seq=seq, id=alloc_id, advice=advice, value=value)  # type: ignore[typeddict-item]


def _advice_value(data: Mapping[str, Any], advice: str) -> bool | str | list[str] | None:
    value = data["value"]
    if advice == "read_mostly":
        return _boolean(data, "value", what="read_mostly value")
    if advice == "preferred_location":
        if value is None:
            return None
        return _advice_location(value, data, "preferred_location value")
    if not isinstance(value, list):
        raise ProtocolError(f"accessed_by value must be a list of locations, got {value!r}", command=data)
    if len(value) > _MAX_ACCESSED_BY:
        raise ProtocolError(f"accessed_by takes at most {_MAX_ACCESSED_BY} locations, got {len(value)}", command=data)
    locations = [_advice_location(v, data, "accessed_by location") for v in value]
    if len(set(locations)) != len(locations):
        raise ProtocolError(f"accessed_by locations must be distinct, got {value!r}", command=data)
    return locations


def _advice_location(value: object, data: Mapping[str, Any], what: str) -> str:
    if not isinstance(value, str) or not _ADVICE_LOCATION.match(value):
        raise ProtocolError(f'{what} must be "host", "gpu" or "gpu:N", got {value!r}', command=data)
    return value


def _integer(data: Mapping[str, Any], name: str, *, low: int) -> int:
    value = data[name]
    # bool is an int in Python but never a valid id; floats such as 3.0 are not accepted either.
    if type(value) is not int or not low <= value <= _MAX_INT:
        raise ProtocolError(f"{name} must be a whole number from {low} to 2**53-1, got {value!r}", command=data)
    return value


def _boolean(data: Mapping[str, Any], name: str, *, what: str | None = None) -> bool:
    value = data[name]
    if not isinstance(value, bool):
        raise ProtocolError(f"{what or name} must be true or false, got {value!r}", command=data)
    return value


def _names(fields: list[str]) -> str:
    return ("field " if len(fields) == 1 else "fields ") + ", ".join(repr(f) for f in fields)


def _choices(options: tuple[str, ...]) -> str:
    return ", ".join(f'"{o}"' for o in options)


# --- residency encoding -------------------------------------------------------------------------


def pack_states(states: np.ndarray, limit: int = CELL_LIMIT) -> tuple[int, np.ndarray, PageCounts]:
    """The bytes that carry a page-state array, and its exact counts: ``(cell_pages, cells, counts)``.

    Up to ``limit`` pages, one byte per page (``cell_pages`` 1). Beyond, each byte stands for
    ``cell_pages`` consecutive pages and holds the state most of them are in (the dashboard's
    binning, ties to the lower state number); the last cell may stand for fewer pages. A page
    on any GPU counts as "gpu", so the bytes are always 0 to 3.
    """
    states = np.asarray(states, dtype=np.uint8)
    if not len(states):
        return 1, np.zeros(0, dtype=np.uint8), PageCounts(gpu=0, host=0, both=0, nowhere=0)
    bins = bin_states(states, limit)
    cell_pages = int(bins["last"][0] - bins["first"][0] + 1)
    gpu, host, both, nowhere = (int(bins[name].sum()) for name in ("gpu", "host", "both", "nowhere"))
    counts = PageCounts(gpu=gpu, host=host, both=both, nowhere=nowhere)
    return cell_pages, np.ascontiguousarray(bins["state"], dtype=np.uint8), counts
