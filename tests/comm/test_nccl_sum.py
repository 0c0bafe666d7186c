"""NCCL as the allreduce family's reduction (netdef/comm/nccl_sum.py, gradient_staging.DeviceBuckets),
and CUDA-aware MPI on the same device buckets (netdef/comm/device_mpi.py):
the priority schedule's chunks and the drivers' buckets summed on a communication stream, each only
once its gradients are final on the device, in one process against stand-ins for CuPy's streams and
events and for NCCL's communicator (the other ranks scripted as in test_exchange.py). The stand-ins
check the bookkeeping, not NCCL: tests/test_gpu_ranks.py runs the real library on a GPU."""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses

import numpy as np
import pytest

from netdef.comm import exchange as ex
from netdef.comm.communicator import Communicator, CommunicatorError, Operation
from netdef.comm.device_mpi import DeviceMpiReduction
from netdef.comm.elastic import HybridExchange
from netdef.comm.gradient_staging import DeviceBuckets
from netdef.comm.nccl import NcclAllreduceExchange, over_nccl, route_for
from netdef.comm.nccl_sum import DeviceEventOperation, NcclReduction
from netdef.comm.scheduler import choose_sizes
from tests.comm.test_exchange import (ScriptedComm, assert_averaged, hooked, make_net, reference_gradients,
                                      run_first_layer_first, run_iteration)


class DeviceArray(np.ndarray):
    """A stand-in device array: host memory whose ``data.ptr`` is its address, as a CuPy array's."""

    @property
    def data(self):
        return type("Memory", (), {"ptr": self.ctypes.data})()


class StandInCupy:
    """The CuPy calls the NCCL reduction and the device buckets make. An event completes on its
    ``lag``-th query (or when waited for), as work queued on a GPU completes some time after the
    host queued it (``nccl_lag``: on NCCL's stream); ``log`` notes every event that completes, by the
    stream it was recorded on."""

    def __init__(self, log: list, lag: int = 1, nccl_lag: int | None = None):
        stand_in = self
        self.log = log
        self.lag = lag
        self.nccl_lag = lag if nccl_lag is None else nccl_lag

        class Event:
            def __init__(self, stream):
                self.stream = stream
                self.queries = 0
                self.completed = False

            @property
            def done(self):
                self.queries += 1
                lag = stand_in.nccl_lag if self.stream.name == "nccl" else stand_in.lag
                if not self.completed and self.queries >= lag:
                    self._complete()
                return self.completed

            def synchronize(self):
                if not self.completed:
                    self._complete()

            def _complete(self):
                self.completed = True
                stand_in.log.append(("event done", self.stream.name))

        class Stream:
            def __init__(self, non_blocking=False, name="compute"):
                assert non_blocking or name == "compute", "NCCL's stream must not wait for the legacy stream"
                self.name = name if not non_blocking else "nccl"
                self.ptr = id(self)
                self.events = []

            def record(self):
                self.events.append(Event(self))
                return self.events[-1]

            def wait_event(self, event):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        compute = Stream()

        class Cuda:
            Stream = staticmethod(lambda non_blocking=False: Stream(non_blocking))
            get_current_stream = staticmethod(lambda: compute)
            Device = staticmethod(contextlib.nullcontext)

        self.cuda = Cuda
        self.compute = compute

    @staticmethod
    def zeros(count, dtype=np.float32):
        return np.zeros(count, dtype=dtype).view(DeviceArray)

    @staticmethod
    def divide(a, b, out=None):
        return np.divide(a, b, out=out)


