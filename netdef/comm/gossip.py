"""``gossip``: GoSGD (Blot, Picard, Cord and Thome, "Gossip training for deep learning", 2016, and
"GoSGD: Distributed Optimization for Deep Learning with Gossip Exchange", 2018; Theano-MPI's GOSGD
worker).

Every rank trains its own weights x_i on its own gradients and holds a mixing weight a_i (1/M each
at the start, M ranks). After each update, with probability ``gossip_probability``, it halves a_i
and sends (x_i, a_i) to a peer drawn uniformly from the others; no rank waits for another. A rank
that receives (x_s, a_s) merges::

    x_i = (a_i x_i + a_s x_s) / (a_i + a_s),    a_i = a_i + a_s

so the mixing weights always sum to 1 over the ranks and messages in flight, and so does the
weighted sum of the weights, sum_i a_i x_i (what the tests check). The default probability 0.1
lies within the exchange rates the GoSGD papers study, between their rare exchanges (which leave
the ranks to drift apart) and one exchange per step.

Transport: non-blocking point-to-point (``Communicator.isend``/``irecv``). A receive from any rank
is always posted and tested after every update (receivers poll); a send's buffer is kept until
its request completes. A message is the flat float32 weights followed by the float64 mixing
weight, as bytes.

``settle`` (before a snapshot, at the end of training) is collective: the ranks sum how many
messages each sent to each rank (an allreduce), every rank receives until it has merged all that
were sent to it, and every send completes. A snapshot is then consistent: the mixing weights sum
to 1 and no message is lost at resume. The peer-choice generator (seeded from the run's seed and
the rank) and the mixing weight are part of each rank's state.

What is tested and saved is rank 0's weights (``swap_in_model`` broadcasts them for the test).
"""
from __future__ import annotations

import json
import time

import numpy as np

from .. import backend
from .own_weights import OwnWeightsRule
from .exchange import register_exchange

GOSSIP_TAG = 0x6055
_SEED_DOMAIN = 0x60551B  # keeps the peer-choice stream apart from every other use of the run's seed


@register_exchange("gossip")
class GossipExchange(OwnWeightsRule):
    """GoSGD (module docstring)."""

    model_description = "rank 0's weights"

    def __init__(self, comm, net, options=None, measurements=None, clock=time.perf_counter, seed: int = 0):
        super().__init__(comm, net, options, measurements, clock, seed)
        self.probability = float(np.float32(self.options.gossip_probability))
        self.mixing_weight = 1.0 / comm.size
        self.rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, comm.rank, _SEED_DOMAIN])))
        self._weight_bytes = self.count * 4
        self._inbox = np.empty(self._weight_bytes + 8, dtype=np.uint8)
        self._receive: list = [None]
        self._sends: list[tuple[object, np.ndarray]] = []
        self.sent_to = np.zeros(comm.size, dtype=np.int64)  # since the last settle
        self.merged = 0

    def describe(self) -> str:
        return (f"gossip (GoSGD: each rank trains on its own gradients; after an update, with probability "
                f"{self.probability:g}, it sends its weights and half its mixing weight to a random peer, which "
                f"merges them; non-blocking point-to-point, receivers poll)")

    def broadcast_initial(self) -> None:
        if not self.take_resumed():
            super().broadcast_initial()
            self.mixing_weight = 1.0 / self.comm.size
        self.initial_model()
        if self.comm.size > 1 and self._receive[0] is None:
            self._post_receive()

    # ------------------------------------------------------------------------------ the iteration
    def after_update(self, iteration: int) -> None:
        if self.comm.size == 1:
            return
        start = self.clock()
        self.merge_arrivals()
        self._complete_sends()
        if self.rng.random() < self.probability:
            self.push()
        if self.measurements.current is not None:
            self.measurements.current.exchange_call_s += self.clock() - start

    def push(self) -> None:
        """Send this rank's weights and half its mixing weight to a random other rank."""
        peer = int(self.rng.integers(self.comm.size - 1))
        peer += peer >= self.comm.rank
        self.mixing_weight /= 2
        message = np.empty(self._weight_bytes + 8, dtype=np.uint8)
        message[:self._weight_bytes].view(np.float32)[:] = self.flat_weights()
        message[self._weight_bytes:].view(np.float64)[0] = self.mixing_weight
        self._sends.append((self.comm.isend(message, peer, GOSSIP_TAG), message))
        self.sent_to[peer] += 1

    def merge_arrivals(self) -> None:
        """Merge every message that has arrived (without waiting)."""
        while self._receive[0] is not None and self.comm.test_some(self._receive):
            self._merge_inbox()

    def _post_receive(self) -> None:
        self._receive[0] = self.comm.irecv(self._inbox, None, GOSSIP_TAG)

    def _merge_inbox(self) -> None:
        theirs = self._inbox[:self._weight_bytes].view(np.float32)
        their_weight = float(self._inbox[self._weight_bytes:].view(np.float64)[0])
        total = self.mixing_weight + their_weight
        mine = self.flat_weights()
        merged = (np.float64(self.mixing_weight) * mine + np.float64(their_weight) * theirs) / total
        self.set_flat_weights(merged.astype(np.float32))
        self.mixing_weight = total
        self.merged += 1
        self._post_receive()

    def _complete_sends(self) -> None:
        if self._sends:
            requests = [request for request, _ in self._sends]
            done = set(self.comm.test_some(requests))
            self._sends = [entry for i, entry in enumerate(self._sends) if i not in done]

    # ------------------------------------------------------------------------------ settling
    def settle(self) -> None:
        if self.comm.size == 1:
            return
        counts = self.sent_to.copy()
        self.comm.allreduce(counts)
        expected = int(counts[self.comm.rank])
        while self.merged < expected:
            self.comm.wait_all(self._receive)
            self._merge_inbox()
        self.comm.wait_all([request for request, _ in self._sends])
        self._sends = []
        self.sent_to[:] = 0
        self.merged = 0

    # ------------------------------------------------------------------------------ the model
    def load_model(self) -> None:
        for blob in self.params:
            self.comm.broadcast(blob.data, root=0)

    # ------------------------------------------------------------------------------ resume
    def save_state(self, state) -> None:
        state.gossip.mixing_weight = self.mixing_weight
        state.gossip.rng_state = json.dumps(self.rng.bit_generator.state).encode("ascii")

    def restore_state(self, state) -> None:
        super().restore_state(state)
        if state is None or not state.HasField("gossip"):
            return
        weight = state.gossip.mixing_weight
        if not 0 < weight <= 1:
            raise ValueError(f"gossip mixing weight {weight} in the rank state is not in (0, 1]")
        try:
            backend.set_generator_state(self.rng, json.loads(state.gossip.rng_state.decode("ascii")))
        except ValueError as exc:  # UnicodeDecodeError and JSON's errors too
            raise ValueError(f"the gossip peer-choice generator in the rank state is not a PCG64 state "
                             f"({' '.join(str(exc).split())[:100]})") from None
        self.mixing_weight = float(weight)

    def close(self) -> None:
        # Local: a failing rank closes too, so nothing here waits for another rank.
        self.comm.cancel(self._receive)
