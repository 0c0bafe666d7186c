"""The exchange rule interface, bucket planning, the allreduce rule and the progress drivers, in one
process against a scripted communicator (the MPI runs are in test_mpi.py)."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

import netdef
from netdef.blob import Blob
from netdef.comm import buckets as buckets_module
from netdef.comm import exchange as ex
from netdef.comm.communicator import Communicator, CommunicatorError
from netdef.comm.reduction import Reduction
from netdef.comm.progress import (
    PollDriver,
    ThreadDriver,
    choose_mode,
    make_driver,
    mode_name,
)
from netdef.comm.gradient_staging import HostGradients
from netdef.comm.timeline import (
    BucketRecord,
    IterationRecord,
    Measurements,
    Timeline,
    instrument_net,
    write_chrome_trace,
)


class ScriptedComm(Communicator):
    """``size`` ranks whose other members contribute ``(size - 1) * x + 1`` to every sum, so that
    the average of a gradient g is g + 1/size. Requests complete one per ``test_some`` call (one
    step of progress per poll) or all in ``wait_all``. ``log`` records starts and completions."""

    def __init__(self, size=4, events=None):
        self.size = size
        self.rank = 0
        self.log = events if events is not None else []
        self._pending = []

    def _complete(self, request):
        if request["done"]:
            return
        buf = request["buffer"]
        buf *= buf.dtype.type(self.size)
        buf += buf.dtype.type(1)
        request["done"] = True
        self.log.append(("done", request["n"]))

    def iallreduce(self, array, op="sum"):
        assert isinstance(array, np.ndarray) and array.flags.c_contiguous
        if op == "min":  # the priority schedule's marks: every rank as ready as this one
            self.log.append(("mark", int(array[0])))
            return {"buffer": array, "done": True, "n": array.size}
        request = {"buffer": array, "done": False, "n": array.size}
        self._pending.append(request)
        self.log.append(("start", array.size))
        return request

    def test_some(self, requests):
        active = [i for i, r in enumerate(requests) if r is not None]
        if not active:
            return []
        first = active[0]
        if not requests[first]["done"]:
            self._complete(requests[first])
        requests[first] = None
        return [first]

    def wait_all(self, requests):
        for i, r in enumerate(requests):
            if r is not None and not r["done"]:
                self._complete(r)
            requests[i] = None


def assert_averaged(net, gradients):
    """Every diff of ``net`` holds ScriptedComm(size=4)'s average of its gradient g: g + 1/4."""
    for blob, g in zip(net.learnable_params, gradients):
        np.testing.assert_allclose(blob.diff, g + 0.25, rtol=1e-6, atol=1e-6)


NET = """
layer { name: "in" type: "Input" top: "x" top: "t" input_param { shape { dim: 4 dim: 6 } shape { dim: 4 dim: 3 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "h"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }
layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "y"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "constant" value: 0.2 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }
"""


def make_net(seed=3):
    netdef.set_random_seed(seed)
    net = netdef.Net(NET, netdef.TRAIN)
    rng = np.random.default_rng(seed)
    net.blobs["x"].data[...] = rng.standard_normal((4, 6))
    net.blobs["t"].data[...] = rng.standard_normal((4, 3))
    return net


def reference_gradients(net):
    net.clear_param_diffs()
    net.forward_backward()
    return [b.diff.copy() for b in net.learnable_params]


def hooked(net, rule):
    """``rule`` with the layer hooks it asks for registered on ``net``, as DataParallel does."""
    hooks = rule.layer_hooks()
    if hooks:
        net.register_layer_hooks(**hooks)
    return rule


def run_iteration(net, rule, iteration, events):
    net.clear_param_diffs()
    rule.measurements.begin(iteration, time.perf_counter())
    rule.begin_iteration(iteration)
    net.forward_range()
    net.backward()
    events.append(("backward end", None))
    rule.backward_done()
    rule.finish()


# ============================================================================================ buckets
def test_plan_buckets_fuses_small_blobs_and_isolates_big_ones():
    net = make_net()
    params = net.learnable_params  # ip1.w 120 B, ip1.b 20 B, ip2.w 60 B, ip2.b 12 B (float32)
    buckets = buckets_module.plan_buckets([2, 3, 0, 1], params, bucket_bytes=80)
    # ip2.w + ip2.b fuse (72 B); ip1.w is big and goes alone; ip1.b is left for the last bucket.
    assert [b.param_ids for b in buckets] == [[2, 3], [0], [1]]
    assert [b.index for b in buckets] == [0, 1, 2]
    assert [b.nbytes for b in buckets] == [72, 120, 20]
    # Everything fits in one bucket; and a bound of one byte gives every blob its own.
    assert [b.param_ids for b in buckets_module.plan_buckets([2, 3, 0, 1], params, 1 << 20)] == [[2, 3, 0, 1]]
    assert [b.param_ids for b in buckets_module.plan_buckets([2, 3, 0, 1], params, 1)] == [[2], [3], [0], [1]]


