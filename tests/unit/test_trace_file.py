"""Trace files: versioned, checked before they are believed, and every bad one a TraceFileError that says why."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError, TraceFileError
from uvm_lab.events import EVENT_DTYPE, EventKind, make_events
from uvm_lab.events.schema import EVENT_DTYPE_WITHOUT_SOURCE
from uvm_lab.events.trace_file import FORMAT_VERSION, MAGIC

HEADER = struct.Struct("<8sIIQ")


def sample(n=5):
    return make_events(n, kind=EventKind.HTOD, start=np.arange(n), end=np.arange(n) + 1, bytes=4096, value=4096,
                       address=np.arange(n) * 4096, alloc_id=1, source=np.arange(n))


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "t.uvmtrace"
    ul.Trace(sample()).save(path)
    return path


def test_a_saved_trace_is_versioned_and_read_back_exactly(saved):
    data = saved.read_bytes()
    magic, version, itemsize, records = HEADER.unpack_from(data)
    assert (magic, version, itemsize, records) == (MAGIC, FORMAT_VERSION, EVENT_DTYPE.itemsize, 5)
    assert len(data) == HEADER.size + 5 * EVENT_DTYPE.itemsize
    assert ul.Trace.load(saved).events.tobytes() == sample().tobytes()


def test_an_npy_trace_of_an_earlier_release_still_loads(tmp_path):
    np.save(tmp_path / "new.npy", sample())
    assert ul.Trace.load(tmp_path / "new.npy").events.tobytes() == sample().tobytes()
    old = np.zeros(2, dtype=EVENT_DTYPE_WITHOUT_SOURCE)
    old["kind"] = EventKind.ALLOC
    np.save(tmp_path / "old.npy", old)
    assert ul.Trace.load(tmp_path / "old.npy").events["source"].tolist() == [0, 0]


def _header(version=FORMAT_VERSION, itemsize=EVENT_DTYPE.itemsize, records=5):
    return HEADER.pack(MAGIC, version, itemsize, records)


@pytest.mark.parametrize(("make", "problem"), [
    (lambda good: good[:-1], "cut short"),
    (lambda good: good[:10], "header is cut short"),
    (lambda good: _header(records=10**15) + good[HEADER.size:], "1,000,000,000,000,000 records"),
    (lambda good: _header(version=7) + good[HEADER.size:], "format version 7"),
    (lambda good: _header(itemsize=12) + good[HEADER.size:], "12 bytes each"),
    (lambda good: good + b"\0", "bytes follow"),
    (lambda good: b"PK\3\4" + good, "does not start with"),
    (lambda good: b"", "does not start with"),
    (lambda good: good[:HEADER.size] + b"\xff" + good[HEADER.size + 1:], "kind 255"),
])
def test_a_bad_file_is_one_typed_error_that_names_the_problem(saved, make, problem):
    saved.write_bytes(make(saved.read_bytes()))
    with pytest.raises(TraceFileError, match=problem) as info:
        ul.Trace.load(saved)
    assert info.value.path == saved and str(saved) in str(info.value)


@pytest.mark.parametrize(("array", "problem"), [
    (np.zeros((2, 3), dtype=EVENT_DTYPE), "shape"),
    (np.zeros((), dtype=EVENT_DTYPE), "shape"),
    (np.arange(10), "not uvm_lab events"),
    (np.zeros(3, dtype=EVENT_DTYPE), "kind 0"),
])
def test_an_npy_file_that_is_not_a_trace_is_refused(tmp_path, array, problem):
    np.save(tmp_path / "a.npy", array)
    with pytest.raises(TraceFileError, match=problem):
        ul.Trace.load(tmp_path / "a.npy")


def test_an_npy_header_that_cannot_be_parsed_is_refused(tmp_path):
    good = tmp_path / "a.npy"
    np.save(good, sample())
    data = bytearray(good.read_bytes())
    data[12:30] = b"{'descr': (((((((("   # a header numpy's literal parser chokes on
    good.write_bytes(bytes(data))
    with pytest.raises(TraceFileError, match="header cannot be read"):
        ul.Trace.load(good)
    claims_more = tmp_path / "more.npy"   # a header claiming more records than follow, refused before reading
    np.save(claims_more, sample())
    claimed = claims_more.read_bytes().replace(b"(5,)", b"(9,)", 1)   # the same length: the header stays valid
    claims_more.write_bytes(claimed)
    with pytest.raises(TraceFileError, match="9 records"):
        ul.Trace.load(claims_more)


def test_save_refuses_records_load_would_refuse(tmp_path):
    with pytest.raises(InvalidArgumentError, match="kind 0"):
        ul.Trace(np.zeros(2, dtype=EVENT_DTYPE)).save(tmp_path / "t.uvmtrace")
    assert not (tmp_path / "t.uvmtrace").exists()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2000))
def test_random_bytes_never_load_as_anything_but_a_trace_or_a_trace_file_error(tmp_path, data):
    path = tmp_path / "fuzz"
    path.write_bytes(data)
    try:
        trace = ul.Trace.load(path)
    except TraceFileError:
        return
    trace.summary()   # what loaded is a trace that works


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8),
       st.booleans())
def test_mutated_trace_files_load_whole_or_fail_with_a_trace_file_error(tmp_path, flips, as_npy):
    path = tmp_path / ("m.npy" if as_npy else "m.uvmtrace")
    np.save(path, sample()) if as_npy else ul.Trace(sample()).save(path)
    data = bytearray(path.read_bytes())
    for at, value in flips:
        data[at % len(data)] = value
    path.write_bytes(bytes(data))
    try:
        trace = ul.Trace.load(path)
    except TraceFileError:
        return
    assert len(trace) == 5 and trace.summary()["events"] == 5
