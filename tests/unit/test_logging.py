"""LoggingResourceAdaptor: RMM's CSV, row for row."""

from __future__ import annotations

import csv
import re
import threading

import pytest

import uvm_lab as ul
from uvm_lab.errors import DoubleFreeError, InvalidArgumentError, OutOfMemoryError
from uvm_lab.events.schema import EventKind
from uvm_lab.mr.logging import HEADER, LoggingResourceAdaptor

TIME = re.compile(r"^\d\d:\d\d:\d\d\.\d{6}$")


@pytest.fixture
def managed():
    return ul.mr.ManagedMemoryResource()


def rows(path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_the_csv_is_rmms(managed, tmp_path):
    path = tmp_path / "log.csv"
    mr = LoggingResourceAdaptor(managed, str(path))
    assert mr.get_file_name() == str(path)
    a = mr.allocate(1000)
    b = mr.allocate("4KiB", stream=7)
    mr.deallocate(a, 1000)
    with ul.record() as trace, pytest.raises(OutOfMemoryError):
        mr.allocate("5GiB", stream=26)
    assert [EventKind(k) for k in trace.events["kind"]] == [EventKind.ALLOC_FAILURE]
    mr.flush()
    header, *body = rows(path)
    assert ",".join(header) == HEADER == "Thread,Time,Action,Pointer,Size,Stream"
    tid = str(threading.get_native_id())
    assert [r[0] for r in body] == [tid] * 4
    assert all(TIME.match(r[1]) for r in body)
    assert [r[2:] for r in body] == [
        ["allocate", f"{a:#x}", "1000", "0"],
        ["allocate", f"{b:#x}", "4096", "0x7"],
        ["free", f"{a:#x}", "1000", "0"],
        ["allocate failure", "(nil)", str(5 << 30), "0x1a"],
    ]
    mr.deallocate(b, 4096, stream=7)


def test_a_double_free_writes_no_row(managed, tmp_path):
    path = tmp_path / "log.csv"
    mr = LoggingResourceAdaptor(managed, path)
    ptr = mr.allocate(10)
    mr.deallocate(ptr, 10)
    with pytest.raises(DoubleFreeError):
        mr.deallocate(ptr, 10)
    mr.flush()
    assert [r[2] for r in rows(path)[1:]] == ["allocate", "free"]


def test_the_file_is_truncated_when_made(managed, tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("old contents\n")
    LoggingResourceAdaptor(managed, path).flush()
    assert path.read_text() == HEADER + "\n"


def test_the_file_name_falls_back_to_rmm_log_file(managed, tmp_path, monkeypatch):
    path = tmp_path / "env.csv"
    monkeypatch.setenv("RMM_LOG_FILE", str(path))
    mr = LoggingResourceAdaptor(managed)
    assert mr.get_file_name() == str(path)
    mr.close()
    assert path.read_text() == HEADER + "\n"
    mr.deallocate(mr.allocate(10), 10)                    # still works after close, unlogged
    assert path.read_text() == HEADER + "\n"


def test_no_file_name_anywhere_is_an_error(managed, monkeypatch):
    monkeypatch.delenv("RMM_LOG_FILE", raising=False)
    with pytest.raises(InvalidArgumentError, match="RMM_LOG_FILE"):
        LoggingResourceAdaptor(managed)


@pytest.mark.parametrize("bad", [3, "", b"log.csv"])
def test_bad_file_names_are_named(managed, bad):
    with pytest.raises(InvalidArgumentError, match="log_file_name"):
        LoggingResourceAdaptor(managed, bad)


def test_an_unwritable_file_is_an_error(managed, tmp_path):
    with pytest.raises(InvalidArgumentError, match="cannot open"):
        LoggingResourceAdaptor(managed, tmp_path / "no" / "such" / "dir.csv")


def test_upstream_must_be_a_resource(tmp_path):
    with pytest.raises(InvalidArgumentError, match="upstream_mr"):
        LoggingResourceAdaptor(None, tmp_path / "x.csv")  # type: ignore[arg-type]
    assert not (tmp_path / "x.csv").exists()


def test_chain_and_repr(managed, tmp_path):
    mr = LoggingResourceAdaptor(managed, tmp_path / "a.csv")
    assert ul.mr.resource_chain(mr) == [mr, managed]
    assert repr(mr).startswith("LoggingResourceAdaptor(ManagedMemoryResource(), log_file_name=")
