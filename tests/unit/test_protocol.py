"""The comm protocol: every command validated, every malformed one refused without effect, residency
packed as category codes with exact counts, and the TypeScript twins (extension/src/protocol.ts,
extension/src/palette.ts) kept in step with the TypedDicts and the palette."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError, ProtocolError
from uvm_lab.events import EventKind
from uvm_lab.events.causes import CAUSE_NAMES
from uvm_lab.jupyter import protocol
from uvm_lab.jupyter.comm import PanelSession
from uvm_lab.jupyter.palette import CAUSE_PALETTE, PALETTE
from uvm_lab.jupyter.protocol import CELL_LIMIT, pack_states, parse_command
from uvm_lab.page_states import CATEGORY_NAMES

REPO = Path(__file__).resolve().parents[2]
PROTOCOL_TS = REPO / "extension" / "src" / "protocol.ts"
PALETTE_TS = REPO / "extension" / "src" / "palette.ts"

VALID = [
    ({"type": "hello", "seq": 0}, {"type": "hello", "seq": 0}),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu", "first_page": 0, "pages": None}, None),
    ({"type": "prefetch", "seq": 2, "id": 7, "location": "host", "first_page": 0, "pages": None}, None),
    ({"type": "prefetch", "seq": 2, "id": 7, "location": "host", "first_page": 3, "pages": 5}, None),
    ({"type": "prefetch", "seq": 2, "id": 7, "location": "gpu:0", "first_page": 0, "pages": None}, None),
    ({"type": "prefetch", "seq": 2, "id": 7, "location": "gpu:1", "first_page": 0, "pages": None}, None),
    ({"type": "prefetch", "seq": 2, "id": 7, "location": "gpu:999",
      "first_page": 0, "pages": None}, None),  # whether it exists: the backend's call
    ({"type": "set_advice", "seq": 3, "id": 7, "advice": "read_mostly", "value": True}, None),
    ({"type": "set_advice", "seq": 3, "id": 7, "advice": "read_mostly", "value": False}, None),
    ({"type": "set_advice", "seq": 4, "id": 7, "advice": "preferred_location", "value": "gpu:0"}, None),
    ({"type": "set_advice", "seq": 4, "id": 7, "advice": "preferred_location", "value": "host"}, None),
    ({"type": "set_advice", "seq": 4, "id": 7, "advice": "preferred_location", "value": None}, None),
    ({"type": "set_advice", "seq": 5, "id": 7, "advice": "accessed_by", "value": ["gpu", "host"]}, None),
    ({"type": "set_advice", "seq": 5, "id": 7, "advice": "accessed_by", "value": []}, None),
    ({"type": "pause", "seq": 6, "paused": True}, None),
    ({"type": "pause", "seq": 2**53 - 1, "paused": False}, None),
    ({"type": "rate", "seq": 7, "interval_ms": 50}, None),
    ({"type": "rate", "seq": 7, "interval_ms": 10_000}, None),
    ({"type": "timeline", "seq": 8, "start": 0, "end": 1, "width": 1, "lanes": None}, None),
    ({"type": "timeline", "seq": 8, "start": 10**12, "end": 2**53 - 1, "width": 16384, "lanes": []}, None),
    ({"type": "timeline", "seq": 8, "start": 5, "end": 9, "width": 800, "lanes": [0, 3, 2]},
     {"type": "timeline", "seq": 8, "start": 5, "end": 9, "width": 800, "lanes": [0, 2, 3]}),  # sorted
    ({"type": "pages", "seq": 9, "id": 7, "first_page": 0, "pages": 1}, None),
    ({"type": "watch", "seq": 10, "ids": None}, None),
    ({"type": "watch", "seq": 10, "ids": [9, 3, 3]}, {"type": "watch", "seq": 10, "ids": [3, 9]}),  # sorted, once
    ({"type": "pages", "seq": 9, "id": 7, "first_page": 10**9, "pages": protocol.CELL_LIMIT}, None),
    ({"type": "worker_command", "seq": 11, "worker": "tcp://127.0.0.1:40000", "command": {
        "type": "prefetch", "seq": 0, "id": 7, "location": "gpu:1", "first_page": 0, "pages": None}}, None),
    ({"type": "worker_command", "seq": 11, "worker": "w" * protocol.MAX_WORKER_ADDRESS, "command": {
        "type": "set_advice", "seq": 0, "id": 7, "advice": "accessed_by", "value": ["gpu:0", "host"]}}, None),
    ({"type": "worker_timeline", "seq": 12, "worker": "tcp://h:1", "start": 0, "end": 2**53 - 1, "width": 800}, None),
    ({"type": "worker_buffers", "seq": 13, "worker": "tcp://h:1"}, None),
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
    ({"type": "__import__", "seq": 1},
     "the commands are hello, prefetch, set_advice, pause, rate, timeline, pages, watch, worker_command, "
     "worker_timeline, worker_buffers"),
    ({"type": "Hello", "seq": 1}, "unknown command type 'Hello'"),
    ({"type": "hello"}, "missing field 'seq'"),
    ({"type": "watch", "seq": 1, "ids": [0]}, "a watch id must be an allocation id (1 to 2**53-1), got 0"),
    ({"type": "watch", "seq": 1, "ids": "all"}, "watch ids must be a list of allocation ids or null"),
    ({"type": "watch", "seq": 1, "ids": list(range(1, protocol.MAX_LANES + 2))}, "watch ids takes at most"),
    ({"type": "pages", "seq": 1, "id": 7, "first_page": 0, "pages": protocol.CELL_LIMIT + 1},
     f"pages must be a whole number from 1 to {protocol.CELL_LIMIT}"),
    ({"type": "pages", "seq": 1, "id": 7, "first_page": -1, "pages": 4}, "first_page must be a whole number"),
    ({"type": "pages", "seq": 1, "id": 7, "first_page": 0}, "missing field 'pages'"),
    ({"type": "prefetch", "seq": 1, "id": 1}, "missing fields 'location', 'first_page', 'pages'"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu", "first_page": -1, "pages": None},
     "first_page must be a whole number from 0"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu", "first_page": "0", "pages": None}, "got '0'"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu", "first_page": 0, "pages": 0},
     "pages must be a whole number from 1 to 2**53-1, got 0"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu", "first_page": 0, "pages": 2.0}, "got 2.0"),
    ({"type": "prefetch", "seq": 1}, "missing fields 'id', 'location'"),
    ({"type": "set_advice", "seq": 1, "id": 1, "advice": "read_mostly"}, "missing field 'value'"),
    ({"type": "pause", "seq": 1}, "missing field 'paused'"),
    ({"type": "hello", "seq": 1, "extra": 0}, "unexpected field 'extra'"),
    ({"type": "prefetch", "seq": 1, "id": 1, "location": "gpu", "stream": 0,
      "first_page": 0, "pages": None}, "unexpected field 'stream'"),
    ({"type": "pause", "seq": 1, "paused": True, "a": 1, "b": 2}, "unexpected fields 'a', 'b'"),
    ({"type": "hello", "seq": -1}, "seq must be a whole number"),
    ({"type": "hello", "seq": 1.0}, "got 1.0"),
    ({"type": "hello", "seq": "1"}, "got '1'"),
    ({"type": "hello", "seq": True}, "got True"),
    ({"type": "hello", "seq": 2**53}, "seq must be a whole number"),
    ({"type": "prefetch", "seq": 1, "id": 0, "location": "gpu",
      "first_page": 0, "pages": None}, "id must be a whole number from 1"),
    ({"type": "prefetch", "seq": 1, "id": -3, "location": "gpu", "first_page": 0, "pages": None}, "got -3"),
    ({"type": "prefetch", "seq": 1, "id": "7", "location": "gpu", "first_page": 0, "pages": None}, "got '7'"),
    ({"type": "prefetch", "seq": 1, "id": 7.0, "location": "gpu", "first_page": 0, "pages": None}, "got 7.0"),
    ({"type": "prefetch", "seq": 1, "id": None, "location": "gpu", "first_page": 0, "pages": None}, "got None"),
    ({"type": "prefetch", "seq": 1, "id": False, "location": "gpu", "first_page": 0, "pages": None}, "got False"),
    ({"type": "prefetch", "seq": 1, "id": [7], "location": "gpu", "first_page": 0, "pages": None}, "got [7]"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "tpu", "first_page": 0, "pages": None},
     'prefetch location must be "host", "gpu" or "gpu:N", got \'tpu\''),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "GPU", "first_page": 0, "pages": None}, "got 'GPU'"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu:x",
      "first_page": 0, "pages": None}, "prefetch location must be"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu:x", "first_page": 0, "pages": None}, "got 'gpu:x'"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu:-1", "first_page": 0, "pages": None}, "got 'gpu:-1'"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu:", "first_page": 0, "pages": None}, "got 'gpu:'"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu:1 ", "first_page": 0, "pages": None}, "got 'gpu:1 '"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu:1\n", "first_page": 0, "pages": None}, "got 'gpu:1\\n'"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "gpu:1000", "first_page": 0, "pages": None}, "got 'gpu:1000'"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": "nowhere", "first_page": 0, "pages": None}, "got 'nowhere'"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": None, "first_page": 0, "pages": None}, "got None"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": 0, "first_page": 0, "pages": None}, "got 0"),
    ({"type": "prefetch", "seq": 1, "id": 7, "location": ["gpu"], "first_page": 0, "pages": None}, "got ['gpu']"),
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
    ({"type": "rate", "seq": 1}, "missing field 'interval_ms'"),
    ({"type": "rate", "seq": 1, "interval_ms": 49}, "interval_ms must be a whole number from 50 to 10000, got 49"),
    ({"type": "rate", "seq": 1, "interval_ms": 10_001}, "got 10001"),
    ({"type": "rate", "seq": 1, "interval_ms": 100.0}, "got 100.0"),
    ({"type": "rate", "seq": 1, "interval_ms": "fast"}, "got 'fast'"),
    ({"type": "timeline", "seq": 1, "start": 0, "end": 9, "width": 10}, "missing field 'lanes'"),
    ({"type": "timeline", "seq": 1, "start": 9, "end": 9, "width": 10, "lanes": None},
     "timeline end must be after its start, got start 9 and end 9"),
    ({"type": "timeline", "seq": 1, "start": 9, "end": 3, "width": 10, "lanes": None}, "after its start"),
    ({"type": "timeline", "seq": 1, "start": -1, "end": 3, "width": 10, "lanes": None}, "start must be a whole"),
    ({"type": "timeline", "seq": 1, "start": 0.5, "end": 3, "width": 10, "lanes": None}, "got 0.5"),
    ({"type": "timeline", "seq": 1, "start": 0, "end": 2**53, "width": 10, "lanes": None}, "end must be a whole"),
    ({"type": "timeline", "seq": 1, "start": 0, "end": 3, "width": 0, "lanes": None},
     "width must be a whole number from 1 to 16384, got 0"),
    ({"type": "timeline", "seq": 1, "start": 0, "end": 3, "width": 16385, "lanes": None}, "got 16385"),
    ({"type": "timeline", "seq": 1, "start": 0, "end": 3, "width": 10, "lanes": 3}, "lanes must be a list"),
    ({"type": "timeline", "seq": 1, "start": 0, "end": 3, "width": 10, "lanes": [1, "2"]},
     "a timeline lane must be an allocation id (0 to 2**53-1), got '2'"),
    ({"type": "timeline", "seq": 1, "start": 0, "end": 3, "width": 10, "lanes": [-1]}, "got -1"),
    ({"type": "timeline", "seq": 1, "start": 0, "end": 3, "width": 10, "lanes": [True]}, "got True"),
    ({"type": "timeline", "seq": 1, "start": 0, "end": 3, "width": 10, "lanes": list(range(4097))},
     "at most 4096 ids, got 4097"),
    # Worker commands: the worker named by a string, the command inside checked as its own type is.
    ({"type": "worker_buffers", "seq": 1, "worker": 3}, "worker must be a worker's address, a string of 1 to 256"),
    ({"type": "worker_buffers", "seq": 1, "worker": ""}, "got ''"),
    ({"type": "worker_buffers", "seq": 1, "worker": None}, "got None"),
    ({"type": "worker_buffers", "seq": 1, "worker": "w" * 257}, "worker must be a worker's address"),
    ({"type": "worker_buffers", "seq": 1, "worker": ["tcp://h:1"]}, "got ['tcp://h:1']"),
    ({"type": "worker_buffers", "seq": 1}, "missing field 'worker'"),
    ({"type": "worker_timeline", "seq": 1, "worker": "tcp://h:1", "start": 5, "end": 5, "width": 10},
     "worker_timeline end must be after its start, got start 5 and end 5"),
    ({"type": "worker_timeline", "seq": 1, "worker": "tcp://h:1", "start": 0, "end": 5, "width": 0},
     "width must be a whole number from 1 to 16384"),
    ({"type": "worker_timeline", "seq": 1, "worker": "tcp://h:1", "start": 0, "end": 5, "width": 10, "lanes": None},
     "unexpected field 'lanes'"),
    ({"type": "worker_command", "seq": 1, "worker": "tcp://h:1", "command": {
        "type": "prefetch", "seq": 0, "id": 7, "location": "tpu", "first_page": 0, "pages": None}},
     "worker_command's command: prefetch location must be \"host\", \"gpu\" or \"gpu:N\", got 'tpu'"),
    ({"type": "worker_command", "seq": 1, "worker": "tcp://h:1", "command": {
        "type": "set_advice", "seq": 0, "id": 0, "advice": "read_mostly", "value": True}}, "id must be a whole number"),
    ({"type": "worker_command", "seq": 1, "worker": "tcp://h:1", "command": {"type": "pause", "seq": 0,
                                                                             "paused": True}},
     "a worker_command carries prefetch or set_advice, got 'pause'"),
    ({"type": "worker_command", "seq": 1, "worker": "tcp://h:1", "command": {"type": "exec", "seq": 0}}, "got 'exec'"),
    ({"type": "worker_command", "seq": 1, "worker": "tcp://h:1", "command": {
        "type": "worker_command", "seq": 0, "worker": "tcp://h:1", "command": {}}}, "got 'worker_command'"),
    ({"type": "worker_command", "seq": 1, "worker": "tcp://h:1", "command": "prefetch"},
     "carries prefetch or set_advice, got 'prefetch'"),
    ({"type": "worker_command", "seq": 1, "worker": "tcp://h:1", "command": None}, "got None"),
    ({"type": "worker_command", "seq": 1, "worker": 7, "command": {
        "type": "prefetch", "seq": 0, "id": 7, "location": "host", "first_page": 0, "pages": None}}, "got 7"),
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
        result = session.handle({"type": "prefetch", "seq": 9, "id": buffer.id, "location": "host",
                                 "first_page": 0, "pages": None})
    finally:
        session.close()
    assert result == {"type": "result", "seq": 9, "command": "prefetch", "ok": True, "error": None}
    assert ul.residency(buffer).counts()["host"] == buffer.size // 4096


# --- residency encoding -------------------------------------------------------------------------

# Category codes, spelled out: what the bytes on the wire mean (page_states.CATEGORY_NAMES).
NOWHERE, HOST, BOTH, UNKNOWN, GPUS, GPU0, GPU1, GPU5 = 0, 1, 2, 3, 4, 5, 6, 10

NO_PAGES = dict.fromkeys(CATEGORY_NAMES, 0)


def test_small_maps_travel_page_by_page_as_category_codes():
    # nowhere, host, gpu:0, gpu:1, host+gpu:0, unknown, host+unknown, gpu:0+gpu:1, host+gpu:1, gpu:5
    states = np.array([0, 1, 2, 4, 3, 0x80, 0x81, 6, 5, 0x40], dtype=np.uint8)
    cell_pages, cells, counts = pack_states(states)
    assert cell_pages == 1
    assert cells.dtype == np.uint8
    assert cells.tolist() == [NOWHERE, HOST, GPU0, GPU1, BOTH, UNKNOWN, UNKNOWN, GPUS, BOTH, GPU5]
    assert counts == {**NO_PAGES, "nowhere": 1, "host": 1, "gpu:0": 1, "gpu:1": 1, "both": 2, "unknown": 2,
                      "gpus": 1, "gpu:5": 1}
    assert list(counts) == list(CATEGORY_NAMES)  # every category, in code order, zero included


def test_gpu_0_and_gpu_1_are_different_categories():
    _, cells, counts = pack_states(np.array([2] * 3 + [4] * 5, dtype=np.uint8))
    assert cells.tolist() == [GPU0] * 3 + [GPU1] * 5
    assert (counts["gpu:0"], counts["gpu:1"], counts["gpus"]) == (3, 5, 0)


def test_unknown_is_its_own_category_whatever_the_host_bit():
    _, cells, counts = pack_states(np.array([0x80, 0x81, 0, 0], dtype=np.uint8))
    assert cells.tolist() == [UNKNOWN, UNKNOWN, NOWHERE, NOWHERE]
    assert counts == {**NO_PAGES, "unknown": 2, "nowhere": 2}


def test_large_maps_are_downsampled_by_majority_with_exact_counts():
    # Cells of three pages; each region's cells hold the same three pages, their majority given.
    regions = [  # (page states of one cell, cells, the category most of them are in)
        ([4, 4, 1], 2500, GPU1),          # gpu:1 beats the host
        ([2, 2, 0x80], 2500, GPU0),       # gpu:0 beats unknown
        ([0x80, 0x81, 0], 2500, UNKNOWN),  # unknown beats nowhere, with or without the host bit
        ([1, 3, 5], 1500, BOTH),          # both (host+gpu:0, host+gpu:1) beats the host
        ([6, 6, 2], 1000, GPUS),          # several GPUs beat one
    ]
    states = np.concatenate([np.tile(np.array(cell, np.uint8), n) for cell, n, _ in regions])
    states = np.concatenate([states, np.zeros(2 * CELL_LIMIT + 5 - len(states), np.uint8)])
    n = len(states)
    cell_pages, cells, counts = pack_states(states)
    assert cell_pages == 3
    assert len(cells) == -(-n // 3) <= CELL_LIMIT   # the last cell is short
    expected = np.concatenate([np.full(k, code) for _, k, code in regions] + [np.full(len(cells) - 10000, NOWHERE)])
    assert cells.tolist() == expected.tolist()
    assert counts == {**NO_PAGES, "gpu:1": 5000, "host": 2500 + 1500, "gpu:0": 5000 + 1000, "unknown": 2500 + 5000,
                      "nowhere": 2500 + n - 30000, "both": 3000, "gpus": 2000}
    assert sum(counts.values()) == n


def test_ties_go_to_the_lower_code():
    cell_pages, cells, _ = pack_states(np.array([2, 1] * CELL_LIMIT, dtype=np.uint8))  # gpu:0 and host
    assert cell_pages == 2
    assert set(cells.tolist()) == {HOST}
    _, cells, _ = pack_states(np.array([4, 2] * CELL_LIMIT, dtype=np.uint8))  # gpu:1 and gpu:0
    assert set(cells.tolist()) == {GPU0}


def test_empty_map():
    cell_pages, cells, counts = pack_states(np.zeros(0, dtype=np.uint8))
    assert cell_pages == 1 and len(cells) == 0
    assert counts == NO_PAGES


@pytest.mark.parametrize(
    ("states", "limit", "mentions"),
    [
        (np.zeros((2, 2), np.uint8), CELL_LIMIT, "1-D"),
        (np.array([1, -1]), CELL_LIMIT, "bytes (0..255)"),
        (np.array([1, 256]), CELL_LIMIT, "bytes (0..255)"),
        (np.array([0.5, 1.0]), CELL_LIMIT, "float64"),
        (np.zeros(4, np.uint8), 0, "limit must be a whole number"),
        (np.zeros(4, np.uint8), 2.5, "got 2.5"),
        (np.zeros(4, np.uint8), True, "got True"),
    ],
)
def test_pack_states_refuses_what_is_not_a_page_state_array(states, limit, mentions):
    with pytest.raises(InvalidArgumentError) as info:
        pack_states(states, limit)
    assert mentions in str(info.value)


# --- the TypeScript twins ------------------------------------------------------------------------


def _ts_types() -> dict[str, set[str]]:
    """Each exported object type's fields, with those of a type it extends (``export type A = B & {``)."""
    source = PROTOCOL_TS.read_text()
    fields, exported, bases = {}, set(), {}
    for export, name, base, body in re.findall(r"^(export )?type (\w+) = (?:(\w+) & )?\{(.*?)\n\};", source,
                                               flags=re.S | re.M):
        fields[name] = set(re.findall(r"^\s+'?([\w:]+)'?\??:", body, flags=re.M))
        bases[name] = base
        if export:
            exported.add(name)
    return {name: fields[name] | (fields[bases[name]] if bases[name] else set()) for name in exported}


