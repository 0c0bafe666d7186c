"""Elastic averaging: ``easgd`` and ``hybrid``, with the centre variable in MPI one-sided windows.

``easgd`` is asynchronous elastic averaging SGD (Zhang, Choromanska and LeCun, "Deep learning with
Elastic Averaging SGD", NIPS 2015, Algorithm 1; Theano-MPI's and MXNET-MPI's EASGD). No gradient is
averaged: every rank trains its own weights x_i on its own gradients, and every ``tau`` updates moves
elastically toward a centre variable x~ while the centre moves toward it by the same amount::

    d    = alpha * (x_i - x~)
    x_i -= d
    x~  += d

The paper's symmetric form: x_i + x~ is the same before and after a step, so the sum of every
rank's weights and the centre changes only through the gradient updates. Defaults: the paper
links the moving rate to the number p of workers, alpha = beta / p, with beta = 0.9 (its
stability analysis and experiments keep beta fixed as p grows); ``alpha`` sets the rate itself.
The communication period ``tau`` defaults to 10 (the paper's ImageNet runs; its CIFAR runs try 1
to 64; larger tau lets the ranks explore further between steps).

The paper keeps x~ on a parameter server. Here it is sharded over the ranks: rank r holds a
contiguous part of the flat parameter vector in an MPI window (``Communicator.window``), and a
rank's elastic step reads and adds to every shard one-sidedly (``Get_accumulate``/``Accumulate``
under shared passive-target locks, one short epoch per access), shard by shard starting with its
own, so no rank waits for another to take part: a slow rank never blocks a fast one. It is the
MPI counterpart of CaffeGPI's one-sided GPI-2 writes. Reads and additions are atomic per element,
so concurrent steps of several ranks interleave but lose nothing: the sum is conserved exactly
(up to float32 rounding) whatever the order, while each rank's result depends on which steps came
before its read (as in the paper's asynchronous algorithm).

``hybrid`` is MXNET-MPI's model (Mamidala et al., "MXNET-MPI: Embedding MPI parallelism in
Parameter Server Task Model", 2018): the ranks split into groups of ``group_size`` consecutive
ranks (``Communicator.split``); each group trains synchronously (the rule is an ``AllreduceExchange``
whose communicator is the group's, buckets, overlap and schedule as configured), and the groups
average elastically through the centre (it is also an ``ElasticRule``, over every rank). The
group's rank 0 makes the elastic step for the group and broadcasts the result inside it, so the
group's ranks keep identical weights (were every rank to step on its own, each would read a
different centre and the group would drift apart, and the centre would feel the group
``group_size`` times). alpha defaults to beta / number of groups.
The centre is sharded over every rank, leaders and not (each shard is passive memory).

What is tested and saved is the centre (``swap_in_model``, after a barrier so that every rank's
last step has reached it and every rank reads the same centre): the snapshot's model file holds
it, each rank's own weights and history go into its rank state (``own_weights.py``).
"""
from __future__ import annotations

import logging
import time

import numpy as np

from .exchange import AllreduceExchange, ExchangeOptions, register_exchange
from .own_weights import OwnWeightsRule

logger = logging.getLogger("netdef")