def test_a_big_blob_closes_the_fused_bucket_before_it():
    net = make_net()
    params = net.learnable_params
    # ip2.b (12 B) became final before ip1.w (120 B): it must not wait behind it for ip1.b.
    buckets = buckets_module.plan_buckets([3, 0, 1], params, bucket_bytes=100)
    assert [b.param_ids for b in buckets] == [[3], [0], [1]]


def test_fused_buckets_close_at_a_layer_end_once_big_enough(monkeypatch):
    net = make_net()
    params = net.learnable_params
    layers = [[2, 3], [0, 1]]  # ip2's blobs are handed over by one hook call, ip1's by the next
    monkeypatch.setattr(buckets_module, "FUSE_ACROSS_LAYERS_BYTES", 50)
    assert [b.param_ids for b in buckets_module.plan_buckets([2, 3, 0, 1], params, 1 << 20, layers)] == [[2, 3], [0, 1]]
    # Without the layers (or below the threshold) small layers fuse across the boundary.
    assert [b.param_ids for b in buckets_module.plan_buckets([2, 3, 0, 1], params, 1 << 20)] == [[2, 3, 0, 1]]
    monkeypatch.setattr(buckets_module, "FUSE_ACROSS_LAYERS_BYTES", 100)
    assert [b.param_ids for b in buckets_module.plan_buckets([2, 3, 0, 1], params, 1 << 20, layers)] == [[2, 3, 0, 1]]
    # The bucket bound is also the threshold when it is the smaller.
    assert [b.param_ids for b in buckets_module.plan_buckets([2, 3, 0, 1], params, 73, layers)] == [[2, 3], [0], [1]]


def test_the_rule_plans_by_the_layers_it_saw(monkeypatch):
    monkeypatch.setattr(buckets_module, "FUSE_ACROSS_LAYERS_BYTES", 50)
    net = make_net()
    options = ex.ExchangeOptions(schedule="fifo", bucket_bytes=1 << 20, progress="POLL")
    rule = hooked(net, ex.AllreduceExchange(ScriptedComm(2), net, options))
    net.register_backward_hook(lambda li, ids: rule.gradients_ready(ids))
    run_iteration(net, rule, 0, [])
    assert [b.param_ids for b in rule.buckets] == [[2, 3], [0, 1]]


def test_plan_buckets_splits_by_dtype_and_skips_empty_blobs():
    params = [Blob(3, dtype=np.float32), Blob(2, dtype=np.float64), Blob(0, dtype=np.float32), Blob(4, dtype=np.float32)]
    buckets = buckets_module.plan_buckets([0, 1, 2, 3], params, 1 << 20)
    assert [b.param_ids for b in buckets] == [[0], [1], [3]]
    assert [b.buffer.dtype if b.buffer is not None else b.dtype for b in buckets] == [np.float32, np.float64, np.float32]


def test_bucket_pack_unpack_round_trip_and_in_place_single_blob():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([10.0, 20.0], dtype=np.float32)
    fused = buckets_module.Bucket(0, np.float32, [0, 1], [a.shape, b.shape])
    fused.pack(0, a)
    fused.pack(1, b)
    assert fused.full and not fused.in_place
    np.testing.assert_array_equal(fused.buffer, [0, 1, 2, 3, 4, 5, 10, 20])
    fused.buffer *= 2
    out_a, out_b = np.zeros_like(a), np.zeros_like(b)
    fused.unpack(0, out_a, 4)
    fused.unpack(1, out_b, 4)
    np.testing.assert_array_equal(out_a, a / 2)
    np.testing.assert_array_equal(out_b, b / 2)
    single = buckets_module.Bucket(1, np.float32, [2], [a.shape])
    diff = a.copy()
    single.pack(0, diff)
    assert single.in_place and np.shares_memory(single.buffer, diff)
    single.buffer *= 3
    single.unpack(0, diff, 3)
    np.testing.assert_array_equal(diff, a)