class StandInNccl:
    """NCCL's module as CuPy gives it: its communicator sums like ScriptedComm (the other ranks add
    ``(size - 1) * x + 1``), reading and writing the memory at the pointers it is given."""

    NCCL_FLOAT32, NCCL_FLOAT64, NCCL_FLOAT16, NCCL_SUM = 7, 8, 6, 0
    C_TYPES = {7: ctypes.c_float, 8: ctypes.c_double}

    def __init__(self, log: list):
        stand_in = self
        self.log = log

        class NcclCommunicator:
            def __init__(self, size, unique_id, rank):
                assert len(unique_id) == 128
                self.size = size
                self.destroyed = self.aborted = False

            def allReduce(self, send, receive, count, data_type, op, stream):
                assert send == receive and op == stand_in.NCCL_SUM
                values = np.ctypeslib.as_array(ctypes.cast(receive, ctypes.POINTER(stand_in.C_TYPES[data_type])),
                                               shape=(count,))
                values *= self.size
                values += 1
                stand_in.log.append(("allreduce", count, stream))

            def destroy(self):
                assert not self.aborted
                self.destroyed = True

            def abort(self):
                assert not self.destroyed
                self.aborted = True

        self.NcclCommunicator = NcclCommunicator

    @staticmethod
    def get_unique_id():
        return bytes(128)

    @staticmethod
    def get_version():
        return 23007


class ScriptedRanks(ScriptedComm):
    """ScriptedComm's ranks with the operations netdef builds (``Operation``) among the requests, as
    the MPI communicator takes them: the NCCL chunks beside the schedule's MPI marks."""

    def test_some(self, requests):
        done = [i for i, r in enumerate(requests) if isinstance(r, Operation) and r.test()]
        for i in done:
            requests[i] = None
        scripted = [r if not isinstance(r, Operation) else None for r in requests]
        done += [i for i in super().test_some(scripted)]
        for i in done:
            requests[i] = None
        return sorted(set(done))

    def wait_all(self, requests):
        for i, r in enumerate(requests):
            if isinstance(r, Operation):
                r.wait()
                requests[i] = None
        super().wait_all(requests)


class RuleOverNccl(ex.AllreduceExchange):
    """The allreduce rule with its sums on the stand-in NCCL; every bucket it starts must have its
    gradients final on the (stand-in) device."""

    def __init__(self, comm, net, options, log, lag, nccl_lag=None):
        self.log, self.lag, self.nccl_lag = log, lag, nccl_lag
        super().__init__(comm, net, options)

    def make_reduction(self):
        return NcclReduction(self.comm, cupy=StandInCupy(self.log, self.lag, self.nccl_lag), nccl=StandInNccl(self.log))

    def start_bucket(self, bucket):
        assert self.gradients.copied(bucket), f"bucket {bucket.index} started before its gradients were final"
        self.log.append(("start bucket", bucket.index))
        super().start_bucket(bucket)


def device_rule(rule_class, comm, schedule, overlap, mode, log, lag):
    """(the test net, its gradients, a ``rule_class`` on ``comm`` with its buckets on the stand-in
    device, hooked to the net and with its sizes set)."""
    net = make_net()
    expected = reference_gradients(net)
    options = ex.ExchangeOptions(schedule=schedule, overlap=overlap, bucket_bytes=64, progress=mode, chunk_bytes=32,
                                 credit_bytes=64)
    rule = hooked(net, rule_class(comm, net, options, log, lag))
    assert isinstance(rule.gradients, DeviceBuckets)
    rule.broadcast_initial()
    net.register_backward_hook(lambda li, ids: rule.gradients_ready(ids))
    return net, expected, rule


CASES = [pytest.param("priority", True, "POLL", id="priority"),
         pytest.param("priority", True, "THREAD", id="priority-thread"),
         pytest.param("fifo", False, "POLL", id="fifo-no-overlap"),
         pytest.param("fifo", True, "POLL", id="fifo")]