class ElasticCentre:
    """The centre variable: a flat float32 vector of ``count`` elements sharded over the ranks of
    ``comm`` (rank r holds elements ``bounds[r] .. bounds[r + 1]``)."""

    def __init__(self, comm, count: int):
        self.comm = comm
        self.count = int(count)
        self.bounds = [self.count * r // comm.size for r in range(comm.size + 1)]
        self.window = comm.window(self.bounds[comm.rank + 1] - self.bounds[comm.rank], np.float32)

    def _shards(self):
        """(owner, start, end) of every non-empty shard, this rank's own first, then the next ranks'
        (so that ranks stepping at once start on different shards)."""
        for k in range(self.comm.size):
            owner = (self.comm.rank + k) % self.comm.size
            start, end = self.bounds[owner], self.bounds[owner + 1]
            if end > start:
                yield owner, start, end

    def set(self, flat: np.ndarray) -> None:
        """Collective: every rank writes its own shard of ``flat``, then waits for the others."""
        start, end = self.bounds[self.comm.rank], self.bounds[self.comm.rank + 1]
        if end > start:
            self.window.write(self.comm.rank, 0, np.ascontiguousarray(flat[start:end], dtype=np.float32))
        self.comm.barrier()

    def read(self) -> np.ndarray:
        """The whole centre, read shard by shard."""
        out = np.empty(self.count, dtype=np.float32)
        for owner, start, end in self._shards():
            self.window.read(owner, 0, out[start:end])
        return out

    def move(self, weights: np.ndarray, alpha: float) -> np.ndarray:
        """One elastic step of ``weights`` (flat float32, changed in place and returned) with the
        centre, shard by shard: read the shard, d = alpha (x - x~), x -= d, add d to the shard."""
        alpha = np.float32(alpha)
        centre = np.empty(self.count, dtype=np.float32)
        for owner, start, end in self._shards():
            shard = centre[start:end]
            self.window.read(owner, 0, shard)
            step = alpha * (weights[start:end] - shard)
            weights[start:end] -= step
            self.window.add(owner, 0, step)
        return weights


def _moving_rate(options, participants: int, who: str) -> tuple[float, str]:
    """(alpha, how it was chosen) from the options (checked by ``options.check``)."""
    if options.alpha:
        return float(options.alpha), "as set"
    beta = float(np.float32(options.beta))
    return beta / participants, f"beta {beta:.6g} / {participants} {who}"


class ElasticRule(OwnWeightsRule):
    """What easgd and hybrid share: the centre over every rank (``self.world``), the moving rate, a
    step every ``tau`` updates, the centre as the model. Subclasses give ``participants`` (who moves
    toward the centre) and ``elastic_step``."""

    model_description = "the centre variable"
    participants_name = "ranks"

    def __init__(self, comm, net, options=None, measurements=None, clock=time.perf_counter, seed: int = 0):
        super().__init__(comm, net, options, measurements, clock, seed)
        self.world = comm  # every rank; self.comm is those whose gradients are combined
        self.alpha, self.alpha_from = _moving_rate(self.options, self.participants(), self.participants_name)
        self.centre = ElasticCentre(comm, self.count)

    def participants(self) -> int:
        return self.world.size

    def elastic_step(self) -> None:
        raise NotImplementedError

    def elastic_text(self) -> str:
        return (f"tau {self.options.tau}, alpha {self.alpha:.6g} ({self.alpha_from}), the centre variable of "
                f"{self.count} floats sharded over {self.world.size} rank(s) in MPI windows, read and moved "
                f"one-sidedly")

    def mixes_after_update(self, iteration: int) -> bool:
        return (iteration + 1) % self.options.tau == 0

    def after_update(self, iteration: int) -> None:
        if self.mixes_after_update(iteration):
            start = self.clock()
            self.elastic_step()
            if self.measurements.current is not None:
                self.measurements.current.exchange_call_s += self.clock() - start

    def settle(self) -> None:
        # Each access completes at its unlock: once every rank is here, every step has reached the centre.
        self.world.barrier()

    def load_model(self) -> None:
        self.world.barrier()
        self.set_flat_weights(self.centre.read())


@register_exchange("easgd")
class EasgdExchange(ElasticRule):
    """Asynchronous elastic averaging SGD (module docstring): no gradient exchange; every ``tau``
    updates an elastic step with the sharded centre."""

    def describe(self) -> str:
        return f"easgd (each rank trains on its own gradients; {self.elastic_text()})"

    def broadcast_initial(self) -> None:
        if not self.take_resumed():
            super().broadcast_initial()
        self.centre.set(self.initial_model())

    def elastic_step(self) -> None:
        """Move this rank's weights and the centre toward each other (one-sided: no other rank waits)."""
        self.set_flat_weights(self.centre.move(self.flat_weights(), self.alpha))


@register_exchange("hybrid")
class HybridExchange(ElasticRule, AllreduceExchange):
    """Synchronous allreduce inside groups of ``group_size`` ranks (the AllreduceExchange it is, over
    its group's communicator), elastic averaging between the groups through the centre (the
    ElasticRule it is, over every rank); see the module docstring."""

    participants_name = "groups"

    def __init__(self, comm, net, options=None, measurements=None, clock=time.perf_counter, seed: int = 0):
        group_size = int((options or ExchangeOptions()).group_size)
        if not 1 <= group_size <= comm.size:
            raise ValueError(f"netdef_distributed.group_size must lie between 1 and the number of ranks "
                             f"({comm.size}), got {group_size}")
        self.group_size = group_size
        self.group_index = comm.rank // group_size
        self.groups = -(-comm.size // group_size)
        super().__init__(comm, net, options, measurements, clock, seed)
        # The step's broadcast gets a communicator of its own: the allreduce may still have
        # collectives outstanding on the group's communicator, started in an order only it knows.
        self.group = comm.split(self.group_index)

    def gradient_communicator(self, comm):
        return comm.split(self.group_index)

    def participants(self) -> int:
        return self.groups

    def describe(self) -> str:
        sizes = sorted({min(self.group_size, self.world.size - g * self.group_size) for g in range(self.groups)})
        return (f"hybrid ({self.groups} group(s) of {'/'.join(map(str, sizes))} consecutive ranks; inside a group "
                f"allreduce ({self.schedule_text()}); between the groups elastic averaging, each group's rank 0 "
                f"stepping for its group: {self.elastic_text()})")

    def broadcast_initial(self) -> None:
        if not self.take_resumed():
            for blob in self.params:  # rank 0's weights everywhere
                self.world.broadcast(blob.data, root=0)
        super().broadcast_initial()  # the group's allreduce: the same broadcast inside it, the schedule's sizes
        self.centre.set(self.initial_model())

    def elastic_step(self) -> None:
        """The group's rank 0 steps with the centre; the group takes its result (collective in the group)."""
        weights = self.flat_weights()
        if self.group.rank == 0:
            self.centre.move(weights, self.alpha)
        self.group.broadcast(weights, root=0)
        self.set_flat_weights(weights)