def _py_typeddicts() -> dict[str, set[str]]:
    return {
        name: set(typing.get_type_hints(obj))
        for name in protocol.__all__
        if isinstance(obj := getattr(protocol, name), type) and typing.is_typeddict(obj)
    }


def test_every_message_has_a_same_named_twin_with_the_same_fields():
    ts, py = _ts_types(), _py_typeddicts()
    assert len(py) == 32  # 11 commands, 10 kernel messages, 11 parts
    assert ts == py


def test_page_counts_name_every_category():
    assert list(typing.get_type_hints(protocol.PageCounts)) == list(CATEGORY_NAMES)
    assert "device_count" in typing.get_type_hints(protocol.DeviceInfo)


def _ts_list(source: str, name: str) -> list[str]:
    body = re.search(rf"export const {name} = \[(.*?)\] as const;", source, flags=re.S).group(1)
    return re.findall(r"'([^']*)'", body)


def test_constants_and_literals_match_the_twin():
    source = PROTOCOL_TS.read_text()
    assert f"export const COMM_TARGET = '{protocol.COMM_TARGET}';" in source
    assert protocol.PROTOCOL_VERSION == 7
    assert f"export const PROTOCOL_VERSION = {protocol.PROTOCOL_VERSION};" in source
    assert _ts_list(source, "CATEGORY_NAMES") == list(CATEGORY_NAMES) == list(protocol.CATEGORY_NAMES)
    assert "export type Location = 'host' | 'gpu' | `gpu:${number}`;" in source
    advice = " | ".join(f"'{a}'" for a in protocol.ADVICE_NAMES)
    assert f"export type AdviceName = {advice};" in source
    commands = " | ".join(name.title().replace("_", "") for name in protocol.COMMANDS)
    assert f"export type Command = {commands};" in source
    assert _ts_list(source, "CAUSE_NAMES") == list(protocol.CAUSE_NAMES)
    columns = re.search(r"export const TIMELINE_COLUMNS = \[(.*?)\] as const;", source, flags=re.S).group(1)
    assert re.findall(r"\['(\w+)', '([<\w]+)'\]", columns) == list(protocol.TIMELINE_COLUMNS)
    assert f"export const RATE_LIMITS_MS = [{', '.join(map(str, protocol.RATE_LIMITS_MS))}] as const;" in source
    assert f"export const MAX_WIDTH = {protocol.MAX_WIDTH};" in source
    assert f"export const MAX_LANES = {protocol.MAX_LANES};" in source
    kinds = re.search(r"export const EVENT_KINDS: [^=]+= \{(.*?)\n\};", source, flags=re.S).group(1)
    assert {int(k): v for k, v in re.findall(r"(\d+): '(\w+)'", kinds)} == {int(k): k.name for k in EventKind}