@pytest.mark.parametrize("schedule, overlap, mode", CASES)
@pytest.mark.parametrize("lag", [1, 4])
def test_the_transports_sum_device_buckets_over_nccl_once_their_gradients_are_final(schedule, overlap, mode, lag):
    log = []
    net, expected, rule = device_rule(RuleOverNccl, ScriptedRanks(size=4), schedule, overlap, mode, log, lag)
    for iteration in range(3):
        log.clear()
        run_iteration(net, rule, iteration, log)
        assert_averaged(net, expected)
        sums = [entry for entry in log if entry[0] == "allreduce"]
        assert sums and all(stream == rule.reduction.stream.ptr != rule.reduction.compute_stream.ptr
                            for _, _, stream in sums)
        # ip2.w, ip2.b, ip1.w, ip1.b (15, 3, 30, 5 floats): whole buckets, or chunks of at most 8 floats.
        assert sorted(count for _, count, _ in sums) == ([3, 5, 15, 30] if schedule == "fifo" else
                                                         [3, 5, 6, 7, 8, 8, 8, 8])
        assert [e[1] for e in log if e[0] == "start bucket"] == [0, 1, 2, 3]  # one order on every rank
    assert "NCCL 2.30.7's allreduce on a communication stream of its own" in rule.describe()
    # The diffs live in the device buckets (backward writes them where NCCL sums them: no copy in or
    # out), and get memory of their own again, with their values, when the run ends.
    buckets, diffs = rule.buckets, [blob.diff for blob in net.learnable_params]
    assert all(np.shares_memory(diffs[pid], bucket.own_buffer()) for bucket in buckets for pid in bucket.param_ids)
    rule.release()  # the end of a run: the communicator destroyed, and nothing more at the close
    rule.close()
    assert rule.reduction.communicator.destroyed and not rule.reduction.communicator.aborted
    for blob, before in zip(net.learnable_params, diffs):
        assert not any(np.shares_memory(blob.diff, bucket.own_buffer()) for bucket in buckets)
        np.testing.assert_array_equal(blob.diff, before)


def test_the_priority_schedule_sends_the_first_layers_chunks_first_over_nccl():
    """Once every rank knows every bucket is ready, the chunks of the buckets the next forward needs
    first (ip1's) go before what is left of the others, though ip2's gradients were final first."""
    net = make_net()
    expected = reference_gradients(net)
    log = []
    options = ex.ExchangeOptions(bucket_bytes=64, progress="POLL", chunk_bytes=32, credit_bytes=32, overlap=False)
    rule = hooked(net, RuleOverNccl(ScriptedRanks(size=4), net, options, log, lag=1, nccl_lag=3))
    rule.broadcast_initial()
    net.register_backward_hook(lambda li, ids: rule.gradients_ready(ids))
    ip1 = net.layer_learnable_ids(net.layer_index("ip1"))
    for iteration in range(2):
        log.clear()
        run_first_layer_first(net, rule, iteration, ip1, expected)
        rule.wait_for(range(4))
        assert_averaged(net, expected)
    chunks = sorted(rule.measurements.current.chunks, key=lambda c: c.started_at)
    ip1_buckets = {rule._slot[pid][0].index for pid in ip1}
    assert {rule._slot[pid][0].index for pid in range(4)} - ip1_buckets == {0, 1}  # ip2's, filled first
    # ip2.w's two chunks leave while only they are known to be ready everywhere; then ip1's go, and
    # ip2.b last.
    assert [c.bucket for c in chunks[:2]] == [0, 0] and chunks[-1].bucket == 1
    assert {c.bucket for c in chunks[2:-1]} == ip1_buckets
    # Closed without the run's end (a rank that failed): aborted, as destroying would wait for
    # collectives that the other ranks may never join.
    rule.close()
    assert rule.reduction.communicator.aborted and not rule.reduction.communicator.destroyed


def test_a_chunk_over_nccl_is_complete_when_its_event_is():
    log = []
    reduction = NcclReduction(Communicator(), cupy=StandInCupy(log, lag=3), nccl=StandInNccl(log))
    array = reduction.empty(4)
    array[:] = 2.0
    operation = reduction.start(array)
    assert isinstance(operation, DeviceEventOperation)
    assert not operation.test() and not operation.test() and operation.test()
    np.testing.assert_array_equal(array, 3.0)  # one rank: 2 * 1 + 1
    assert log[-1] == ("event done", "nccl")


