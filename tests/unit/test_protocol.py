"""The comm protocol: every command validated, every malformed one refused without effect, and the
TypeScript twin (extension/src/protocol.ts) kept in step with the TypedDicts."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import ProtocolError
from uvm_lab.jupyter import protocol
from uvm_lab.jupyter.comm import PanelSession
from uvm_lab.jupyter.protocol import CELL_LIMIT, pack_states, parse_command

PROTOCOL_TS = Path(__file__).resolve().parents[2] / "extension" / "src" / "protocol.ts"

VALID = [
    ({"type": "hello", "seq": 0}, {"type": "hello", "seq": 0}),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu"}, None),
    ({"type": "prefetch", "seq": 2, "id": 7, "location": "host"}, None),
    ({"type": "set_advice", "seq": 3, "id": 7, "advice": "read_mostly", "value": True}, None),
    ({"type": "set_advice", "seq": 3, "id": 7, "advice": "read_mostly", "value": False}, None),
    ({"type": "set_advice", "seq": 4, "id": 7, "advice": "preferred_location", "value": "gpu:0"}, None),
    ({"type": "set_advice", "seq": 4, "id": 7, "advice": "preferred_location", "value": "host"}, None),
    ({"type": "set_advice", "seq": 4, "id": 7, "advice": "preferred_location", "value": None}, None),
    ({"type": "set_advice", "seq": 5, "id": 7, "advice": "accessed_by", "value": ["gpu", "host"]}, None),
    ({"type": "set_advice", "seq": 5, "id": 7, "advice": "accessed_by", "value": []}, None),
    ({"type": "pause", "seq": 6, "paused": True}, None),
    ({"type": "pause", "seq": 2**53 - 1, "paused": False}, None),
]


@pytest.mark.parametrize(("data", "expected"), VALID, ids=lambda v: str(v) if v is None else None)
def test_valid_commands_parse_to_themselves(data, expected):
    command = parse_command(data)
    assert command == (expected or data)
    assert command is not data  # a fresh dict: nothing the front end sent is kept by reference


def test_every_command_type_is_covered():
    assert {d["type"] for d, _ in VALID} == set(protocol.COMMANDS)


MALFORMED = [
    # (message, what the error must mention)
    (None, "JSON object"),
    ([], "JSON object"),
    ("hello", "JSON object"),
    (42, "JSON object"),
    ({}, "unknown command type None"),
    ({"seq": 1}, "unknown command type None"),
    ({"type": 3, "seq": 1}, "unknown command type 3"),
    ({"type": "exec", "seq": 1, "code": "import os"}, "unknown command type 'exec'"),
    ({"type": "__import__", "seq": 1}, "the commands are hello, prefetch, set_advice, pause"),
    ({"type": "Hello", "seq": 1}, "unknown command type 'Hello'"),
    ({"type": "hello"}, "missing field 'seq'"),
    ({"type": "prefetch", "seq": 1, "id": 1}, "missing field 'location'"),
    ({"type": "prefetch", "seq": 1}, "missing fields 'id', 'location'"),
    ({"type": "set_advice", "seq": 1, "id": 1, "advice": "read_mostly"}, "missing field 'value'"),
    ({"type": "pause", "seq": 1}, "missing field 'paused'"),
    ({"type": "hello", "seq": 1, "extra": 0}, "unexpected field 'extra'"),
    ({"type": "prefetch", "seq": 1, "id": 1, "location": "gpu", "stream": 0}, "unexpected field 'stream'"),
    ({"type": "pause", "seq": 1, "paused": True, "a": 1, "b": 2}, "unexpected fields 'a', 'b'"),
    ({"type": "hello", "seq": -1}, "seq must be a whole number"),
    ({"type": "hello", "seq": 1.0}, "got 1.0"),
    ({"type": "hello", "seq": "1"}, "got '1'"),
    ({"type": "hello", "seq": True}, "got True"),
    ({"type": "hello", "seq": 2**53}, "seq must be a whole number"),
    ({"type": "prefetch", "seq": 1, "id": 0, "location": "gpu"}, "id must be a whole number from 1"),
    ({"type": "prefetch", "seq": 1, "id": -3, "location": "gpu"}, "got -3"),
    ({"type": "prefetch", "seq": 1, "id": "7", "location": "gpu"}, "got '7'"),
    ({"type": "prefetch", "seq": 1, "id": 7.0, "location": "gpu"}, "got 7.0"),
    ({"type": "prefetch", "seq": 1, "id": None, "location": "gpu"}, "got None"),
    ({"type": "prefetch", "seq": 1, "id": False, "location": "gpu"}, "got False"),
    ({"type": "prefetch", "seq": 1, "id": [7], "location": "gpu"}, "got [7]"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "tpu"}, 'must be one of "gpu", "host", got \'tpu\''),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "GPU"}, "got 'GPU'"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu:0"}, "got 'gpu:0'"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": 0}, "got 0"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": ["gpu"]}, "got ['gpu']"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "evict", "value": True}, "advice must be one of"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "set_read_mostly", "value": True}, "got 'set_read_mostly'"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": None, "value": True}, "got None"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "read_mostly", "value": 1}, "read_mostly value must be true"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "read_mostly", "value": "true"}, "got 'true'"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "read_mostly", "value": None}, "got None"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "preferred_location", "value": "tpu"}, '"gpu:N"'),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "preferred_location", "value": 0}, "got 0"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "preferred_location", "value": "gpu:x"}, "got 'gpu:x'"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "preferred_location", "value": "host\n"}, "got 'host\\n'"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "preferred_location", "value": True}, "got True"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "accessed_by", "value": "gpu"}, "must be a list"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "accessed_by", "value": None}, "must be a list"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "accessed_by", "value": ["gpu", 1]}, "got 1"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "accessed_by", "value": ["gpu", "gpu"]}, "distinct"),
    ({"type": "set_advice", "seq": 1, "id": 7, "advice": "accessed_by", "value": ["host"] * 65}, "at most 64"),
    ({"type": "pause", "seq": 1, "paused": 0}, "paused must be true or false, got 0"),
    ({"type": "pause", "seq": 1, "paused": "yes"}, "got 'yes'"),
]


@pytest.mark.parametrize(("data", "mentions"), MALFORMED)
def test_malformed_commands_raise_protocol_error_naming_the_problem(data, mentions):
    with pytest.raises(ProtocolError) as info:
        parse_command(data)
    assert mentions in str(info.value)
    assert isinstance(info.value, ValueError)
    assert info.value.command is data


class _Recorder:
    """Just enough of a comm to hold a session and keep what it sends."""

    def __init__(self):
        self.sent = []

    def send(self, data=None, metadata=None, buffers=None):
        self.sent.append(data)

    def on_msg(self, callback):
        pass

    def on_close(self, callback):
        pass

    def close(self, data=None, metadata=None, buffers=None):
        pass


@pytest.fixture
def buffer():
    ul.use_backend("sim", device_memory="1GiB")
    buf = ul.DeviceBuffer(size="4MiB", label="probe")
    buf.prefetch("gpu")
    yield buf
    buf.close()


def _kernel_state(buf):
    return (ul.residency(buf).states.tobytes(), buf.read_mostly, buf.preferred_location, buf.accessed_by)


@pytest.mark.parametrize(("data", "mentions"), MALFORMED)
def test_malformed_commands_leave_the_kernel_unchanged(buffer, data, mentions):
    # Point every id-carrying message at the live buffer, so only the malformed field stops it.
    if isinstance(data, dict) and type(data.get("id")) is int and data["id"] == 7:
        data = {**data, "id": buffer.id}
    session = PanelSession(_Recorder(), start=False)
    before = _kernel_state(buffer)
    published = ul.events.get_bus().published
    try:
        result = session.handle(data)
    finally:
        session.close()
    assert result["ok"] is False
    assert result["error"]["type"] == "ProtocolError"
    assert mentions in result["error"]["message"]
    assert session.comm.sent == [result]  # the answer, and nothing else
    assert _kernel_state(buffer) == before
    assert ul.events.get_bus().published == published  # not one event: nothing was attempted


def test_a_valid_twin_of_a_malformed_message_does_act(buffer):
    # The control for the test above: the same buffer and session, a well-formed command, an effect.
    session = PanelSession(_Recorder(), start=False)
    try:
        result = session.handle({"type": "prefetch", "seq": 9, "id": buffer.id, "location": "host"})
    finally:
        session.close()
    assert result == {"type": "result", "seq": 9, "command": "prefetch", "ok": True, "error": None}
    assert ul.residency(buffer).counts()["host"] == buffer.size // 4096


# --- residency encoding -------------------------------------------------------------------------


def test_small_maps_travel_page_by_page():
    states = np.array([0, 1, 2, 3, 2, 2], dtype=np.uint8)
    cell_pages, cells, counts = pack_states(states)
    assert cell_pages == 1
    assert cells.tobytes() == states.tobytes()
    assert counts == {"nowhere": 1, "host": 1, "gpu": 3, "both": 1}


def test_pages_on_any_gpu_count_as_gpu():
    # Bit d+1 is device d: 4 is gpu:1 only, 5 host and gpu:1, 6 gpu:0 and gpu:1.
    _, cells, counts = pack_states(np.array([4, 5, 6], dtype=np.uint8))
    assert cells.tolist() == [2, 3, 2]
    assert counts == {"nowhere": 0, "host": 0, "gpu": 2, "both": 1}


def test_large_maps_are_downsampled_by_majority_with_exact_counts():
    n = 2 * CELL_LIMIT + 5  # three pages per cell, the last cell short
    states = np.zeros(n, dtype=np.uint8)
    states[: n // 2] = 2
    states[n // 2 :: 7] = 1
    cell_pages, cells, counts = pack_states(states)
    assert cell_pages == 3
    assert len(cells) == -(-n // 3) <= CELL_LIMIT
    assert counts == {"gpu": n // 2, "host": len(states[n // 2 :: 7]), "both": 0, "nowhere": int((states == 0).sum())}
    assert set(cells[: (n // 2) // 3].tolist()) == {2}
    assert set(cells[-100:].tolist()) == {0}  # one host page in seven never wins a cell of three


def test_ties_go_to_the_lower_state():
    states = np.array([2, 1] * CELL_LIMIT, dtype=np.uint8)  # every cell: one gpu page, one host page
    cell_pages, cells, _ = pack_states(states)
    assert cell_pages == 2
    assert set(cells.tolist()) == {1}


def test_empty_map():
    assert pack_states(np.zeros(0, dtype=np.uint8))[0:2][0] == 1
    assert len(pack_states(np.zeros(0, dtype=np.uint8))[1]) == 0


# --- the TypeScript twin ------------------------------------------------------------------------


def _ts_types() -> dict[str, set[str]]:
    source = PROTOCOL_TS.read_text()
    types = {}
    for name, body in re.findall(r"export type (\w+) = \{(.*?)\n\};", source, flags=re.S):
        types[name] = set(re.findall(r"^\s+(\w+)\??:", body, flags=re.M))
    return types


def _py_typeddicts() -> dict[str, set[str]]:
    return {
        name: set(typing.get_type_hints(obj))
        for name in protocol.__all__
        if isinstance(obj := getattr(protocol, name), type) and typing.is_typeddict(obj)
    }


def test_every_message_has_a_same_named_twin_with_the_same_fields():
    ts, py = _ts_types(), _py_typeddicts()
    assert len(py) == 13  # 4 commands, 4 kernel messages, 5 parts
    assert ts == py


def test_constants_and_literals_match_the_twin():
    source = PROTOCOL_TS.read_text()
    assert f"export const COMM_TARGET = '{protocol.COMM_TARGET}';" in source
    assert f"export const PROTOCOL_VERSION = {protocol.PROTOCOL_VERSION};" in source
    for name, value in (("NOWHERE", ul.residency.NOWHERE), ("HOST", ul.residency.HOST), ("GPU", ul.residency.GPU),
                        ("BOTH", ul.residency.BOTH)):
        assert f"export const {name} = {value};" in source
    assert "export type Location = 'gpu' | 'host';" in source
    assert tuple(protocol.LOCATIONS) == ("gpu", "host")
    advice = " | ".join(f"'{a}'" for a in protocol.ADVICE_NAMES)
    assert f"export type AdviceName = {advice};" in source
    commands = " | ".join(name.title().replace("_", "") for name in protocol.COMMANDS)
    assert f"export type Command = {commands};" in source
