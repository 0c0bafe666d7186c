"""The priority schedule (scheduler.py) against simulated ranks in one process: every rank starts the
same collectives in the same order whatever the pace of its backward, late urgent buckets overtake
the rest of a large one, and the bytes in flight stay within the credit."""
from __future__ import annotations

import random

import numpy as np
import pytest

from netdef.comm.communicator import Communicator
from netdef.comm.exchange import Bucket
from netdef.comm.scheduler import LinkMeasurement, PrioritySchedule, choose_sizes, credit_size


class World:
    """Collectives matched by their sequence number on each rank: the k-th call of every rank is one
    collective, which completes once every rank has started it. A rank whose k-th call differs
    from another's (size or op) is what would corrupt or hang a real run."""

    def __init__(self, size):
        self.size = size
        self.calls = []

    def join(self, rank, k, array, op):
        if k == len(self.calls):
            self.calls.append({"arrays": {}, "op": op, "n": array.size, "done": False})
        call = self.calls[k]
        assert (call["op"], call["n"]) == (op, array.size), f"rank {rank}: collective {k} differs between ranks"
        call["arrays"][rank] = array
        if len(call["arrays"]) == self.size:
            arrays = list(call["arrays"].values())
            result = np.minimum.reduce(arrays) if op == "min" else np.add.reduce([a.copy() for a in arrays])
            for a in arrays:
                a[...] = result
            call["done"] = True


class RankComm(Communicator):
    def __init__(self, world, rank):
        self.world, self.rank, self.size = world, rank, world.size
        self.count = 0
        self.starts = []   # (size, op) in the order this rank started them

    def iallreduce(self, array, op="sum"):
        k = self.count
        self.count += 1
        self.starts.append((array.size, op))
        self.world.join(self.rank, k, array, op)
        return k

    def test_some(self, requests):
        done = [i for i, k in enumerate(requests) if k is not None and self.world.calls[k]["done"]]
        for i in done:
            requests[i] = None
        return done

    def wait_all(self, requests):
        for i, k in enumerate(requests):
            if k is not None:
                assert self.world.calls[k]["done"], "would block forever: another rank never starts it"
                requests[i] = None


def make_buckets(rank):
    # Fill order: a big fc bucket (used late in forward), a middle one, then the first layer's.
    sizes = [64, 8, 8]
    buckets = []
    for index, n in enumerate(sizes):
        bucket = Bucket(index, np.float32, [index], [(n,)])
        bucket.pack(0, np.full(n, rank + 1 + index * 10, dtype=np.float32))
        buckets.append(bucket)
    return buckets


PRIORITIES = [6, 3, 0]  # the forward position of each bucket's first layer


@pytest.mark.parametrize("seed", range(40))
def test_ranks_start_the_same_collectives_in_the_same_order_at_any_pace(seed):
    rng = random.Random(seed)
    size = rng.choice([2, 3])
    world = World(size)
    comms = [RankComm(world, r) for r in range(size)]
    buckets = [make_buckets(r) for r in range(size)]
    # chunks of 8 floats, two in flight
    schedules = [PrioritySchedule(comms[r], buckets[r], PRIORITIES, 32, 64) for r in range(size)]
    filled = [0] * size
    for _ in range(10_000):
        if all(s.done for s in schedules):
            break
        r = rng.randrange(size)
        if filled[r] < 3 and rng.random() < 0.3:
            schedules[r].bucket_ready(buckets[r][filled[r]])
            filled[r] += 1
        schedules[r].pump()
        inflight = sum(c.nbytes for c in schedules[r].started if c.request is not None)
        assert inflight <= 64
    assert all(s.done for s in schedules)
    assert all(c.starts == comms[0].starts for c in comms)
    for r in range(size):
        for index, bucket in enumerate(buckets[r]):
            expected = sum(q + 1 + index * 10 for q in range(size))
            assert (bucket.buffer == expected).all()
            assert schedules[r].bucket_complete(bucket)
    order = [(c.bucket.index, c.number) for c in schedules[0].started]
    assert order == [(c.bucket.index, c.number) for c in schedules[-1].started]


