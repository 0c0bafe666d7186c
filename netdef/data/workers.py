"""Threads that decode and transform the items of a batch side by side.

JPEG/PNG decoding (Pillow) and NumPy's array loops release the GIL while they run, so threads of one
process use several cores for the work of a batch; a thread per core shares the memory of the batch
it writes, where worker processes would need shared memory and a copy of every batch.

``DataWorkers(threads).map(fn, items)`` applies ``fn`` to every item and returns the results in item
order. The calling thread works too, so ``threads`` counts it: ``DataWorkers(1)`` (``SERIAL``) starts
no thread at all and is the serial path that the parallel one must equal. Items are taken one at a
time from a shared counter, so a slow item (a large JPEG) holds up no other thread. An exception in
``fn`` is raised by ``map`` once every item has been tried, the first item's in item order, so that
the error a batch reports does not depend on which thread was faster.

The pool's threads are daemons at the process's priority (threads.py says why not lower). ``close()``
ends them; a pool that is dropped ends them too.
"""
from __future__ import annotations

import itertools
import queue
import threading
import weakref


class _Job:
    """One ``map`` call: the items, where each result goes, and how many threads still work on it."""

    def __init__(self, fn, items, helpers: int):
        self.fn = fn
        self.items = items
        self.results = [None] * len(items)
        self.errors: dict[int, BaseException] = {}
        self.next_index = itertools.count()  # next() on it is atomic under the GIL
        self.unfinished = helpers
        self.finished = threading.Condition()

    def work(self) -> None:
        """Take items until none is left."""
        count = len(self.items)
        while (i := next(self.next_index)) < count:
            try:
                self.results[i] = self.fn(self.items[i])
            except BaseException as exc:  # carried to map(), which raises it in the caller's thread
                self.errors[i] = exc

    def helper_done(self) -> None:
        with self.finished:
            self.unfinished -= 1
            self.finished.notify_all()

    def wait_for_helpers(self) -> None:
        with self.finished:
            self.finished.wait_for(lambda: self.unfinished == 0)


def _helper(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        try:
            job.work()
        finally:
            job.helper_done()


class DataWorkers:
    """``threads`` threads (the caller included) that map a function over the items of a batch."""

    def __init__(self, threads: int, name: str = "netdef-data"):
        if threads < 1:
            raise ValueError(f"DataWorkers needs at least 1 thread, got {threads}")
        self.threads = int(threads)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._helpers = [threading.Thread(target=_helper, args=(self._jobs,), name=f"{name}-{i + 1}", daemon=True)
                         for i in range(self.threads - 1)]
        for thread in self._helpers:
            thread.start()
        # A dropped pool ends its threads (they hold the queue, not the pool).
        self._finalizer = weakref.finalize(self, _stop_helpers, self._jobs, len(self._helpers))

    def map(self, fn, items) -> list:
        """``[fn(item) for item in items]``, computed by every thread of the pool."""
        items = list(items)
        helpers = min(len(self._helpers), max(0, len(items) - 1))
        job = _Job(fn, items, helpers)
        for _ in range(helpers):
            self._jobs.put(job)
        job.work()
        job.wait_for_helpers()
        if job.errors:
            raise job.errors[min(job.errors)]
        return job.results

    def close(self) -> None:
        """End the pool's threads (after the job they may be on)."""
        self._finalizer()


def _stop_helpers(jobs: queue.SimpleQueue, count: int) -> None:
    for _ in range(count):
        jobs.put(None)


#: The serial path: every item in the calling thread, in order.
SERIAL = DataWorkers(1)
