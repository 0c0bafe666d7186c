"""The multicolour trees over NCCL's point-to-point calls (netdef/comm/nccl_trees.py) and the float16
messages made by device kernels (fp16.Float16DeviceWire), on the CPU: ranks are threads of this
process, NumPy stands in for CuPy, and a stand-in NCCL carries each send to the matching receive
(pairing them in the order issued, as NCCL does, and checking that their sizes and types agree).
Each rank's result must be, byte for byte, what the host's trees compute (the same additions in the
same order, the same messages): ``tree_sums`` below follows multicolor.TreeOperation's rules. The
real NCCL runs on a GPU in tests/test_gpu_ranks.py."""
from __future__ import annotations

import ctypes
import dataclasses
import queue
import re
import threading

import numpy as np
import pytest

from netdef.comm import exchange as ex
from netdef.comm.colour_trees import TreeLinks, colour_count, colour_roots, heap_depth
from netdef.comm.fp16 import Float16DeviceWire, Float16Wire, Fp16Exchange
from netdef.comm.multicolor import MulticolorExchange, WireFormat
from netdef.comm.nccl import over_nccl
from netdef.comm.nccl_sum import DeviceEventOperation
from netdef.comm.nccl_trees import NcclTreeReduction
from tests.comm.fixtures import mpi_available, run_python
from tests.comm.test_nccl_sum import StandInCupy, StandInNccl

DTYPES = {StandInNccl.NCCL_FLOAT16: np.float16, StandInNccl.NCCL_FLOAT32: np.float32,
          StandInNccl.NCCL_FLOAT64: np.float64}


class Links:
    """What the stand-in NCCL's ranks send each other: one queue per (sender, receiver), so that the
    sends and receives between two ranks pair up in the order they were issued."""

    def __init__(self):
        self._queues: dict[tuple[int, int], queue.Queue] = {}
        self._lock = threading.Lock()
        self.messages = 0

    def between(self, sender: int, receiver: int) -> queue.Queue:
        with self._lock:
            return self._queues.setdefault((sender, receiver), queue.Queue())


class ThreadedNccl(StandInNccl):
    """NCCL's module as CuPy gives it (its constants, id and version as StandInNccl's), for ranks that
    are threads: a group's sends leave at its end, then its receives wait for their messages; outside
    a group a call runs at once. The stream is the calling thread: every call has finished when it
    returns."""

    def __init__(self, links: Links):  # noqa: the allreduce-only stand-in's communicator is not wanted
        stand_in = self
        self.links = links
        self._group = threading.local()

        class NcclCommunicator:
            def __init__(self, size, unique_id, rank):
                assert len(unique_id) == 128
                self.size, self.rank = size, rank
                self.destroyed = False

            def send(self, pointer, count, data_type, peer, stream):
                stand_in._call(("send", self.rank, peer, pointer, count, data_type))

            def recv(self, pointer, count, data_type, peer, stream):
                stand_in._call(("recv", peer, self.rank, pointer, count, data_type))

            def destroy(self):
                self.destroyed = True

            def abort(self):
                self.aborted = True

        self.NcclCommunicator = NcclCommunicator

    def groupStart(self):
        assert getattr(self._group, "calls", None) is None, "nested group"
        self._group.calls = []

    def groupEnd(self):
        calls, self._group.calls = self._group.calls, None
        for call in sorted(calls, key=lambda c: c[0] != "send"):  # sends leave first: no wait on a peer's group
            self._run(call)

    def _call(self, call):
        if getattr(self._group, "calls", None) is not None:
            self._group.calls.append(call)
        else:
            self._run(call)

    def _run(self, call):
        kind, sender, receiver, pointer, count, data_type = call
        nbytes = count * np.dtype(DTYPES[data_type]).itemsize
        if kind == "send":
            self.links.between(sender, receiver).put((count, data_type, ctypes.string_at(pointer, nbytes)))
            self.links.messages += 1
            return
        sent_count, sent_type, data = self.links.between(sender, receiver).get(timeout=20)
        assert (sent_count, sent_type) == (count, data_type), "a send paired with a receive of another size or type"
        ctypes.memmove(pointer, data, nbytes)

