"""Run under ``mpiexec -n 3``: the asynchronous rules' arithmetic on real MPI, on a two-blob "net".

- easgd, one rank at a time (barriers between): each rank's weights and the centre against the
  elastic rule computed by hand in NumPy;
- easgd, every rank at once: sum of every rank's weights + the centre is conserved (the paper's
  symmetric form), whatever the interleaving;
- gossip, every rank pushing with probability 0.5: after ``settle`` the mixing weights sum to 1,
  sum_i a_i x_i is conserved, messages were really merged, and every push was received.

Prints ``rank R ok`` at the end; any failure raises (and ``run_guarded`` aborts the job).
"""
from __future__ import annotations

import types

import numpy as np

from netdef.blob import Blob
from netdef.comm import create_communicator, run_guarded
from netdef.comm.elastic import EasgdExchange
from netdef.comm.exchange import ExchangeOptions
from netdef.comm.gossip import GossipExchange

comm = create_communicator()
rank, size = comm.rank, comm.size


def tiny_net():
    blobs = [Blob(2, 3), Blob(4)]
    for blob in blobs:
        blob.data[...] = 0
    return types.SimpleNamespace(learnable_params=blobs)


def gathered(rule) -> np.ndarray:
    """Every rank's flat weights, by rank."""
    return np.stack([np.frombuffer(b, dtype=np.float32) for b in comm.allgather_bytes(rule.flat_weights().tobytes())])


def start_weights() -> np.ndarray:
    return np.linspace(-1, 1, 10, dtype=np.float32)


def own_start(r: int) -> np.ndarray:
    # Independent directions per rank. Starts on one line (r + 1 times one vector) made the mixed
    # average of ranks 0 and 2 equal rank 1's own start, so a well-mixed rank 1 looked unmixed.
    offset = np.random.default_rng(100 + r).standard_normal(10).astype(np.float32)
    return start_weights() + offset


def check_easgd_by_hand() -> None:
    net = tiny_net()
    rule = EasgdExchange(comm, net, ExchangeOptions(exchange="easgd", tau=1, alpha=0.25))
    if rank == 0:
        rule.set_flat_weights(start_weights())
    rule.broadcast_initial()  # everyone takes rank 0's weights; the centre is set to them
    assert np.array_equal(rule.flat_weights(), start_weights()), "rank 0's weights were not broadcast"
    rule.set_flat_weights(own_start(rank))
    for turn in range(size):
        comm.barrier()
        if rank == turn:
            rule.elastic_step()
        comm.barrier()
    # By hand: the ranks step in rank order, each against the centre the previous ones left.
    centre = start_weights().copy()
    expected = {}
    for r in range(size):
        x = own_start(r)
        step = np.float32(0.25) * (x - centre)
        expected[r] = x - step
        centre = centre + step
    np.testing.assert_allclose(rule.flat_weights(), expected[rank], rtol=1e-6, atol=1e-7)
    rule.swap_in_model()
    np.testing.assert_allclose(rule.flat_weights(), centre, rtol=1e-6, atol=1e-7)
    rule.swap_out_model()
    np.testing.assert_allclose(rule.flat_weights(), expected[rank], rtol=1e-6, atol=1e-7)
    assert not np.allclose(centre, start_weights()), "the centre did not move"


def check_easgd_conserves_the_sum() -> None:
    net = tiny_net()
    rule = EasgdExchange(comm, net, ExchangeOptions(exchange="easgd", tau=3))
    assert abs(rule.alpha - np.float32(0.9) / size) < 1e-7, rule.alpha  # the paper's alpha = beta / p
    rule.broadcast_initial()  # the centre: rank 0's initial weights, zeros
    rule.set_flat_weights(own_start(rank) * (rank + 2))
    before = gathered(rule).sum(axis=0)
    for iteration in range(12):
        rule.begin_iteration(iteration)
        assert rule.mixes_after_update(iteration) == ((iteration + 1) % 3 == 0), iteration
        rule.after_update(iteration)  # steps at iterations 2, 5, 8, 11, the ranks at once
    rule.settle()
    rule.swap_in_model()
    centre = rule.flat_weights()
    rule.swap_out_model()
    after = gathered(rule).sum(axis=0) + centre
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    assert np.abs(centre).max() > 0.1, centre  # the centre moved


def check_gossip_conservation() -> None:
    net = tiny_net()
    rule = GossipExchange(comm, net, ExchangeOptions(exchange="gossip", gossip_probability=0.5), seed=7)
    rule.broadcast_initial()
    rule.set_flat_weights(own_start(rank))
    weighted_before = np.sum([own_start(r) for r in range(size)], axis=0) / size
    pushes = 0
    for iteration in range(40):
        rule.begin_iteration(iteration)
        sent = int(rule.sent_to.sum())
        rule.after_update(iteration)
        pushes += int(rule.sent_to.sum()) - sent
    sent_here = rule.sent_to.copy()
    rule.settle()
    weights = comm.allgather_bytes(np.float64(rule.mixing_weight).tobytes())
    mixing = np.array([np.frombuffer(w, dtype=np.float64)[0] for w in weights])
    assert abs(mixing.sum() - 1) < 1e-12, mixing
    weighted_after = np.sum(mixing[:, None] * gathered(rule), axis=0)
    np.testing.assert_allclose(weighted_after, weighted_before, rtol=1e-5, atol=1e-6)
    # Every push was received and merged somewhere, and the ranks did mix.
    counts = np.zeros(size, dtype=np.int64)
    counts[:] = sent_here
    comm.allreduce(counts)
    total_pushes = np.array([pushes], dtype=np.int64)
    comm.allreduce(total_pushes)
    assert counts.sum() == total_pushes[0] > 10, (counts, total_pushes)
    assert not np.allclose(rule.flat_weights(), own_start(rank)), ("no message changed this rank's weights", rule.merged)
    rule.close()


def main() -> None:
    check_easgd_by_hand()
    check_easgd_conserves_the_sum()
    check_gossip_conservation()
    comm.barrier()
    print(f"rank {rank} ok", flush=True)


run_guarded(comm, main, debug=True)  # a failure names its line