# --- the palette ----------------------------------------------------------------------------------


def _ts_palette(name: str = "PALETTE") -> dict[str, str]:
    source = PALETTE_TS.read_text()
    body = re.search(rf"export const {name}: [^=]+= \{{(.*?)\n\}};", source, flags=re.S).group(1)
    entries = [line.strip() for line in body.splitlines() if line.strip()]
    pairs = [re.fullmatch(r"'?([\w: ]+)'?: '(#[0-9a-f]{6})',?", line) for line in entries]
    assert all(pairs), f"palette.ts has an entry this test cannot read: {entries}"
    return {m.group(1): m.group(2) for m in pairs}


def test_the_palette_colours_every_category_once_and_its_twin_agrees():
    assert list(PALETTE) == list(CATEGORY_NAMES)
    assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in PALETTE.values())
    assert len(set(PALETTE.values())) == len(PALETTE)     # no two categories look alike
    assert _ts_palette() == dict(PALETTE)
    with pytest.raises(TypeError):
        PALETTE["host"] = "#ff0000"  # type: ignore[index]  # read-only: one palette for every view


def test_the_cause_palette_colours_every_cause_once_and_its_twin_agrees():
    assert list(CAUSE_PALETTE) == list(CAUSE_NAMES)
    assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in CAUSE_PALETTE.values())
    assert len(set(CAUSE_PALETTE.values())) == len(CAUSE_PALETTE)
    assert _ts_palette("CAUSE_PALETTE") == dict(CAUSE_PALETTE)
    with pytest.raises(TypeError):
        CAUSE_PALETTE["prefetch"] = "#ff0000"  # type: ignore[index]


