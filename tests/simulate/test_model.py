"""The scaling model (netdef.simulate) on hand-computed cases."""
import dataclasses
import math

import pytest

from netdef.simulate import Network, RuleOptions, ScheduleOptions, predict
from netdef.simulate.iteration import Progress, simulate_synchronous
from netdef.simulate.profile import LayerTimes, ParamInfo, Profile
from netdef.comm.exchange import registered_exchanges
from netdef.simulate.rules import RULES, iteration_times, progress_of

MB = 1 << 20


def profile_of(layers, param_bytes):
    """layers: (forward_s, backward_s, param ids) in forward order; each parameter is final at its layer."""
    return Profile(tuple(LayerTimes(f"l{i}", "T", f, b, tuple(ids), tuple(ids)) for i, (f, b, ids) in enumerate(layers)),
                   tuple(ParamInfo(f"p{i}", (n // 4,), n) for i, n in enumerate(param_bytes)))


def test_ring_formula_flat_and_shared():
    net = Network(bytes_per_s=1e9, latency_s=1e-5)
    for p in (4, 8, 64):
        cost = net.ring_allreduce(100e6, p)
        assert cost.latency_s == pytest.approx(2 * (p - 1) * 1e-5)
        assert cost.transfer_s == pytest.approx(2 * (p - 1) / p * 100e6 / 1e9)
    shared = Network(bytes_per_s=1e9, latency_s=1e-5, topology="shared")
    assert shared.ring_allreduce(100e6, 3).transfer_s == pytest.approx(4 * 100e6 / 1e9)
    # Rabenseifner's moves the ring's bytes in 2 log2 p steps; tiny messages take recursive doubling.
    halving = net.rabenseifner_allreduce(100e6, 8)
    assert halving.transfer_s == pytest.approx(2 * 7 / 8 * 100e6 / 1e9)
    assert halving.latency_s == pytest.approx(2 * 3 * 1e-5)
    assert net.allreduce(100e6, 8) == halving
    assert net.allreduce(8, 8) == net.recursive_doubling_allreduce(8, 8)
    assert net.allreduce(8, 8).latency_s == pytest.approx(3 * 1e-5)


def test_nodes_use_the_intra_node_link_inside_a_node():
    net = Network(bytes_per_s=1e9, latency_s=1e-5, topology="nodes", ranks_per_node=4, intra_bytes_per_s=1e11,
                  intra_latency_s=1e-6)
    inside, across = net.ring_allreduce(100e6, 4), net.ring_allreduce(100e6, 8)
    assert inside.transfer_s == pytest.approx(2 * 3 / 4 * 100e6 / 1e11)
    assert across.transfer_s == pytest.approx(2 * 7 / 8 * 100e6 / 1e9)
    # Halving's one round across nodes moves n/8 per rank, 4 ranks on a node's link, twice.
    assert net.rabenseifner_allreduce(100e6, 8).transfer_s == pytest.approx(
        2 * (100e6 / 2 / 1e11 + 100e6 / 4 / 1e11 + 4 * 100e6 / 8 / 1e9))
    # Recursive doubling's last round would send 4 ranks' whole vectors through each node's link.
    assert net.recursive_doubling_allreduce(100e6, 8).transfer_s == pytest.approx(2 * 100e6 / 1e11 + 4 * 100e6 / 1e9)


def test_one_bucket_after_backward_is_compute_plus_one_allreduce_plus_update():
    profile = profile_of([(0.010, 0.020, [0])], [MB])
    net = Network(bytes_per_s=1e8, latency_s=1e-4)
    cost = lambda n: net.allreduce(n, 2)
    options = ScheduleOptions(schedule="fifo", overlap=False, bucket_bytes=4 * MB)
    update = 1e-9
    times = simulate_synchronous(profile, cost, options, MB, MB, update_s_per_byte=update)
    # 2 ranks: one exchange of the whole bucket, alpha + n / B.
    assert times.iteration_s == pytest.approx(0.010 + 0.020 + 1e-4 + MB / 1e8 + MB * update)
    assert times.compute_s == pytest.approx(0.030 + MB * update)


def test_overlap_hides_the_exchange_when_backward_is_longer():
    # The top layer's 4 MB leave first and take 40 ms; the bottom layer's backward is 100 ms.
    profile = profile_of([(0.010, 0.100, [0]), (0.001, 0.001, [1])], [1024, 4 * MB])
    net = Network(bytes_per_s=1e8 * 2, latency_s=1e-5)   # flat, 2 ranks: n / B = 21 ms for 4 MiB
    # The link alone: nothing polls (poll 0); the agreement at each iteration's end is added.
    hidden = iteration_times(profile, net, 2, RuleOptions(update_s_per_byte=0.0, schedule=ScheduleOptions(poll_s=0)))
    exposed = iteration_times(profile, net, 2, RuleOptions(
        update_s_per_byte=0.0, schedule=ScheduleOptions(schedule="fifo", overlap=False, poll_s=0)))
    small = net.allreduce(1024, 2).total_s
    agreement = net.allreduce(8, 2).total_s
    assert hidden.compute_s == pytest.approx(0.112)
    # What stays exposed is the first layer's small bucket, ready only when backward ends; the
    # agreement (shorter) runs while it is in flight.
    assert agreement < small
    assert hidden.iteration_s - hidden.compute_s == pytest.approx(small, rel=1e-6, abs=1e-9)
    # After backward both leave at once, the large one first; their latencies overlap.
    assert exposed.iteration_s == pytest.approx(0.112 + net.allreduce(4 * MB, 2).transfer_s + small + agreement,
                                                rel=1e-6)


def test_every_registered_exchange_rule_is_simulated():
    """The simulator's rules are the exchange registry's names (a new built-in rule needs a model)."""
    assert list(RULES) == registered_exchanges()


def test_one_worker_has_efficiency_one_and_no_exposed_exchange():
    profile = profile_of([(0.01, 0.02, [0]), (0.01, 0.02, [1])], [MB, 8 * MB])
    for rule in RULES:
        (one,) = predict(profile, Network(1e9, 1e-5), [1], RuleOptions(rule=rule))
        assert one.efficiency == 1.0 and one.speedup == 1.0 and one.exposed_s == 0.0


@pytest.mark.parametrize("rule", RULES)
def test_faster_links_never_predict_slower_iterations(rule):
    profile = profile_of([(0.004, 0.008, [0, 1]), (0.002, 0.004, [2]), (0.001, 0.002, [3])],
                         [64 * 1024, 1024, 16 * MB, 2 * MB])
    for topology in ("flat", "shared"):
        options = RuleOptions(rule=rule, gossip_probability=0.5)
        times = [iteration_times(profile, Network(rate, 1e-5, topology), 8, options).iteration_s
                 for rate in (1e7, 1e8, 1e9, 1e10, 1e11)]
        assert all(a >= b - 1e-12 for a, b in zip(times, times[1:])), (topology, times)
        assert times[0] > times[-1]


def test_priority_sends_the_first_layers_gradients_first():
    # The first layer's bucket (needed first by the next forward) is ready last; with priorities and
    # chunks it overtakes the rest of the large top bucket, so the next forward starts earlier.
    profile = profile_of([(0.001, 0.005, [0]), (0.050, 0.001, [1])], [MB, 32 * MB])
    net = Network(1e8, 1e-5)
    fifo = iteration_times(profile, net, 2, RuleOptions(update_s_per_byte=0.0,
                                                        schedule=ScheduleOptions(schedule="fifo")))
    priority = iteration_times(profile, net, 2, RuleOptions(update_s_per_byte=0.0))
    assert priority.iteration_s < fifo.iteration_s


def test_elastic_rules_amortise_their_exchange_over_tau():
    profile = profile_of([(0.01, 0.02, [0])], [8 * MB])
    net = Network(1e9, 1e-5)
    every = iteration_times(profile, net, 4, RuleOptions(rule="easgd", tau=1, update_s_per_byte=0.0))
    fourth = iteration_times(profile, net, 4, RuleOptions(rule="easgd", tau=4, update_s_per_byte=0.0))
    step = net.one_sided_exchange(8 * MB, 4).total_s
    agreement = net.allreduce(8, 4).total_s   # every iteration, whatever the rule
    assert every.iteration_s == pytest.approx(0.03 + step + agreement)
    assert fourth.iteration_s == pytest.approx(0.03 + step / 4 + agreement)
    assert math.isclose(step, 2 * (1e-5 + 3 / 4 * 8 * MB / 1e9))


def test_fp16_sends_half_of_multicolor_and_one_hybrid_group_is_allreduce():
    profile = profile_of([(0.001, 0.002, [0])], [32 * MB])   # communication-bound
    net = Network(1e9, 1e-5)
    multicolor = iteration_times(profile, net, 4, RuleOptions(rule="multicolor", update_s_per_byte=0.0))
    fp16 = iteration_times(profile, net, 4, RuleOptions(rule="fp16", update_s_per_byte=0.0))
    assert fp16.exposed_s == pytest.approx(multicolor.exposed_s / 2, rel=0.05)
    allreduce = iteration_times(profile, net, 4, RuleOptions(update_s_per_byte=0.0))
    one_group = iteration_times(profile, net, 4, RuleOptions(rule="hybrid", group_size=4, update_s_per_byte=0.0))
    assert one_group.iteration_s == pytest.approx(allreduce.iteration_s)


# ------------------------------------------------------------------------------ fixed per-iteration costs
def _two_layers():
    """A 4 MB top layer whose bucket is ready 12 ms into the iteration, above a 100 ms backward whose
    1 KB bucket is ready when backward ends (the iteration's compute: 112 ms)."""
    return profile_of([(0.010, 0.100, [0]), (0.001, 0.001, [1])], [1024, 4 * MB])


def test_deferred_progress_moves_the_exchange_only_once_the_training_thread_blocks():
    profile, net = _two_layers(), Network(bytes_per_s=2e8, latency_s=1e-4)
    fifo = dict(schedule="fifo", poll_s=0)
    thread = iteration_times(profile, net, 2, RuleOptions(update_s_per_byte=0.0, schedule=ScheduleOptions(**fifo)))
    deferred = iteration_times(profile, net, 2, RuleOptions(update_s_per_byte=0.0, schedule=ScheduleOptions(
        progress="deferred", **fifo)))
    agreement = 1e-4 + 8 / 2e8                       # 2 ranks: one round of recursive doubling
    small = 1e-4 + 1024 / 2e8
    # With a thread the 4 MB (21 ms) move during the 100 ms backward below them; only the last
    # bucket is exposed. Deferred, both wait for the end of backward and go one after the other.
    assert thread.iteration_s == pytest.approx(0.112 + small + agreement, rel=1e-9)
    assert deferred.iteration_s == pytest.approx(0.112 + 4 * MB / 2e8 + small + agreement, rel=1e-9)


def test_deferred_progress_stands_still_while_the_next_forward_computes():
    # A 50 ms layer without parameters, then a 10 ms layer whose 4 MB bucket (21 ms) is the only one.
    profile = profile_of([(0.050, 0.001, []), (0.010, 0.001, [0])], [4 * MB])
    net = Network(bytes_per_s=2e8, latency_s=1e-4)
    agreement = 1e-4 + 8 / 2e8
    thread, deferred = (iteration_times(profile, net, 2, RuleOptions(update_s_per_byte=0.0, schedule=ScheduleOptions(
        progress=progress, poll_s=0, chunk_bytes=8 * MB, credit_bytes=8 * MB))) for progress in ("thread", "deferred"))
    # With a thread the bucket moves during the next forward's 50 ms; deferred, it moves during the
    # agreement and then waits, whole, until the training thread waits for it before the 10 ms layer.
    assert thread.iteration_s == pytest.approx(0.062 + agreement, rel=1e-9)
    assert deferred.iteration_s == pytest.approx(0.062 + 1e-4 + 4 * MB / 2e8, rel=1e-9)


def test_a_polled_collective_takes_a_poll_per_round_and_one_more():
    assert Progress.polls(1) == 2 and Progress.polls(3) == 4 and Progress.polls(0) == 0
    for workers, rounds in ((2, 1), (3, 2), (8, 3)):
        progress = progress_of(ScheduleOptions(poll_s=0.002), workers)
        assert progress.polled_s == pytest.approx((rounds + 1) * 0.002)
        assert progress.urgent_polled_s == pytest.approx((rounds + 1) * 0.0002)   # 0.2 ms while waiting
    assert progress_of(ScheduleOptions(progress="deferred"), 8).mode == "deferred"


def test_a_measured_polled_collective_replaces_the_rounds_polls_at_every_worker_count():
    for workers in (2, 3, 64):
        progress = progress_of(ScheduleOptions(poll_s=0.002, polled_s=0.0065), workers)
        assert progress.mode == "thread" and progress.polled_s == pytest.approx(0.0065)
        assert progress.urgent_polled_s == pytest.approx(0.00065)   # tests ten times as often while waiting
    assert progress_of(ScheduleOptions(poll_s=0.002, polled_s=0.0065), 1).polled_s == 0
    assert progress_of(ScheduleOptions(progress="deferred", polled_s=0.0065), 2).mode == "deferred"


def test_a_slower_polled_collective_lengthens_an_iteration_whose_last_bucket_is_waited_for():
    profile, net = _two_layers(), Network(bytes_per_s=2e8, latency_s=1e-6)

    def iteration(polled_s):
        return iteration_times(profile, net, 2, RuleOptions(update_s_per_byte=0.0, schedule=ScheduleOptions(
            schedule="fifo", poll_s=0.002, polled_s=polled_s))).iteration_s

    # The training thread waits for the last bucket: its urgent tests see it a tenth of the
    # measured polled time after it started, instead of two urgent polls.
    assert iteration(0.008) - iteration(0.0) == pytest.approx(0.0008 - 2 * 0.0002, rel=1e-6)


def test_the_poll_delays_a_bucket_the_training_thread_waits_for_by_its_urgent_tests():
    profile, net = _two_layers(), Network(bytes_per_s=2e8, latency_s=1e-6)
    polled = iteration_times(profile, net, 2, RuleOptions(update_s_per_byte=0.0, schedule=ScheduleOptions(
        schedule="fifo", poll_s=0.002)))
    # The last bucket arrives 6 us after backward, but the thread's tests (every 0.2 ms while the
    # training thread waits) see it two tests after it started; the agreement follows.
    assert polled.iteration_s == pytest.approx(0.112 + 2 * 0.0002 + 1e-6 + 8 / 2e8, rel=1e-9)


@pytest.mark.parametrize("rule", ["allreduce", "gossip"])
def test_sync_is_paid_once_per_iteration_by_every_rule_and_not_by_one_worker(rule):
    profile = profile_of([(0.01, 0.02, [0])], [1024])     # nothing to hide: compute-bound
    net = Network(1e9, 1e-5)
    base = RuleOptions(rule=rule, update_s_per_byte=0.0, gossip_probability=0.0)
    without = iteration_times(profile, net, 4, base)
    with_sync = iteration_times(profile, net, 4, dataclasses.replace(base, sync_s=0.005))
    assert with_sync.iteration_s == pytest.approx(without.iteration_s + 0.005)
    (one,) = predict(profile, net, [1], dataclasses.replace(base, sync_s=0.005))
    assert one.iteration_s == pytest.approx(0.03)