def test_an_in_place_sum_can_be_left_to_the_update():
    a = np.arange(6, dtype=np.float32)
    single = buckets_module.Bucket(0, np.float32, [0], [a.shape])
    single.pack(0, a)
    single.buffer *= 3
    assert single.unpack(0, a, 3, leave_division=True)  # the caller owes the division
    np.testing.assert_array_equal(a, np.arange(6) * 3)
    fused = buckets_module.Bucket(1, np.float32, [0, 1], [(2,), (2,)])
    fused.pack(0, np.ones(2, np.float32))
    fused.pack(1, np.ones(2, np.float32))
    out = np.zeros(2, np.float32)
    assert not fused.unpack(0, out, 2, leave_division=True)  # a copy out divides on the way
    np.testing.assert_array_equal(out, [0.5, 0.5])


def test_the_rule_hands_the_division_of_in_place_sums_to_the_update():
    net = make_net()
    expected = reference_gradients(net)
    # ip1.w (120 bytes) in a bucket of its own, the small blobs fused: every diff lives in its bucket
    # once the first iteration has planned them, so every sum is left in place for the update.
    options = ex.ExchangeOptions(schedule="fifo", bucket_bytes=100, progress="POLL")
    rule = hooked(net, ex.AllreduceExchange(ScriptedComm(4), net, options))
    rule.leave_division_to_update()
    net.register_backward_hook(lambda li, ids: rule.gradients_ready(ids))
    for iteration in range(2):  # the first learns the layout
        for pid in range(len(net.learnable_params)):
            rule.take_divisor(pid)
        run_iteration(net, rule, iteration, [])
    assert len(rule.buckets) > 1 and any(len(b.param_ids) > 1 for b in rule.buckets)
    for pid, blob in enumerate(net.learnable_params):
        assert rule.take_divisor(pid) == 4
        assert rule.take_divisor(pid) == 1  # taken
        # ScriptedComm's average of g is g + 1/size.
        np.testing.assert_allclose(blob.diff / np.float32(4), expected[pid] + 0.25, rtol=1e-6)


def test_the_diffs_live_in_the_buckets_and_leave_them_at_release():
    net = make_net()
    expected = reference_gradients(net)
    options = ex.ExchangeOptions(schedule="fifo", bucket_bytes=100, progress="POLL")
    rule = hooked(net, ex.AllreduceExchange(ScriptedComm(4), net, options))
    net.register_backward_hook(lambda li, ids: rule.gradients_ready(ids))
    for iteration in range(3):
        run_iteration(net, rule, iteration, [])
        assert_averaged(net, expected)
        # Backward wrote every gradient into its bucket, where it was summed and averaged.
        for bucket in rule.buckets:
            for slot, pid in enumerate(bucket.param_ids):
                assert np.shares_memory(net.learnable_params[pid].diff, bucket.buffer)
                assert net.learnable_params[pid].diff.shape == bucket.shapes[slot]
    buffers = [bucket.buffer for bucket in rule.buckets]
    averaged = [blob.diff.copy() for blob in net.learnable_params]
    rule.release()
    # Each diff has memory of its own again, with its values; the next iteration plans anew.
    assert rule.buckets is None
    for blob, values in zip(net.learnable_params, averaged):
        assert not any(np.shares_memory(blob.diff, buffer) for buffer in buffers)
        np.testing.assert_array_equal(blob.diff, values)
    run_iteration(net, rule, 3, [])
    assert_averaged(net, expected)
    assert all(np.shares_memory(net.learnable_params[b.param_ids[0]].diff, b.buffer) for b in rule.buckets)


def test_a_shared_diff_stays_where_it_is_and_is_copied():
    bucket = buckets_module.Bucket(0, np.float32, [0, 1], [(2, 3), (4,)])
    home = bucket.home_of(0)
    home[...] = np.arange(6, dtype=np.float32).reshape(2, 3)
    other = np.arange(4, dtype=np.float32) + 10
    bucket.pack(0, home)   # already in place
    bucket.pack(1, other)  # copied in
    assert bucket.full and np.shares_memory(bucket.buffer, home)
    np.testing.assert_array_equal(bucket.buffer, [0, 1, 2, 3, 4, 5, 10, 11, 12, 13])
    bucket.buffer *= 2  # "summed over 2 ranks"
    out = np.empty(4, dtype=np.float32)
    assert bucket.unpack(0, home, 2, leave_division=True)  # left in place to the update
    assert not bucket.unpack(1, out, 2, leave_division=True)  # a copy is divided on its way out
    np.testing.assert_array_equal(home, np.arange(6).reshape(2, 3) * 2)
    np.testing.assert_array_equal(out, np.arange(4) + 10)
    assert not bucket.unpack(0, home, 2)
    np.testing.assert_array_equal(home, np.arange(6).reshape(2, 3))


