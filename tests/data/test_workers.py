"""DataWorkers: every item mapped once, results in item order, the first item's error raised, threads
that end when the pool is closed or dropped."""
from __future__ import annotations

import gc
import threading

import pytest

from netdef.data.workers import SERIAL, DataWorkers


def test_results_come_in_item_order_and_every_thread_works():
    workers = DataWorkers(3, name="test-order")
    seen = set()
    start = threading.Barrier(3, timeout=10)

    def square(i):
        if i < 3:
            start.wait()  # the first three items are only finished once three threads hold one each
        seen.add(threading.current_thread().name)
        return i * i

    assert workers.map(square, range(40)) == [i * i for i in range(40)]
    assert len(seen) == 3
    assert SERIAL.map(square, [3, 4, 5]) == [9, 16, 25]
    workers.close()


def test_the_first_failing_item_in_item_order_is_raised():
    workers = DataWorkers(2, name="test-errors")

    def fail_some(i):
        if i in (5, 17):
            raise ValueError(f"item {i}")
        return i

    for _ in range(5):  # whichever thread fails first, item 5's error is the one raised
        with pytest.raises(ValueError, match="item 5"):
            workers.map(fail_some, range(30))
    assert workers.map(fail_some, [1, 2]) == [1, 2]  # the pool still works after a failure
    workers.close()


def test_close_and_drop_end_the_threads():
    def helpers(prefix):
        return [t for t in threading.enumerate() if t.name.startswith(prefix)]

    workers = DataWorkers(3, name="test-close")
    assert len(helpers("test-close")) == 2 and all(t.daemon for t in helpers("test-close"))
    threads = helpers("test-close")
    workers.close()
    for t in threads:
        t.join(timeout=5)
    assert not helpers("test-close")
    dropped = DataWorkers(2, name="test-drop")
    threads = helpers("test-drop")
    del dropped
    gc.collect()
    for t in threads:
        t.join(timeout=5)
    assert not helpers("test-drop")
    with pytest.raises(ValueError, match="at least 1 thread"):
        DataWorkers(0)