def test_the_schedule_measures_the_link_with_the_reductions_own_arrays():
    log = []
    seen = []

    class Watched(NcclReduction):
        def start(self, array):
            seen.append(type(array))
            return super().start(array)

    reduction = Watched(Communicator(), cupy=StandInCupy(log), nccl=StandInNccl(log))
    chunk, credit, link = choose_sizes(Communicator(), repeats=1, reduction=reduction, sleep=lambda s: None)
    assert seen and set(seen) == {DeviceArray}
    assert 0 < chunk <= credit and link.bytes_per_s > 0


def test_over_nccl_keeps_the_rule_and_its_schedule_but_for_fifo_with_overlap():
    options = ex.ExchangeOptions()
    assert options.schedule == "priority" and options.exchange_via == "auto"
    rule, chosen = over_nccl(ex.AllreduceExchange, options)
    assert rule is ex.AllreduceExchange and chosen.exchange_via == "nccl" and chosen.schedule == "priority"
    fifo = dataclasses.replace(options, schedule="fifo")
    assert over_nccl(ex.AllreduceExchange, fifo) == (NcclAllreduceExchange, fifo)
    no_overlap = dataclasses.replace(fifo, overlap=False)
    assert over_nccl(ex.AllreduceExchange, no_overlap)[0] is ex.AllreduceExchange
    hybrid = dataclasses.replace(fifo, exchange="hybrid")
    rule, chosen = over_nccl(HybridExchange, hybrid)
    assert rule is HybridExchange and chosen.exchange_via == "nccl"


def test_hybrid_and_the_trees_sum_over_nccl_and_the_rules_that_move_weights_through_the_host():
    two_gpus = [("a", "0000:01:00.0", None), ("a", "0000:02:00.0", None)]
    for rule in ("hybrid", "multicolor", "fp16"):
        assert route_for(two_gpus, rule, "auto", None) == (True, "NCCL")
    for rule in ("easgd", "gossip"):
        assert route_for(two_gpus, rule, "auto", None) == (False, f"pinned host buffers and MPI (the {rule} rule "
                                                                  f"exchanges through MPI)")


class ScriptedCudaAwareRanks(ScriptedComm):
    """ScriptedComm's ranks whose MPI library takes device memory (the stand-in's arrays)."""

    device_buffers = True

    def iallreduce_on_device(self, array):
        return self.iallreduce(array)


class RuleOverCudaAwareMpi(RuleOverNccl):
    def make_reduction(self):
        return DeviceMpiReduction(self.comm, cupy=StandInCupy(self.log, self.lag))


@pytest.mark.parametrize("schedule, overlap, mode", CASES[:1] + CASES[2:3])
def test_a_cuda_aware_mpi_sums_the_device_buckets_once_their_gradients_are_final(schedule, overlap, mode):
    log = []
    net, expected, rule = device_rule(RuleOverCudaAwareMpi, ScriptedCudaAwareRanks(size=4, events=log), schedule,
                                      overlap, mode, log, lag=3)
    for iteration in range(3):
        log.clear()
        run_iteration(net, rule, iteration, log)
        assert_averaged(net, expected)
        assert [e[1] for e in log if e[0] == "start bucket"] == [0, 1, 2, 3]
    assert "the MPI library's allreduce on device memory (CUDA-aware MPI)" in rule.describe()
    rule.close()


def test_one_process_takes_no_device_memory_into_mpi():
    assert not Communicator.device_buffers
    with pytest.raises(CommunicatorError, match="takes no GPU memory"):
        Communicator().iallreduce_on_device(np.zeros(2, dtype=np.float32))
