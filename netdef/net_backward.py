"""Which layers of a net run backward, and where each parameter's gradient is final: Caffe's rules
(``Net::Init``).

A layer runs backward when a bottom's gradient or one of its own parameters needs it and the loss
depends on it; a bottom gets a gradient when its layer runs backward, ``propagate_down`` allows it
and someone below needs it. ``force_backward: true`` makes every layer run backward and every bottom
that allows it get a gradient. A parameter's gradient is final once the lowest layer using it has
run backward (its first user in definition order).
"""
from __future__ import annotations


def decide_backward(layers, loss_weights, force_backward: bool) -> tuple[list[bool], list[list[bool]]]:
    """(per layer, whether it runs backward; per layer and bottom, whether the bottom gets a
    gradient) for ``layers`` with their tops' ``loss_weights``."""
    n = len(layers)
    blob_needs = {}
    layer_need_backward = [False] * n
    bottom_need_backward: list[list[bool]] = []
    for li, layer in enumerate(layers):
        lp = layer.layer_param
        need = False
        per_bottom = []
        for bi, bottom_name in enumerate(lp.bottom):
            needs = blob_needs.get(bottom_name, False)
            need |= needs
            allowed = lp.propagate_down[bi] if lp.propagate_down else True
            per_bottom.append(needs and allowed)
        need |= any(layer.param_propagate_down)
        layer_need_backward[li] = need
        bottom_need_backward.append(per_bottom)
        if need:
            for top_name in lp.top:
                blob_needs[top_name] = True
    # Backward only where the loss depends on the layer.
    under_loss: set[str] = set()
    skip_backprop: set[str] = set()
    for li in range(n - 1, -1, -1):
        lp = layers[li].layer_param
        contributes = False
        skip = True
        for ti, top_name in enumerate(lp.top):
            if loss_weights[li][ti] != 0 or top_name in under_loss:
                contributes = True
            if top_name not in skip_backprop:
                skip = False
            if contributes and not skip:
                break
        if layer_need_backward[li] and skip:
            layer_need_backward[li] = False
            bottom_need_backward[li] = [False] * len(lp.bottom)
        if not contributes:
            layer_need_backward[li] = False
        for bi, bottom_name in enumerate(lp.bottom):
            if contributes:
                under_loss.add(bottom_name)
            else:
                bottom_need_backward[li][bi] = False
            if not bottom_need_backward[li][bi]:
                skip_backprop.add(bottom_name)
    if force_backward:
        for li, layer in enumerate(layers):
            layer_need_backward[li] = True
            lp = layer.layer_param
            for bi in range(len(lp.bottom)):
                allowed = lp.propagate_down[bi] if lp.propagate_down else True
                bottom_need_backward[li][bi] = (bottom_need_backward[li][bi]
                                                or (allowed and layer.allow_force_backward(bi)))
    return layer_need_backward, bottom_need_backward


def final_gradients(layers, learnable_ids_of, layer_need_backward) -> tuple[list[list[int]], list[int]]:
    """(per layer, the learnable parameters whose gradient is final once it has run backward; every
    learnable parameter that gets a gradient). ``learnable_ids_of``: per layer, the learnable index
    of each of its parameter blobs."""
    last_user: dict[int, int] = {}
    for li, ids in enumerate(learnable_ids_of):
        layer = layers[li]
        for j, pid in enumerate(ids):
            if layer_need_backward[li] and layer.param_propagate_down[j]:
                last_user[pid] = min(last_user.get(pid, li), li)
    final_at: list[list[int]] = [[] for _ in layers]
    for pid, li in sorted(last_user.items()):
        final_at[li].append(pid)
    return final_at, sorted(last_user)