def test_a_blob_keeps_its_diff_in_given_memory():
    blob = Blob(2, 3, name="w")
    blob.diff[...] = 7
    home = np.zeros(6, dtype=np.float32)
    blob.keep_diff_in(home)
    assert np.shares_memory(blob.diff, home) and blob.diff.shape == (2, 3)
    np.testing.assert_array_equal(home, 7)
    blob.defer_zero_diff()
    blob.keep_diff_in(np.empty(6, dtype=np.float32))  # the pending clear stays pending
    np.testing.assert_array_equal(blob.diff, 0)
    with pytest.raises(ValueError, match="cannot live in"):
        blob.keep_diff_in(np.zeros(5, dtype=np.float32))
    sharer = Blob(6, name="view")
    sharer.share_diff(blob)
    assert blob.diff_is_shared and sharer.diff_is_shared
    with pytest.raises(ValueError, match="shared with another blob"):
        blob.keep_diff_in(np.zeros(6, dtype=np.float32))


# ============================================================================================ allreduce rule
def run_first_layer_first(net, rule, iteration, first_ids, expected):
    """One iteration whose exchange is waited for as the next forward does: ``first_ids`` (the first
    layer's parameters) first, whose diffs must then hold their average."""
    net.clear_param_diffs()
    rule.measurements.begin(iteration, time.perf_counter())
    rule.begin_iteration(iteration)
    net.forward_range()
    net.backward()
    rule.backward_done()
    rule.wait_for(first_ids)
    for pid in first_ids:
        np.testing.assert_allclose(net.learnable_params[pid].diff, expected[pid] + 0.25, rtol=1e-6, atol=1e-6)


def test_priority_schedule_averages_chunks_into_the_diffs_first_layer_first():
    net = make_net()
    expected = reference_gradients(net)
    events = []
    comm = ScriptedComm(size=4, events=events)
    options = ex.ExchangeOptions(bucket_bytes=64, progress="POLL", chunk_bytes=32, credit_bytes=64)
    rule = hooked(net, ex.AllreduceExchange(comm, net, options))
    rule.broadcast_initial()
    net.register_backward_hook(lambda li, ids: rule.gradients_ready(ids))
    ip1 = net.layer_learnable_ids(net.layer_index("ip1"))
    for iteration in range(3):
        run_first_layer_first(net, rule, iteration, ip1, expected)
        assert set(ip1) <= set(rule.arrived(range(4)))
        rule.wait_for(range(4))
        assert_averaged(net, expected)
        record = rule.measurements.current
        # ip1.w (120 bytes) in 4 chunks of at most 32 bytes, ip2.w (60) in 2, the biases in one each.
        assert sorted(c.nbytes for c in record.chunks) == [12, 20, 24, 28, 32, 32, 32, 32]
        assert all(c.started_at <= c.done_at for c in record.chunks)
        assert record.bytes == 60 + 12 + 120 + 20
    assert "schedule priority" in rule.describe()
    rule.close()



@pytest.mark.parametrize("overlap", [True, False])
def test_allreduce_averages_into_the_diffs(overlap):
    net = make_net()
    expected = reference_gradients(net)
    events = []
    comm = ScriptedComm(size=4, events=events)
    options = ex.ExchangeOptions(schedule="fifo", overlap=overlap, bucket_bytes=64, progress="POLL")
    rule = hooked(net, ex.AllreduceExchange(comm, net, options))
    net.register_backward_hook(lambda li, ids: (events.append(("hook", li)), rule.gradients_ready(ids)))
    for iteration in range(3):
        events.clear()
        run_iteration(net, rule, iteration, events)
        assert_averaged(net, expected)
        starts = [i for i, e in enumerate(events) if e[0] == "start"]
        end = events.index(("backward end", None))
        assert len(starts) == 4  # ip2.w, ip2.b (closed by the big ip1.w), ip1.w, ip1.b
        if overlap and iteration > 0:
            # ip2's buckets start right after ip2's backward, before ip1's.
            assert starts[1] < events.index(("hook", 1)) < end
        else:
            assert min(starts) > end  # the first iteration learns the layout; overlap off waits
        record = rule.measurements.current
        assert [b.index for b in record.buckets] == [0, 1, 2, 3]
        assert record.bytes == 60 + 12 + 120 + 20
        assert all(b.ready_at <= b.started_at <= b.done_at for b in record.buckets)
        assert record.wait_s >= 0 and record.exchange_call_s > 0


class RecordingReduction(Reduction):
    """MPI's (scripted) allreduce, noting the size of every buffer it is asked to sum."""

    def __init__(self, comm):
        super().__init__(comm)
        self.sizes = []

    def start(self, array):
        self.sizes.append(array.size)
        return super().start(array)