def test_a_late_urgent_bucket_overtakes_the_rest_of_a_large_one():
    world = World(2)
    comms = [RankComm(world, r) for r in range(2)]
    buckets = [make_buckets(r) for r in range(2)]
    schedules = [PrioritySchedule(comms[r], buckets[r], PRIORITIES, 32, 64) for r in range(2)]
    for r in range(2):
        schedules[r].bucket_ready(buckets[r][0])
    for s in schedules:  # backward goes on while the big bucket's first chunks go out
        s.pump()
    for r in range(2):
        schedules[r].bucket_ready(buckets[r][1])
        schedules[r].bucket_ready(buckets[r][2])
    while not all(s.done for s in schedules):
        for s in schedules:
            s.pump()
    order = [(c.bucket.index, c.number) for c in schedules[0].started]
    first_layer = order.index((2, 0))
    big_chunks = [i for i, (b, _) in enumerate(order) if b == 0]
    assert len(big_chunks) == 8
    # The marks of the two chunks in flight when the urgent buckets became ready still say "bucket 0
    # only": two more chunks of it go (the credit's worth of reaction), then bucket 2 overtakes.
    assert order[:5] == [(0, 0), (0, 1), (0, 2), (0, 3), (2, 0)], order
    assert first_layer < big_chunks[-1]
    assert order.index((2, 0)) < order.index((1, 0))  # and the middle one, by priority


def test_a_waiting_rank_blocks_only_on_what_it_started():
    world = World(2)
    comms = [RankComm(world, r) for r in range(2)]
    buckets = [make_buckets(r) for r in range(2)]
    schedules = [PrioritySchedule(comms[r], buckets[r], PRIORITIES, 1024, 1024) for r in range(2)]
    for r in range(2):
        for b in buckets[r]:
            schedules[r].bucket_ready(b)
    schedules[1].pump()
    calls = 0
    while not schedules[0].bucket_complete(buckets[0][0]):  # what a waiting training thread does
        schedules[0].pump(block=True)  # rank 1 started what rank 0 blocks on: never a hang
        calls += 1
    assert calls <= 2


class TimedLink(Communicator):
    """A simulated link: a blocking allreduce costs 50 us + bytes / 100 MB/s; a non-blocking one
    completes ``steps`` tests after it starts (the protocol steps that each wait for a test)."""

    def __init__(self, steps: int):
        self.now = 0.0
        self.steps = steps

    def allreduce(self, array, op="sum"):
        self.now += 50e-6 + array.nbytes / 100e6

    def iallreduce(self, array, op="sum"):
        return [self.steps]

    def test_some(self, requests):
        requests[0][0] -= 1
        if requests[0][0] > 0:
            return []
        requests[0] = None
        return [0]

    def sleep(self, seconds):
        self.now += seconds


def test_chunk_from_blocking_latency_credit_from_polled_completion():
    comm = TimedLink(steps=6)
    chunk, credit, link = choose_sizes(comm, clock=lambda: comm.now, sleep=comm.sleep)
    assert link.latency_s == pytest.approx(50e-6, rel=1e-6) and link.bytes_per_s == pytest.approx(100e6, rel=1e-6)
    assert chunk == 256 << 10  # 19 * 50 us * 100 MB/s = 95 KB, below the 256 KiB floor
    assert link.polled_s == pytest.approx(5 * 0.002)  # five sleeps of the poll interval before the sixth test
    # What the link moves while one chunk completes, 10 ms * 100 MB/s = 1 MB, plus a chunk, in whole chunks.
    assert credit == 5 * chunk


def test_credit_at_least_two_chunks_and_at_most_16_mib():
    chunk = 1 << 20
    assert credit_size(chunk, LinkMeasurement(1e-6, 100e6, 0.0)) == 2 * chunk
    assert credit_size(chunk, LinkMeasurement(1e-6, 10e9, 0.5)) == 16 << 20
    assert credit_size(256 << 10, LinkMeasurement(1e-6, 100e6, 0.0105)) == 6 * (256 << 10)  # 1.31 MB rounded up
