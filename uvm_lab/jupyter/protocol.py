"""The comm protocol between the kernel and the UVM Lab panel.

Its twin is ``extension/src/protocol.ts``: every message below has a same-named type there, with
the same fields, and ``tests/unit/test_protocol.py`` checks that the two stay in step.

Every message is a JSON object with a ``type``. The front end may send only the four commands
below; :func:`parse_command` checks every field of each before the kernel acts on it, and nothing
a message carries is ever evaluated::

    front end -> kernel (commands)
        hello       {seq}                      send a full snapshot
        prefetch    {seq, id, location}        location: "host" | "gpu" | "gpu:N"
        set_advice  {seq, id, advice, value}   read_mostly: bool
                                               preferred_location: "host" | "gpu" | "gpu:N" | null
                                               accessed_by: a list of those locations ([] unsets)
        pause       {seq, paused}              stop (true) or restart (false) updates

    kernel -> front end
        snapshot    {version, page_size, cell_limit, device, allocations}   + one buffer each
        update      {device, allocations}                                   + one buffer each
        removed     {ids}
        result      {seq, command, ok, error}  one per command; error: {type, message} or null

A location is checked for its shape only: whether GPU N exists is the backend's question, and its
answer (a typed error) comes back in the ``result``. ``device.device_count`` says how many GPUs there are.

Residency never travels as a JSON list. The i-th binary buffer of a ``snapshot`` or ``update``
holds the residency of ``allocations[i]``: one byte per 4 KiB page, the code of the page's category
(:func:`uvm_lab.page_states.categories`, named by ``CATEGORY_NAMES``: 0 nowhere, 1 host, 2 both,
3 unknown, 4 gpus, 5 + d GPU d alone). The panel never sees a page state's bits, so it names and
colours a page exactly as the dashboard does. An allocation of more than ``CELL_LIMIT`` pages is
sent as ``cells`` bytes, each standing for ``cell_pages`` consecutive pages (the last cell may hold
fewer) and holding the category most of those pages are in; ``counts`` always gives the exact number
of pages in every category (zero included), so nothing is lost to the downsampling but the
picture's resolution.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal, TypedDict, cast

import numpy as np

from ..errors import InvalidArgumentError, ProtocolError
from ..page_states import CATEGORY_NAMES
from .dashboard.collect import bin_states

__all__ = [
    "ADVICE_NAMES",
    "CATEGORY_NAMES",
    "CELL_LIMIT",
    "COMMANDS",
    "COMM_TARGET",
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
# 2: cells carry category codes (one per GPU, "unknown"); counts are per category; device_count.
PROTOCOL_VERSION: Final = 2

#: Above this many pages an allocation's map is sent downsampled, in cells of several pages.
CELL_LIMIT: Final = 16384

ADVICE_NAMES: Final = ("read_mostly", "preferred_location", "accessed_by")

# JavaScript numbers are exact only up to 2**53; ids and sequence numbers stay below.
_MAX_INT = 2**53 - 1
# "host", "gpu" or "gpu:N", for prefetch and advice alike; whether device N exists is the backend's
# question, not the protocol's.
_LOCATION = re.compile(r"(?:host|gpu(?::[0-9]{1,3})?)\Z")
_MAX_ACCESSED_BY = 64


# --- front end -> kernel ------------------------------------------------------------------------


class Hello(TypedDict):
    type: Literal["hello"]
    seq: int


class Prefetch(TypedDict):
    type: Literal["prefetch"]
    seq: int
    id: int
    location: str  # "host" | "gpu" | "gpu:N"


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


# Pages per category, every name of CATEGORY_NAMES (zero included). Spelled out, as its twin is; a
# test checks the keys against CATEGORY_NAMES. Functional syntax: "gpu:0" is not an identifier.
PageCounts = TypedDict("PageCounts", {
    "nowhere": int, "host": int, "both": int, "unknown": int, "gpus": int,
    "gpu:0": int, "gpu:1": int, "gpu:2": int, "gpu:3": int, "gpu:4": int, "gpu:5": int,
})


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
    device_count: int
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
        location = _location(data["location"], data, "prefetch location")
        return Prefetch(type="prefetch", seq=seq, id=alloc_id, location=location)
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
        return _location(value, data, "preferred_location value")
    if not isinstance(value, list):
        raise ProtocolError(f"accessed_by value must be a list of locations, got {value!r}", command=data)
    if len(value) > _MAX_ACCESSED_BY:
        raise ProtocolError(f"accessed_by takes at most {_MAX_ACCESSED_BY} locations, got {len(value)}", command=data)
    locations = [_location(v, data, "accessed_by location") for v in value]
    if len(set(locations)) != len(locations):
        raise ProtocolError(f"accessed_by locations must be distinct, got {value!r}", command=data)
    return locations


def _location(value: object, data: Mapping[str, Any], what: str) -> str:
    if not isinstance(value, str) or not _LOCATION.match(value):
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

    Each byte is a category code (:func:`uvm_lab.page_states.categories`). Up to ``limit`` pages, one
    byte per page (``cell_pages`` 1). Beyond, each byte stands for ``cell_pages`` consecutive pages and
    holds the category most of them are in (the dashboard's binning, ties to the lower code); the last
    cell may stand for fewer pages. ``counts`` has every category, by name, with its exact pages.
    """
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
        raise InvalidArgumentError(f"limit must be a whole number of cells >= 1, got {limit!r}", value=limit,
                                   expected="a whole number >= 1")
    bins = bin_states(states, limit)
    counts = cast(PageCounts, {name: int(bins[name].sum()) for name in CATEGORY_NAMES})
    cell_pages = int(bins["last"][0] - bins["first"][0] + 1) if len(bins["first"]) else 1
    return cell_pages, bins["category"], counts