class RuleWithItsOwnReduction(ex.AllreduceExchange):
    def make_reduction(self):
        return RecordingReduction(self.comm)


@pytest.mark.parametrize("schedule, mode", [("priority", "POLL"), ("priority", "THREAD"), ("fifo", "POLL"),
                                            ("fifo", "THREAD")])
def test_both_transports_sum_through_the_rules_reduction(schedule, mode):
    net = make_net()
    expected = reference_gradients(net)
    options = ex.ExchangeOptions(schedule=schedule, bucket_bytes=64, progress=mode, chunk_bytes=32, credit_bytes=64)
    rule = hooked(net, RuleWithItsOwnReduction(ScriptedComm(size=4), net, options))
    rule.broadcast_initial()
    net.register_backward_hook(lambda li, ids: rule.gradients_ready(ids))
    run_iteration(net, rule, 0, [])
    assert_averaged(net, expected)
    # ip2.w, ip2.b, ip1.w, ip1.b (15, 3, 30, 5 floats): whole buckets, or chunks of at most 8 floats.
    sizes = sorted(rule.reduction.sizes)
    assert sizes == ([3, 5, 15, 30] if schedule == "fifo" else [3, 5, 6, 7, 8, 8, 8, 8])
    rule.close()


def test_poll_driver_is_poked_after_layers_without_parameters():
    net = make_net()  # in, ip1, relu, ip2, loss: relu (layer 2) has no parameters
    net.fuse_layers = False  # ip1 and relu would run as one step (layers/relu_chain.py)
    rule = ex.AllreduceExchange(ScriptedComm(2), net, ex.ExchangeOptions(schedule="fifo", bucket_bytes=64, progress="POLL"))
    assert set(rule.layer_hooks()) == {"after_backward"}
    hooks = net.register_layer_hooks(**rule.layer_hooks())
    net.register_backward_hook(lambda li, ids: rule.gradients_ready(ids))
    current = []
    net.register_layer_hooks(before_backward=current.append)
    pokes = []
    poke = rule.driver.poke
    rule.driver.poke = lambda: (pokes.append(current[-1]), poke())
    for iteration in range(2):
        pokes.clear()
        run_iteration(net, rule, iteration, [])
    assert 2 in pokes  # between ip2's and ip1's backward, with ip2's buckets in flight
    assert 4 not in pokes  # nothing in flight yet after the loss layer
    net.remove_layer_hooks(hooks)
    rule.close()


def test_overlap_off_registers_no_layer_hook():
    net = make_net()
    rule = ex.AllreduceExchange(ScriptedComm(2), net, ex.ExchangeOptions(schedule="fifo", overlap=False, progress="POLL"))
    assert rule.layer_hooks() == {}


@pytest.mark.parametrize("mode, local_size, resolved", [("THREAD", 1, "THREAD"), ("AUTO", 2, "DEFERRED")])
def test_drivers_that_do_not_poll_register_no_layer_hook(mode, local_size, resolved):
    net = make_net()
    comm = ScriptedComm(2)
    comm.local_size = local_size  # 2: both ranks on this machine
    # MPI's allreduce (on one machine AUTO would otherwise sum in shared memory, and poll).
    rule = ex.AllreduceExchange(comm, net, ex.ExchangeOptions(schedule="fifo", progress=mode, exchange_via="mpi"))
    try:
        assert rule.progress_mode == resolved
        assert rule.layer_hooks() == {}
    finally:
        rule.close()


def test_deferred_driver_leaves_the_work_to_the_wait():
    comm = ScriptedComm(size=2)
    driver = make_driver(comm, "deferred")
    assert driver.mode == "DEFERRED" and not driver.polls_between_layers
    driver.start(FakeBucket(2))
    driver.poke()
    assert [e[0] for e in comm.log] == ["start"]
    driver.wait_all()
    assert [e[0] for e in comm.log] == ["start", "done"]


def test_allreduce_on_one_rank_touches_nothing():
    net = make_net()
    expected = reference_gradients(net)
    options = ex.ExchangeOptions(schedule="fifo", bucket_bytes=64)
    rule = hooked(net, ex.AllreduceExchange(Communicator(), net, options))
    net.register_backward_hook(lambda li, ids: rule.gradients_ready(ids))
    run_iteration(net, rule, 0, [])
    assert rule.buckets is None and rule.driver is None
    for blob, g in zip(net.learnable_params, expected):
        np.testing.assert_array_equal(blob.diff, g)


