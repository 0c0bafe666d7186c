"""The network of the scaling model and what each collective costs on it (the alpha-beta model).

A message of n bytes over one link costs ``latency_s + n / bytes_per_s``. Three topologies:

- ``flat``: every rank has its own full-duplex link of ``bytes_per_s`` to a non-blocking switch
  (a cluster of one GPU or CPU per node, or the bisection a fat tree gives).
- ``nodes``: ranks in nodes of ``ranks_per_node``; inside a node they talk over the intra-node link
  (``intra_latency_s``, ``intra_bytes_per_s``: NVLink, PCIe, shared memory), and each node has one
  full-duplex link of ``bytes_per_s`` to the switch, which its ranks share.
- ``shared``: one medium of ``bytes_per_s`` carries every rank's traffic (all bytes sent by all
  ranks queue on it). This is the emulated link of benchmarks/emulated_network.sh: every rank's TCP
  traffic crosses the one rate-limited loopback (the model and a measured allreduce through it agree:
  benchmarks/README.md, "The figures behind the solver's, the exchange's and the data's choices";
  ../shared/design/EMULATED-NETWORK.md).

A collective's cost is a ``Cost``: ``latency_s`` (waiting that does not occupy the link; chunks in
flight together overlap it) and ``transfer_s`` (the bottleneck link busy, which back-to-back chunks
add up).

Allreduce, as MPI libraries choose by size: the cheapest of the ring (reduce-scatter then
allgather: 2(p-1) steps, each rank sends 2(p-1)/p n bytes), recursive doubling (ceil(log2 p)
rounds, each rank sends n bytes to a partner at distance 2^j) and Rabenseifner's (recursive
halving then doubling: 2 ceil(log2 p) rounds, 2(p-1)/p n bytes); in a round across nodes all of a
node's ranks share its link. Across nodes the ring's bottleneck is a node's link, which one ring
edge in and one out cross (NCCL's rings are laid out that way).

Multicolor (IBM's multi-colour allreduce): the vector split into k colours, each reduced up and
broadcast down a binary spanning tree with its own root, all at once (the trees are the ranks
rotated by p/k). The model counts the bytes every rank (``flat``), every node's link (``nodes``) or
the medium (``shared``) carries over all trees, pipelined: the busiest one sets ``transfer_s``, the
trees' depth (up and down) the latency.
"""
from __future__ import annotations

import dataclasses
import math
import re

TOPOLOGIES = ("flat", "nodes", "shared")
ALGORITHMS = ("auto", "ring", "recursive_doubling", "rabenseifner")


class NetworkError(ValueError):
    """A network description that makes no sense; the message names the option."""


@dataclasses.dataclass(frozen=True)
class Cost:
    latency_s: float
    transfer_s: float

    @property
    def total_s(self) -> float:
        return self.latency_s + self.transfer_s

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.latency_s + other.latency_s, self.transfer_s + other.transfer_s)


