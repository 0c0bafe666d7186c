"""pycaffe's batched calls of a net: ``forward_all`` and ``forward_backward_all`` take arrays of any
length, run them in batches of the net's batch size (the first input's first axis; the last batch
padded with zeros) and return every row of the outputs (and input gradients), padding removed.
"""
from __future__ import annotations

import collections

import numpy as np

from . import backend


def forward_all(net, blobs, arrays: dict) -> dict:
    """{output name (and each of ``blobs``): all its rows} for the inputs ``arrays``."""
    outputs = collections.OrderedDict()
    for batch in batches(net, arrays):
        for name, data in net.forward(blobs=blobs, **batch).items():
            outputs.setdefault(name, []).append(backend.to_host(data).copy())
    return _unpadded(outputs, arrays)


def forward_backward_all(net, blobs, diffs, arrays: dict) -> tuple[dict, dict]:
    """({output: rows}, {input diff: rows}) for the inputs and top diffs in ``arrays``."""
    forward_in = {k: v for k, v in arrays.items() if k in net.inputs}
    backward_in = {k: v for k, v in arrays.items() if k not in forward_in}
    outputs, input_diffs = collections.OrderedDict(), collections.OrderedDict()
    forward_batches = batches(net, forward_in)
    backward_batches = batches(net, backward_in) if backward_in else [{}] * len(forward_batches)
    if len(backward_batches) != len(forward_batches):
        raise ValueError("forward_backward_all: the inputs and the top diffs have different lengths")
    for fwd, bwd in zip(forward_batches, backward_batches):
        for name, data in net.forward(blobs=blobs, **fwd).items():
            outputs.setdefault(name, []).append(backend.to_host(data).copy())
        for name, diff in net.backward(diffs=diffs, **bwd).items():
            input_diffs.setdefault(name, []).append(backend.to_host(diff).copy())
    return _unpadded(outputs, arrays), _unpadded(input_diffs, arrays)


def batches(net, arrays: dict) -> list[dict]:
    """Rows of ``arrays`` in chunks of the net's batch size (the first input's first axis), the
    last chunk padded with zeros; one empty dict when there are no arrays."""
    if not arrays:
        return [{}]
    batch = net.blobs[net.inputs[0]].shape[0] if net.inputs else None
    lengths = {len(v) for v in arrays.values()}
    if len(lengths) != 1:
        raise ValueError(f"inputs of different lengths: {sorted(lengths)}")
    total = lengths.pop()
    batch = batch or total
    chunks = []
    for start in range(0, total, batch):
        chunk = {}
        for name, values in arrays.items():
            part = np.asarray(values[start:start + batch])
            if len(part) < batch:
                part = np.concatenate([part, np.zeros((batch - len(part),) + part.shape[1:], part.dtype)])
            chunk[name] = part
        chunks.append(chunk)
    return chunks


def _unpadded(collected: dict, arrays: dict) -> dict:
    total = len(next(iter(arrays.values()))) if arrays else None
    return collections.OrderedDict((name, np.concatenate(parts)[:total]) for name, parts in collected.items())