def test_the_palette_is_written_once_per_language():
    """No view spells a category colour itself: they all read PALETTE (palette.py, palette.ts)."""
    colours = set(PALETTE.values()) | set(CAUSE_PALETTE.values())
    sources = [*(REPO / "uvm_lab" / "jupyter").rglob("*.py"), *(REPO / "extension" / "src").glob("*.ts"),
               *(REPO / "extension" / "style").glob("*.css")]
    spelled = {str(path.relative_to(REPO)): sorted(colours & {c.lower() for c in
                                                              re.findall(r"#[0-9a-fA-F]{6}\b", path.read_text())})
               for path in sources if path.name not in ("palette.py", "palette.ts")}
    assert {"panel.ts", "residency.py", "base.css"} <= {path.name for path in sources}   # the views were read
    assert {path: found for path, found in spelled.items() if found} == {}


def _relative_luminance(colour: str) -> float:
    rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    return float(linear @ [0.2126, 0.7152, 0.0722])


def test_unknown_is_drawn_well_apart_from_nowhere():
    nowhere, unknown = _relative_luminance(PALETTE["nowhere"]), _relative_luminance(PALETTE["unknown"])
    assert nowhere > unknown
    assert (nowhere + 0.05) / (unknown + 0.05) >= 3      # WCAG's contrast for graphics, whatever the hue vision
    assert nowhere == max(_relative_luminance(c) for c in PALETTE.values())   # "no data" is the lightest


# Machado, Oliveira and Fernandes (2009), severity 1: linear RGB as a dichromat sees it.
_DICHROMACY = {
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]],
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]],
    "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]],
}


def _lab(linear_rgb: np.ndarray) -> np.ndarray:
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ np.clip(
        linear_rgb, 0, 1) / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


@pytest.mark.parametrize("palette", ["categories", "causes"])
@pytest.mark.parametrize("vision", ["trichromacy", *_DICHROMACY])
def test_every_two_categories_stay_apart_for_colour_blind_eyes(vision, palette):
    matrix = np.array(_DICHROMACY.get(vision, np.eye(3)))
    seen = {}
    for name, colour in (PALETTE if palette == "categories" else CAUSE_PALETTE).items():
        rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255
        seen[name] = _lab(matrix @ np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4))
    closest = min((float(np.linalg.norm(seen[a] - seen[b])), a, b) for a in seen for b in seen if a < b)
    assert closest[0] >= 15, f"{closest[1]} and {closest[2]} look alike under {vision} (CIE76 {closest[0]:.1f})"