def test_out_of_order_gradients_are_an_error():
    net = make_net()
    options = ex.ExchangeOptions(schedule="fifo", bucket_bytes=64, progress="POLL")
    rule = hooked(net, ex.AllreduceExchange(ScriptedComm(2), net, options))
    hook = lambda li, ids: rule.gradients_ready(ids)
    net.register_backward_hook(hook)
    run_iteration(net, rule, 0, [])
    rule.measurements.begin(1, time.perf_counter())
    rule.begin_iteration(1)
    with pytest.raises(RuntimeError, match="out of the order"):
        rule.gradients_ready([0, 1])  # ip1's before ip2's


def test_missing_gradients_are_reported_at_backward_end():
    net = make_net()
    options = ex.ExchangeOptions(schedule="fifo", bucket_bytes=64, progress="POLL")
    rule = hooked(net, ex.AllreduceExchange(ScriptedComm(2), net, options))
    net.register_backward_hook(lambda li, ids: rule.gradients_ready(ids))
    run_iteration(net, rule, 0, [])
    rule.measurements.begin(1, time.perf_counter())
    rule.begin_iteration(1)
    rule.gradients_ready([2, 3])
    with pytest.raises(RuntimeError, match="backward ended before the gradients of ip1"):
        rule.backward_done()


# ============================================================================================ registry
def test_registry():
    assert "allreduce" in ex.registered_exchanges()
    assert ex.exchange_class("allreduce") is ex.AllreduceExchange
    with pytest.raises(ValueError, match="unknown exchange rule 'telepathy'; registered: .*allreduce"):
        ex.exchange_class("telepathy")

    @ex.register_exchange("test-noop")
    class Noop(ex.ExchangeRule):
        pass

    try:
        assert ex.exchange_class("test-noop") is Noop and Noop.name == "test-noop"
        with pytest.raises(ValueError, match="already registered"):
            ex.register_exchange("test-noop")(type("Other", (ex.ExchangeRule,), {}))
    finally:
        ex.EXCHANGE_RULES.unregister("test-noop")


def test_base_rule_broadcasts_every_parameter():
    calls = []

    class Recording(Communicator):
        def broadcast(self, array, root=0):
            calls.append((array.shape, root))

    net = make_net()
    ex.ExchangeRule(Recording(), net).broadcast_initial()
    assert calls == [((5, 6), 0), ((5,), 0), ((3, 5), 0), ((3,), 0)]


# ============================================================================================ progress
class FakeBucket:
    def __init__(self, n):
        self.buffer = np.ones(n, dtype=np.float32)
        self.started_at = self.done_at = float("nan")


class FakeComm(Communicator):
    def __init__(self, size=2, local_size=2, thread_level=3, library="Open MPI"):
        self.size, self.local_size, self.thread_level, self.library = size, local_size, thread_level, library


def test_auto_defers_over_shared_memory_and_uses_a_thread_over_a_network():
    assert choose_mode(FakeComm(), "AUTO", environ={}) == "DEFERRED"
    assert choose_mode(FakeComm(local_size=1), "AUTO", environ={}) == "THREAD"
    assert choose_mode(FakeComm(local_size=1, thread_level=1), "AUTO", environ={}) == "POLL"  # FUNNELED
    # One machine, but the library is told to keep off shared memory.
    assert choose_mode(FakeComm(), "AUTO", environ={"OMPI_MCA_btl": "tcp,self"}) == "THREAD"
    assert choose_mode(FakeComm(), "AUTO", environ={"OMPI_MCA_btl": "^vader,sm"}) == "THREAD"
    assert choose_mode(FakeComm(), "AUTO", environ={"OMPI_MCA_btl": "self,vader,tcp"}) == "DEFERRED"
    assert choose_mode(FakeComm(), "AUTO", environ={"OMPI_MCA_btl": "^tcp"}) == "DEFERRED"
    assert choose_mode(FakeComm(), "AUTO", environ={"MPIR_CVAR_NOLOCAL": "1"}) == "THREAD"
    assert choose_mode(FakeComm(local_size=1), "THREAD", environ={}) == "THREAD"
    assert choose_mode(FakeComm(), "POLL", environ={"OMPI_MCA_btl": "tcp,self"}) == "POLL"


def test_auto_polls_a_reduction_that_tests_cheaply():
    # Summing in shared memory (shared_sum.py): a test reads a few counters, so polling between layers pays.
    assert choose_mode(FakeComm(), "AUTO", environ={}, cheap_polls=True) == "POLL"
    assert choose_mode(FakeComm(), "THREAD", environ={}, cheap_polls=True) == "THREAD"