@dataclasses.dataclass
class RankComm:
    """What the reduction asks of its communicator: the rank, the size, and the unique id's broadcast."""

    rank: int
    size: int

    def broadcast(self, buffer, root):
        pass


def run_ranks(size: int, work, links: Links | None = None):
    """``work(rank, reduction_maker)`` on ``size`` threads at once; returns their results by rank."""
    links = links or Links()
    nccl = ThreadedNccl(links)
    results, errors = [None] * size, []

    def reduction(rank, colours, wire, log=None):
        stand_in = StandInCupy(log if log is not None else [], lag=2)
        return NcclTreeReduction(RankComm(rank, size), colours, wire, cupy=stand_in, nccl=nccl)

    def body(rank):
        try:
            results[rank] = work(rank, lambda colours, wire, log=None: reduction(rank, colours, wire, log))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append((rank, exc))

    threads = [threading.Thread(target=body, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return results


def tree_sums(arrays: list[np.ndarray], colours: int, wire: WireFormat) -> np.ndarray:
    """The sum every rank holds after the host's trees (multicolor.TreeOperation): in each colour's
    tree a rank adds its children's messages to its part in child order and sends its part up
    encoded; the root encodes the sum and everyone, the root included, takes the decoded message."""
    size = len(arrays)
    flat = arrays[0].size
    result = np.empty_like(arrays[0])
    bounds = [flat * c // colours for c in range(colours + 1)]
    for c, root in enumerate(colour_roots(size, colours)):
        low, high = bounds[c], bounds[c + 1]

        def partial(rank):
            part = arrays[rank][low:high].copy()
            for child in TreeLinks(size, root, rank).children:
                wire.accumulate(part, wire.encode(partial(child)))
            return part

        total = partial(root)
        wire.decode(wire.encode(total), total)
        result[low:high] = total
    return result


def values(rank: int, count: int, seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng([seed, rank]).standard_normal(count) * scale).astype(np.float32)


SIZES = [0, 1, 3, 7, 1000, 10007]


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("fp16", [False, True], ids=["float32", "float16"])
def test_every_rank_holds_the_host_trees_bytes(size, fp16):
    host_wire = Float16Wire() if fp16 else WireFormat()
    for requested in sorted({1, 2, 0, size}):
        colours = colour_count(size, requested)

        def work(rank, make):
            reduction = make(requested, Float16DeviceWire(np) if fp16 else WireFormat(np))
            arrays = [values(rank, n, k, scale=1e3 if k % 2 else 1e-3) for k, n in enumerate(SIZES)]
            operations = [reduction.start(array) for array in arrays]  # all queued before any is waited for
            for operation in reversed(operations):
                assert isinstance(operation, DeviceEventOperation)
                operation.wait()
            return arrays

        results = run_ranks(size, work)
        for k, n in enumerate(SIZES):
            inputs = [values(r, n, k, scale=1e3 if k % 2 else 1e-3) for r in range(size)]
            expected = tree_sums(inputs, colours, host_wire)
            for rank in range(size):
                assert results[rank][k].tobytes() == expected.tobytes(), (size, colours, n, rank)
            exact = np.add.reduce([x.astype(np.float64) for x in inputs]) if n else np.zeros(0)
            error = np.abs(results[0][k] - exact).max(initial=0) / max(np.abs(exact).max(initial=0), 1e-30)
            assert error < (2e-3 if fp16 else 1e-6)


def test_the_whole_reduction_is_queued_on_the_communication_stream_in_levels():
    """One start queues every level's group (2 depth of them where a rank takes part in each), on
    NCCL's stream; the operation completes when the event recorded after them does."""
    size = 5
    assert heap_depth(size - 1) == 2
    log_by_rank = {}

    def work(rank, make):
        log = log_by_rank.setdefault(rank, [])
        reduction = make(0, WireFormat(np), log)
        assert reduction.levels == 2 and reduction.colours == 4
        array = reduction.empty(40)
        array[:] = rank + 1
        operation = reduction.start(array)
        assert not operation.test()  # the stand-in's events complete on their second query
        operation.wait()
        assert reduction.stream.name == "nccl" and log[-1] == ("event done", "nccl")
        reduction.release()
        assert reduction.communicator.destroyed
        return array

    links = Links()
    for array in run_ranks(size, work, links):
        np.testing.assert_array_equal(array, sum(range(1, size + 1)))
    # Each colour's tree has size - 1 links, each crossed once up and once down.
    assert links.messages == 4 * 2 * (size - 1)


def test_the_log_names_the_trees_nccl_and_the_messages():
    def work(rank, make):
        return make(2, Float16DeviceWire(np)).describe()

    text = run_ranks(4, work)[0]
    assert text == ("2 colours, binary trees rooted at ranks 0, 2, over NCCL 2.30.7's point-to-point calls on a "
                    "communication stream of its own, float16 messages scaled by a power of two each, summed in "
                    "float32")


@pytest.mark.parametrize("scale", [1e-30, 1e-8, 1.0, 1e5, 3e36])
def test_the_device_kernels_make_the_host_kernels_float16_messages_bit_for_bit(scale):
    rng = np.random.default_rng(7)
    cases = [(rng.standard_normal(999) * scale).astype(np.float32), np.zeros(4, np.float32),
             np.array([1e-45, -3e-39, 6e-8], np.float32) * np.float32(min(scale, 1.0))]
    odd = (rng.standard_normal(64) * scale).astype(np.float32)
    odd[[3, 7, 9]] = [np.nan, np.inf, -np.inf]
    cases.append(odd)
    host, device = Float16Wire(), Float16DeviceWire(np)
    for case in cases:
        sent, made = host.encode(case), device.encode(case)
        assert made.dtype == np.float16 and made.view(np.uint16).tobytes() == sent.view(np.uint16).tobytes()
        by_host, by_device = np.full_like(case, 1.5), np.full_like(case, 1.5)
        host.decode(sent, by_host)
        device.decode(made, by_device)
        assert by_device.tobytes() == by_host.tobytes()
        host.accumulate(by_host, sent)
        device.accumulate(by_device, made)
        assert by_device.tobytes() == by_host.tobytes()


def test_the_tree_rules_keep_their_rule_over_nccl():
    for rule in (MulticolorExchange, Fp16Exchange):
        options = ex.ExchangeOptions(exchange="multicolor" if rule is MulticolorExchange else "fp16", schedule="fifo")
        chosen, resolved = over_nccl(rule, options)
        assert chosen is rule and resolved.exchange_via == "nccl" and resolved.schedule == "fifo"
    assert isinstance(Fp16Exchange.wire_for(np), Float16Wire)
    assert not isinstance(Fp16Exchange.wire_for(np), Float16DeviceWire)
    device_like = object()
    assert isinstance(Fp16Exchange.wire_for(device_like), Float16DeviceWire)
    assert Fp16Exchange.wire_for(device_like).xp is device_like
    assert type(MulticolorExchange.wire_for(device_like)) is WireFormat


# ============================================================================================ the rules
AVAILABLE, WHY_NOT = mpi_available()

# Each rank a process: the multicolor and fp16 rules, their trees on the stand-in device and over a
# stand-in NCCL whose calls travel over MPI (on a communicator of their own, pairing in the order
# issued as NCCL's do), through the real transports (the priority schedule polled or on its thread,
# the drivers without overlap) and the device buckets; against the same rules on the host's trees.
RULES_SCRIPT = r'''
import ctypes
import hashlib
import threading

import numpy as np
from mpi4py import MPI

from netdef.comm import create_communicator, run_guarded
from netdef.comm import exchange as ex
from netdef.comm.fp16 import Float16DeviceWire, Fp16Exchange
from netdef.comm.gradient_staging import DeviceBuckets
from netdef.comm.multicolor import MulticolorExchange, WireFormat
from netdef.comm.nccl_trees import NcclTreeReduction
from tests.comm.test_exchange import hooked, make_net, run_iteration
from tests.comm.test_nccl_sum import StandInCupy, StandInNccl

comm = create_communicator()
links = comm.comm.Dup()
ITEM_BYTES = {StandInNccl.NCCL_FLOAT16: 2, StandInNccl.NCCL_FLOAT32: 4, StandInNccl.NCCL_FLOAT64: 8}


class NcclOverMpi(StandInNccl):
    """A group's sends leave (Isend) at its end, then its receives wait (Recv), then the sends complete."""

    def __init__(self):
        stand_in = self
        self.group = threading.local()

        class NcclCommunicator:
            def __init__(self, size, unique_id, rank):
                pass

            def send(self, pointer, count, data_type, peer, stream):
                stand_in.group.calls.append(("send", pointer, count * ITEM_BYTES[data_type], peer))

            def recv(self, pointer, count, data_type, peer, stream):
                stand_in.group.calls.append(("recv", pointer, count * ITEM_BYTES[data_type], peer))

            def destroy(self):
                pass

            def abort(self):
                pass

        self.NcclCommunicator = NcclCommunicator

    def groupStart(self):
        self.group.calls = []

    def groupEnd(self):
        calls, self.group.calls = self.group.calls, None
        sends = [links.Isend(np.frombuffer(ctypes.string_at(p, n), np.uint8), dest=peer, tag=7)
                 for kind, p, n, peer in calls if kind == "send"]
        for kind, pointer, nbytes, peer in calls:
            if kind == "recv":
                data = np.empty(nbytes, np.uint8)
                links.Recv(data, source=peer, tag=7)
                ctypes.memmove(pointer, data.ctypes.data, nbytes)
        MPI.Request.Waitall(sends)


def over_nccl(rule_class, wire):
    class TreesOverNccl(rule_class):
        def make_reduction(self):
            return NcclTreeReduction(self.comm, self.options.multicolor_colors, wire, cupy=StandInCupy([], lag=2),
                                     nccl=NcclOverMpi())
    return TreesOverNccl


def train(rule_class, exchange, schedule, overlap, mode):
    net = make_net(seed=3 + comm.rank)
    options = ex.ExchangeOptions(exchange=exchange, schedule=schedule, overlap=overlap, bucket_bytes=64,
                                 progress=mode, chunk_bytes=32, credit_bytes=64, multicolor_colors=2)
    rule = hooked(net, rule_class(comm, net, options))
    rule.broadcast_initial()
    net.register_backward_hook(lambda li, ids: rule.gradients_ready(ids))
    for iteration in range(3):
        run_iteration(net, rule, iteration, [])
    on_device = isinstance(rule.gradients, DeviceBuckets)
    described = rule.describe()
    rule.close()
    rule.release()
    return [b.diff.copy() for b in net.learnable_params], on_device, described


def main():
    for rule_class, exchange, wire in ((MulticolorExchange, "multicolor", WireFormat(np)),
                                       (Fp16Exchange, "fp16", Float16DeviceWire(np))):
        for schedule, overlap, mode in (("priority", True, "POLL"), ("priority", True, "THREAD"),
                                        ("fifo", False, "POLL")):
            host, on_host, _ = train(rule_class, exchange, schedule, overlap, mode)
            device, on_device, described = train(over_nccl(rule_class, wire), exchange, schedule, overlap, mode)
            assert not on_host and on_device and "point-to-point calls" in described, described
            for a, b in zip(host, device):
                assert a.tobytes() == b.tobytes(), (exchange, schedule, mode, np.abs(a - b).max())
            digest = hashlib.sha1(b"".join(d.tobytes() for d in device)).digest()
            assert len(set(comm.allgather_bytes(digest))) == 1, "ranks hold different gradients"
            print(f"rank {comm.rank}: {exchange} {schedule} {mode}: as on the host", flush=True)


run_guarded(comm, main)
'''


@pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)
def test_the_tree_rules_over_nccl_average_as_on_the_host_through_every_transport(tmp_path):
    script = tmp_path / "rules.py"
    script.write_text(RULES_SCRIPT)
    run = run_python([str(script)], 3, tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    for exchange in ("multicolor", "fp16"):
        for case in ("priority POLL", "priority THREAD", "fifo POLL"):
            assert len(re.findall(rf"rank \d: {exchange} {case}: as on the host", run.stdout)) == 3, run.stdout[-2000:]
