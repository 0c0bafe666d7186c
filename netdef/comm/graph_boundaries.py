"""Where a distributed run's train net ends its stretches of layers replayed from CUDA graphs.

On a GPU with ``--cuda_graphs`` the net replays stretches of layers as one launch each
(``net_graphs.py``) and calls the hooks of a stretch's layers at its edges (``net_hooks.py``). A gradient
exchange wants its buckets to leave while the layers below still run, and the next forward's layers to
wait only for their own updates; one stretch for the whole of backward would hand every gradient over at
its end. So the rules that exchange during backward cut it (``ExchangeRule.run_boundaries``) wherever
about a bucket's worth of gradients has become final. Each stretch is a graph with a memory pool of its
own, so the cuts are kept few: at most ``GRAPH_STRETCHES`` per pass.
"""
from __future__ import annotations

#: At most this many stretches of layers per pass where graphs replay a distributed run's train net
#: (``boundaries_by_gradient_bytes``): each stretch is a graph with a memory pool of its own.
GRAPH_STRETCHES = 8


def boundaries_by_gradient_bytes(net, every_bytes: int) -> frozenset[int]:
    """Layer indices that cut the net's backward, from the top, wherever at least ``every_bytes`` of
    parameter gradients (and at least 1 / ``GRAPH_STRETCHES`` of them all) have become final since the
    last cut: the stretches a gradient exchange hands over as it goes (``run_boundaries``)."""
    params = net.learnable_params
    final = [sum(int(params[pid].data.nbytes) for pid in net.gradients_final_at(li)) for li in range(len(net.layers))]
    every = max(int(every_bytes), -(-sum(final) // GRAPH_STRETCHES), 1)
    cuts, gathered = set(), 0
    for li in range(len(net.layers) - 1, 0, -1):
        gathered += final[li]
        if gathered >= every and any(net.layer_need_backward[:li]):  # else nothing runs below: no cut
            cuts.add(li)
            gathered = 0
    return frozenset(cuts)