def test_mpi_async_needs_mpich_with_its_progress_thread():
    assert choose_mode(FakeComm(library="MPICH"), "MPI_ASYNC", environ={"MPIR_CVAR_ASYNC_PROGRESS": "1"}) == \
        "MPI_ASYNC"
    assert choose_mode(FakeComm(library="MPICH"), "MPI_ASYNC", environ={}) == "POLL"
    assert choose_mode(FakeComm(), "MPI_ASYNC", environ={"MPIR_CVAR_ASYNC_PROGRESS": "1"}) == "POLL"


def test_choose_mode():
    assert choose_mode(Communicator(), "AUTO") == "DEFERRED"
    assert choose_mode(Communicator(), "thread") == "THREAD"
    assert choose_mode(Communicator(), "MPI_ASYNC") == "POLL"  # not MPICH with its progress thread
    assert mode_name(2) == "THREAD"
    with pytest.raises(ValueError, match="unknown progress mode 'fast'"):
        mode_name("fast")


@pytest.mark.parametrize("mode", ["POLL", "THREAD", "MPI_ASYNC", "DEFERRED"])
def test_drivers_complete_every_bucket(mode):
    comm = ScriptedComm(size=2)
    driver = make_driver(comm, mode)
    buckets = [FakeBucket(n) for n in (3, 5, 7)]
    try:
        for bucket in buckets:
            driver.start(bucket)
            driver.poke()
        driver.wait_all()
    finally:
        driver.close()
    for bucket in buckets:
        np.testing.assert_array_equal(bucket.buffer, 3.0)  # 1 * 2 + 1
        assert bucket.started_at <= bucket.done_at
    assert [e for e in comm.log if e[0] == "start"] == [("start", 3), ("start", 5), ("start", 7)]


def test_poll_driver_progresses_only_when_poked():
    comm = ScriptedComm(size=2)
    driver = PollDriver(comm)
    driver.start(FakeBucket(2))
    driver.start(FakeBucket(2))
    assert [e[0] for e in comm.log] == ["start", "start"]
    driver.poke()
    assert [e[0] for e in comm.log] == ["start", "start", "done"]
    driver.wait_all()
    assert [e[0] for e in comm.log].count("done") == 2


class CompletesOnlyInWait(ScriptedComm):
    """A library whose Testsome never sees a completion: only a blocking wait completes."""

    def test_some(self, requests):
        return []


def test_thread_driver_blocks_in_mpi_once_the_training_thread_waits():
    comm = CompletesOnlyInWait(size=2)
    driver = ThreadDriver(comm, poll_interval=0.001)
    try:
        for iteration in range(2):
            comm.log.clear()
            driver.start(FakeBucket(4))
            time.sleep(0.03)  # many polls: none completes it (no blocking wait during "backward")
            assert [e[0] for e in comm.log] == ["start"]
            driver.wait_all()
            assert [e[0] for e in comm.log] == ["start", "done"]
    finally:
        driver.close()
    assert not driver._thread.is_alive()


def test_thread_driver_poll_interval():
    driver = ThreadDriver(ScriptedComm(2), poll_interval=0.01)
    try:
        assert driver.poll_interval == 0.01 and ThreadDriver.poll_interval == 0.002
    finally:
        driver.close()


def test_thread_driver_reports_a_failure_of_its_thread():
    class Broken(ScriptedComm):
        def iallreduce(self, array):
            raise RuntimeError("link down")

    driver = ThreadDriver(Broken())
    driver.start(FakeBucket(2))
    with pytest.raises(CommunicatorError, match="communication thread failed: link down"):
        driver.wait_all()
    driver.close()


# ============================================================================================ timeline
def test_measurements_summary_skips_the_first_iteration():
    m = Measurements()
    for i, wait in enumerate([9.0, 1.0, 3.0, 2.0]):
        record = m.begin(i, 0.0)
        record.wait_s = wait
        record.bytes = 100
        record.buckets = [BucketRecord(0, 100, 1, 0.0, 0.5, 1.5)]
    summary = m.summary()
    assert summary["iterations"] == 3 and summary["wait_s"] == 2.0
    assert summary["exchange_s"] == 1.0 and summary["bytes"] == 100 and summary["buckets"] == 1
    assert Measurements().summary() == {"iterations": 0}


def test_measurements_iteration_time():
    m = Measurements()
    for i, (start, end) in enumerate([(0.0, 5.0), (5.0, 6.0), (6.0, 8.0), (8.0, 9.0)]):
        record = m.begin(i, start)
        record.end_at = end
    assert m.summary()["iteration_s"] == 1.0
    m.begin(4, 9.0)  # not finished: left out
    assert m.summary()["iteration_s"] == 1.0


