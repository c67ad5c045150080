"""FailureCallbackResourceAdaptor: callback(nbytes) -> bool decides whether a failed allocation is retried."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError, OutOfMemoryError
from uvm_lab.mr.failure_callback import FailureCallbackResourceAdaptor
from uvm_lab.mr.limiting import LimitingResourceAdaptor

KiB = 1 << 10


@pytest.fixture
def limited():
    return LimitingResourceAdaptor(ul.mr.ManagedMemoryResource(), 4 * KiB)


def test_true_retries_after_the_callback_freed_memory(limited):
    hog = limited.allocate(4 * KiB)
    seen: list[int] = []

    def free_the_hog(nbytes: int) -> bool:
        seen.append(nbytes)
        limited.deallocate(hog, 4 * KiB)
        return True

    mr = FailureCallbackResourceAdaptor(limited, free_the_hog)
    ptr = mr.allocate(KiB)
    assert seen == [KiB]
    assert limited.get_allocated_bytes() == KiB
    mr.deallocate(ptr, KiB)
    assert ul.mr.resource_chain(mr)[:2] == [mr, limited]


def test_false_reraises_the_out_of_memory_error(limited):
    calls: list[int] = []
    mr = FailureCallbackResourceAdaptor(limited, lambda n: calls.append(n) or False)
    with pytest.raises(OutOfMemoryError) as err:
        mr.allocate(8 * KiB)
    assert calls == [8 * KiB] and err.value.size == 8 * KiB
    assert limited.get_allocated_bytes() == 0


def test_retries_until_the_callback_gives_up(limited):
    calls: list[int] = []
    mr = FailureCallbackResourceAdaptor(limited, lambda n: calls.append(n) or len(calls) < 3)
    with pytest.raises(OutOfMemoryError):
        mr.allocate(8 * KiB)
    assert calls == [8 * KiB] * 3


def test_a_callback_that_raises_propagates_and_leaves_nothing(limited):
    def broken(nbytes: int) -> bool:
        raise KeyError("cache")

    mr = FailureCallbackResourceAdaptor(limited, broken)
    with pytest.raises(KeyError) as err:
        mr.allocate(8 * KiB)
    assert isinstance(err.value.__context__, OutOfMemoryError)
    assert limited.get_allocated_bytes() == 0


def test_the_callback_is_not_called_on_success(limited):
    mr = FailureCallbackResourceAdaptor(limited, lambda n: pytest.fail("called"))
    mr.deallocate(mr.allocate(KiB), KiB)


@pytest.mark.parametrize("bad", [None, 3, "retry"])
def test_callback_must_be_callable(limited, bad):
    with pytest.raises(InvalidArgumentError, match="callback"):
        FailureCallbackResourceAdaptor(limited, bad)


def test_upstream_must_be_a_resource():
    with pytest.raises(InvalidArgumentError, match="upstream_mr"):
        FailureCallbackResourceAdaptor(None, lambda n: False)  # type: ignore[arg-type]