@dataclasses.dataclass(frozen=True)
class Network:
    bytes_per_s: float
    latency_s: float
    topology: str = "flat"
    ranks_per_node: int = 1
    intra_bytes_per_s: float = 0.0
    intra_latency_s: float = 0.0
    algorithm: str = "auto"       # the allreduce: "auto" (the cheapest, as MPI chooses) or one of them

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS:
            raise NetworkError(f"--allreduce_algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        if self.topology not in TOPOLOGIES:
            raise NetworkError(f"--topology must be one of {', '.join(TOPOLOGIES)}, got {self.topology!r}")
        if not self.bytes_per_s > 0:
            raise NetworkError(f"--bandwidth must be positive, got {self.bytes_per_s}")
        if not self.latency_s >= 0:
            raise NetworkError(f"--latency must be >= 0, got {self.latency_s}")
        if self.topology == "nodes":
            if self.ranks_per_node < 1:
                raise NetworkError(f"--ranks_per_node must be at least 1, got {self.ranks_per_node}")
            if not self.intra_bytes_per_s > 0:
                raise NetworkError("--topology nodes needs --intra_bandwidth")

    # ------------------------------------------------------------------------------ links
    def _node_count(self, ranks: int) -> int:
        return -(-ranks // self.ranks_per_node) if self.topology == "nodes" else ranks

    def _crosses(self, a: int, b: int) -> bool:
        """Whether ranks a and b talk over the slow link (not inside one node)."""
        if self.topology != "nodes":
            return True
        return a // self.ranks_per_node != b // self.ranks_per_node

    def _link(self, ranks: int) -> tuple[float, float]:
        """(latency, bytes/s) of a ring edge's slowest hop for ``ranks`` ranks."""
        if self.topology == "nodes" and ranks <= self.ranks_per_node:
            return self.intra_latency_s, self.intra_bytes_per_s
        return self.latency_s, self.bytes_per_s

    def point_to_point(self, nbytes: float, crosses: bool = True) -> Cost:
        if self.topology == "nodes" and not crosses:
            return Cost(self.intra_latency_s, nbytes / self.intra_bytes_per_s)
        return Cost(self.latency_s, nbytes / self.bytes_per_s)

    # ------------------------------------------------------------------------------ collectives
    def allreduce(self, nbytes: float, ranks: int) -> Cost:
        """An allreduce of ``nbytes`` over ``ranks`` ranks: the cheaper algorithm (module docstring)."""
        if ranks <= 1 or nbytes <= 0:
            return Cost(0.0, 0.0)
        algorithms = {"ring": self.ring_allreduce, "recursive_doubling": self.recursive_doubling_allreduce,
                      "rabenseifner": self.rabenseifner_allreduce}
        if self.algorithm != "auto":
            return algorithms[self.algorithm](nbytes, ranks)
        return min((cost(nbytes, ranks) for cost in algorithms.values()), key=lambda c: c.total_s)

    def ring_allreduce(self, nbytes: float, ranks: int) -> Cost:
        steps = 2 * (ranks - 1)
        latency, rate = self._link(ranks)
        if self.topology == "shared":
            return Cost(steps * latency, steps * nbytes / rate)   # every rank's bytes on the one medium
        return Cost(steps * latency, steps / ranks * nbytes / rate)

    def recursive_doubling_allreduce(self, nbytes: float, ranks: int) -> Cost:
        rounds = math.ceil(math.log2(ranks))
        cost = Cost(0.0, 0.0)
        for j in range(rounds):
            if self.topology == "shared":
                cost += Cost(self.latency_s, ranks * nbytes / self.bytes_per_s)
            elif self._crosses(0, min(2 ** j, ranks - 1)) and self.topology == "nodes":
                # Every rank of a node sends to its partner in another node over the node's one link.
                cost += Cost(self.latency_s, min(self.ranks_per_node, ranks) * nbytes / self.bytes_per_s)
            else:
                cost += self.point_to_point(nbytes, crosses=self._crosses(0, min(2 ** j, ranks - 1)))
        return cost

    def rabenseifner_allreduce(self, nbytes: float, ranks: int) -> Cost:
        """Reduce-scatter by recursive halving, then allgather by recursive doubling: round j
        exchanges n / 2^(j+1) bytes with the partner at distance 2^j, twice."""
        cost = Cost(0.0, 0.0)
        for j in range(math.ceil(math.log2(ranks))):
            part = nbytes / 2 ** (j + 1)
            if self.topology == "shared":
                cost += Cost(self.latency_s, ranks * part / self.bytes_per_s)
            elif self._crosses(0, min(2 ** j, ranks - 1)) and self.topology == "nodes":
                cost += Cost(self.latency_s, min(self.ranks_per_node, ranks) * part / self.bytes_per_s)
            else:
                cost += self.point_to_point(part, crosses=self._crosses(0, min(2 ** j, ranks - 1)))
        return Cost(2 * cost.latency_s, 2 * cost.transfer_s)

    def multicolor_allreduce(self, nbytes: float, ranks: int, colors: int) -> Cost:
        """k = ``colors`` rotated binary trees, reduce then broadcast, all at once (module docstring)."""
        if ranks <= 1 or nbytes <= 0:
            return Cost(0.0, 0.0)
        colors = max(1, min(colors, ranks))
        part = nbytes / colors
        nodes = self._node_count(ranks)
        sent, received = [0.0] * ranks, [0.0] * ranks          # per rank (flat), slow link
        node_out, node_in = [0.0] * nodes, [0.0] * nodes        # per node link (nodes)
        intra = [0.0] * ranks                                   # per rank on the intra-node link
        medium = 0.0                                            # everything (shared)
        depth = 0
        for color in range(colors):
            shift = color * ranks // colors
            order = [(position + shift) % ranks for position in range(ranks)]  # heap position -> rank
            depth = max(depth, int(math.log2(ranks)) + 1)
            for position in range(1, ranks):
                child, parent = order[position], order[(position - 1) // 2]
                # Each tree edge carries the part up (reduce) and back down (broadcast).
                medium += 2 * part
                if self._crosses(child, parent):
                    for a, b in ((child, parent), (parent, child)):
                        sent[a] += part
                        received[b] += part
                        if self.topology == "nodes":
                            node_out[a // self.ranks_per_node] += part
                            node_in[b // self.ranks_per_node] += part
                else:
                    intra[child] += 2 * part
                    intra[parent] += 2 * part
        hops = 2 * (depth - 1)
        if self.topology == "shared":
            return Cost(hops * self.latency_s, medium / self.bytes_per_s)
        if self.topology == "nodes":
            busiest = max(max(node_out), max(node_in)) / self.bytes_per_s
            busiest = max(busiest, max(intra) / 2 / self.intra_bytes_per_s)
            latency = self.latency_s if nodes > 1 else self.intra_latency_s
            return Cost(hops * latency, busiest)
        return Cost(hops * self.latency_s, max(max(sent), max(received)) / self.bytes_per_s)

    def one_sided_exchange(self, nbytes: float, ranks: int, stepping: int | None = None) -> Cost:
        """Elastic averaging's step with a centre sharded over ``ranks`` ranks, made by ``stepping``
        of them at once (default all; hybrid: the group leaders, ranks 0, g, 2g...): each reads the
        centre and adds its difference to it one-sidedly, (p-1)/p of the vector in and out; each
        rank's link also serves its shard to the others that step."""
        stepping = ranks if stepping is None else stepping
        if ranks <= 1 or nbytes <= 0 or stepping < 1:
            return Cost(0.0, 0.0)
        share = (ranks - 1) / ranks * nbytes
        if self.topology == "shared":
            return Cost(2 * self.latency_s, 2 * stepping * share / self.bytes_per_s)
        serve = min(stepping, ranks - 1) * nbytes / ranks   # its shard, to the others that step
        if self.topology == "nodes" and ranks > self.ranks_per_node:
            # A node's link carries its stepping ranks' traffic and its shards' service.
            per_node = max(1, stepping * self.ranks_per_node // ranks)
            load = max(per_node * share, self.ranks_per_node * serve)
            return Cost(2 * self.latency_s, 2 * load / self.bytes_per_s)
        latency, rate = self._link(ranks)
        return Cost(2 * latency, 2 * max(share, serve) / rate)


def parse_rate(text: str, option: str = "--bandwidth") -> float:
    """Bytes per second from '1gbit', '10Gbit', '100mbit' (bits) or '12.5GB/s', '3e9' (bytes)."""
    match = re.fullmatch(r"\s*([0-9.]+(?:[eE][+-]?\d+)?)\s*([kKmMgGtT]?)\s*(bit|Bit|b|B|B/s|b/s|bps)?\s*",
                         str(text))
    if not match:
        raise NetworkError(f"{option}: cannot read {text!r} (examples: 1gbit, 10gbit, 12.5GB/s, 3e9)")
    value = float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[match.group(2).lower()]
    unit = match.group(3) or "B"
    if unit in ("bit", "Bit", "b", "b/s", "bps"):
        value /= 8
    if not value > 0:
        raise NetworkError(f"{option}: must be positive, got {text!r}")
    return value


def parse_duration(text: str, option: str = "--latency") -> float:
    """Seconds from '5us', '1.5ms', '0.00002' (seconds)."""
    match = re.fullmatch(r"\s*([0-9.]+(?:[eE][+-]?\d+)?)\s*(s|ms|us|ns)?\s*", str(text))
    if not match:
        raise NetworkError(f"{option}: cannot read {text!r} (examples: 5us, 1.5ms, 0.00002)")
    return float(match.group(1)) * {"s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[match.group(2) or "s"]