def test_instrument_net_records_layers_through_the_layer_hooks():
    net = make_net()
    timeline = Timeline(0, origin=time.perf_counter())
    handle = instrument_net(net, timeline)
    net.forward_backward()
    names = [e["name"] for e in timeline.events() if e["ph"] == "X"]
    assert names[:5] == ["in forward", "ip1 forward", "relu forward", "ip2 forward", "loss forward"]
    # Backward in reverse, without the input layer (it does not run backward).
    assert names[5:] == ["loss backward", "ip2 backward", "relu backward", "ip1 backward"]
    assert all(e["dur"] >= 0 for e in timeline.events() if e["ph"] == "X")
    net.remove_layer_hooks(handle)
    net.forward_backward()
    assert len([e for e in timeline.events() if e["ph"] == "X"]) == 9


def test_chrome_trace_file(tmp_path):
    lines = []
    for rank in range(2):
        timeline = Timeline(rank, origin=10.0)
        timeline.span("ip1 backward", 10.001, 10.003)
        record = IterationRecord(5, 10.0, buckets=[BucketRecord(0, 64, 2, 10.002, 10.002, 10.004)])
        timeline.record_iteration(record)
        lines.append(timeline.to_json())
    path = tmp_path / "trace.json"
    write_chrome_trace(path, lines)
    doc = json.loads(path.read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    backward = next(e for e in spans if e["name"] == "ip1 backward" and e["pid"] == 1)
    assert backward["ts"] == pytest.approx(1000.0) and backward["dur"] == pytest.approx(2000.0)
    bucket = next(e for e in spans if e["name"] == "bucket 0" and e["pid"] == 0)
    assert bucket["args"]["bytes"] == 64 and bucket["args"]["iteration"] == 5
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}


class SlowCopies(HostGradients):
    """Gradients that reach the host some polls after they are packed, as a GPU's copies do on the
    staged path (gradient_staging.PinnedDeviceGradients): ``copied`` turns true on its ``polls``-th
    call for a bucket, ``wait_copied`` completes the copy at once. ``events`` notes both."""

    asynchronous = True

    def __init__(self, events, polls=2):
        self.events = events
        self.polls = polls
        self._asked = {}
        self.done = set()

    def pack(self, bucket, slot, diff):
        super().pack(bucket, slot, diff)
        self._asked[bucket.index] = 0
        self.done.discard(bucket.index)

    def copied(self, bucket):
        self._asked[bucket.index] += 1
        if self._asked[bucket.index] >= self.polls:
            self.done.add(bucket.index)
        return bucket.index in self.done

    def wait_copied(self, bucket):
        if bucket.index not in self.done:
            self.events.append(("waited for copy", bucket.index))
            self.done.add(bucket.index)


class RuleWithSlowCopies(ex.AllreduceExchange):
    def __init__(self, comm, net, options, events, polls):
        super().__init__(comm, net, options)
        self.gradients = SlowCopies(events, polls)

    def start_bucket(self, bucket):
        assert bucket.index in self.gradients.done, "a bucket started before its gradients reached the host"
        self.gradients.events.append(("started bucket", bucket.index))
        super().start_bucket(bucket)


@pytest.mark.parametrize("polls", [2, 1000])
@pytest.mark.parametrize("schedule", ["fifo", "priority"])
def test_buckets_copied_asynchronously_start_in_order_once_copied(schedule, polls):
    net = make_net()
    expected = reference_gradients(net)
    events = []
    options = ex.ExchangeOptions(schedule=schedule, bucket_bytes=64, progress="POLL", chunk_bytes=32, credit_bytes=64)
    rule = hooked(net, RuleWithSlowCopies(ScriptedComm(size=4, events=events), net, options, events, polls))
    rule.broadcast_initial()
    net.register_backward_hook(lambda li, ids: (events.append(("hook", li)), rule.gradients_ready(ids)))
    for iteration in range(3):
        events.clear()
        run_iteration(net, rule, iteration, events)
        assert_averaged(net, expected)
        started = [e[1] for e in events if e[0] == "started bucket"]
        assert started == [0, 1, 2, 3]  # every rank starts its collectives in one order
        end = events.index(("backward end", None))
        waited = [e[1] for e in events if e[0] == "waited for copy"]
        if iteration == 0:
            assert all(events.index(("started bucket", b)) > end for b in started)  # the layout is learnt first
        elif polls == 2:
            # Copies done by the next poll: each bucket starts during backward, nothing is waited for.
            assert all(events.index(("started bucket", b)) < end for b in started) and not waited
        else:
            # Copies still running when backward ends: waited for there, one by one, each then started.
            assert waited == [0, 1, 2, 3]
            assert all(end < events.index(("waited for copy", b)) < events.index(("started bucket", b)) for b in started)
    rule.close()
