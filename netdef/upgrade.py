"""Upgrade legacy Caffe net definitions to the current format, as Caffe's upgrade_proto does.

- V0 (``layers { layer { type: "conv" kernelsize: 5 ... } }``) and its separate padding layers;
- V1 (``layers { type: CONVOLUTION blobs_lr: 1 ... }``) with enum types and per-blob lr/decay lists;
- data-layer transform fields (``data_param { scale mean_file ... }``) moved to ``transform_param``;
- net inputs given as ``input:`` with ``input_dim:`` or ``input_shape`` become an ``Input`` layer;
- BatchNorm layers' old ``param { lr_mult: 0 }`` triples are dropped (the layer fixes them itself).

Each step returns nothing and edits the NetParameter in place; ``upgrade_net`` runs them all.
"""
from __future__ import annotations

from .proto import netdef_pb2 as pb

_V1 = pb.V1LayerParameter

V1_TYPE_NAMES = {
    _V1.NONE: "", _V1.ABSVAL: "AbsVal", _V1.ACCURACY: "Accuracy", _V1.ARGMAX: "ArgMax", _V1.BNLL: "BNLL",
    _V1.CONCAT: "Concat", _V1.CONTRASTIVE_LOSS: "ContrastiveLoss", _V1.CONVOLUTION: "Convolution",
    _V1.DATA: "Data", _V1.DECONVOLUTION: "Deconvolution", _V1.DROPOUT: "Dropout", _V1.DUMMY_DATA: "DummyData",
    _V1.EUCLIDEAN_LOSS: "EuclideanLoss", _V1.ELTWISE: "Eltwise", _V1.EXP: "Exp", _V1.FLATTEN: "Flatten",
    _V1.HDF5_DATA: "HDF5Data", _V1.HDF5_OUTPUT: "HDF5Output", _V1.HINGE_LOSS: "HingeLoss", _V1.IM2COL: "Im2col",
    _V1.IMAGE_DATA: "ImageData", _V1.INFOGAIN_LOSS: "InfogainLoss", _V1.INNER_PRODUCT: "InnerProduct",
    _V1.LRN: "LRN", _V1.MEMORY_DATA: "MemoryData", _V1.MULTINOMIAL_LOGISTIC_LOSS: "MultinomialLogisticLoss",
    _V1.MVN: "MVN", _V1.POOLING: "Pooling", _V1.POWER: "Power", _V1.RELU: "ReLU", _V1.SIGMOID: "Sigmoid",
    _V1.SIGMOID_CROSS_ENTROPY_LOSS: "SigmoidCrossEntropyLoss", _V1.SILENCE: "Silence", _V1.SOFTMAX: "Softmax",
    _V1.SOFTMAX_LOSS: "SoftmaxWithLoss", _V1.SPLIT: "Split", _V1.SLICE: "Slice", _V1.TANH: "TanH",
    _V1.WINDOW_DATA: "WindowData", _V1.THRESHOLD: "Threshold",
}

# V0 type strings -> V1 enum values.
V0_TYPES = {
    "accuracy": _V1.ACCURACY, "bnll": _V1.BNLL, "concat": _V1.CONCAT, "conv": _V1.CONVOLUTION,
    "data": _V1.DATA, "dropout": _V1.DROPOUT, "euclidean_loss": _V1.EUCLIDEAN_LOSS, "flatten": _V1.FLATTEN,
    "hdf5_data": _V1.HDF5_DATA, "hdf5_output": _V1.HDF5_OUTPUT, "im2col": _V1.IM2COL, "images": _V1.IMAGE_DATA,
    "infogain_loss": _V1.INFOGAIN_LOSS, "innerproduct": _V1.INNER_PRODUCT, "lrn": _V1.LRN,
    "multinomial_logistic_loss": _V1.MULTINOMIAL_LOGISTIC_LOSS, "pool": _V1.POOLING, "relu": _V1.RELU,
    "sigmoid": _V1.SIGMOID, "softmax": _V1.SOFTMAX, "softmax_loss": _V1.SOFTMAX_LOSS, "split": _V1.SPLIT,
    "tanh": _V1.TANH, "window_data": _V1.WINDOW_DATA,
}


class UpgradeError(ValueError):
    """A legacy definition that cannot be upgraded; the message names the layer."""


def upgrade_net(net: pb.NetParameter, source: str = "<net>") -> pb.NetParameter:
    """Bring ``net`` to the current (V2, ``layer``) format in place and return it."""
    if net.layer and net.layers:
        raise UpgradeError(f"{source}: the net uses both 'layer' (V2) and 'layers' (V1) fields; use one")
    if any(v1.HasField("layer") for v1 in net.layers):
        upgrade_v0(net, source)
    if net.layers:
        upgrade_v1(net, source)
    upgrade_data_transformation(net)
    upgrade_input_fields(net, source)
    upgrade_batch_norm(net)
    return net


# ---------------------------------------------------------------------------------------------- V0
def _v0_to_v1(v0: pb.V0LayerParameter, out: _V1, source: str) -> None:
    kind = v0.type
    if v0.HasField("name"):
        out.name = v0.name
    if kind not in V0_TYPES:
        raise UpgradeError(f"{source}: V0 layer {v0.name!r} has unknown type {kind!r}")
    out.type = V0_TYPES[kind]
    out.blobs.extend(v0.blobs)
    out.blobs_lr.extend(v0.blobs_lr)
    out.weight_decay.extend(v0.weight_decay)
    if kind in ("conv", "innerproduct"):
        target = out.convolution_param if kind == "conv" else out.inner_product_param
        if v0.HasField("num_output"):
            target.num_output = v0.num_output
        if v0.HasField("biasterm"):
            target.bias_term = v0.biasterm
        if v0.HasField("weight_filler"):
            target.weight_filler.CopyFrom(v0.weight_filler)
        if v0.HasField("bias_filler"):
            target.bias_filler.CopyFrom(v0.bias_filler)
        if kind == "conv":
            if v0.HasField("pad"):
                target.pad.append(v0.pad)
            if v0.HasField("kernelsize"):
                target.kernel_size.append(v0.kernelsize)
            if v0.HasField("group"):
                target.group = v0.group
            if v0.HasField("stride"):
                target.stride.append(v0.stride)
    elif kind == "pool":
        p = out.pooling_param
        if v0.HasField("kernelsize"):
            p.kernel_size = v0.kernelsize
        if v0.HasField("stride"):
            p.stride = v0.stride
        if v0.HasField("pad"):
            p.pad = v0.pad
        if v0.HasField("pool"):
            p.pool = v0.pool  # same numbering (MAX, AVE, STOCHASTIC)
    elif kind == "dropout":
        if v0.HasField("dropout_ratio"):
            out.dropout_param.dropout_ratio = v0.dropout_ratio
    elif kind == "lrn":
        for field in ("local_size", "alpha", "beta", "k"):
            if v0.HasField(field):
                setattr(out.lrn_param, field, getattr(v0, field))
    elif kind in ("data", "images", "hdf5_data", "window_data"):
        target = {"data": out.data_param, "images": out.image_data_param,
                  "hdf5_data": out.hdf5_data_param, "window_data": out.window_data_param}[kind]
        if v0.HasField("source"):
            target.source = v0.source
        if v0.HasField("batchsize"):
            target.batch_size = v0.batchsize
        if kind in ("data", "images", "window_data"):
            if v0.HasField("scale"):
                out.transform_param.scale = v0.scale
            if v0.HasField("meanfile"):
                out.transform_param.mean_file = v0.meanfile
            if v0.HasField("cropsize"):
                out.transform_param.crop_size = v0.cropsize
            if v0.HasField("mirror"):
                out.transform_param.mirror = v0.mirror
        if kind in ("data", "images") and v0.HasField("rand_skip"):
            target.rand_skip = v0.rand_skip
        if kind == "images":
            if v0.HasField("shuffle_images"):
                target.shuffle = v0.shuffle_images
            if v0.HasField("new_height"):
                target.new_height = v0.new_height
            if v0.HasField("new_width"):
                target.new_width = v0.new_width
        if kind == "window_data":
            for v0_field, field in (("det_fg_threshold", "fg_threshold"), ("det_bg_threshold", "bg_threshold"),
                                    ("det_fg_fraction", "fg_fraction"), ("det_context_pad", "context_pad"),
                                    ("det_crop_mode", "crop_mode")):
                if v0.HasField(v0_field):
                    setattr(target, field, getattr(v0, v0_field))
    elif kind == "concat":
        if v0.HasField("concat_dim"):
            out.concat_param.concat_dim = v0.concat_dim
    elif kind == "infogain_loss":
        if v0.HasField("source"):
            out.infogain_loss_param.source = v0.source
    elif kind == "hdf5_output":
        if v0.HasField("hdf5_output_param"):
            out.hdf5_output_param.CopyFrom(v0.hdf5_output_param)


def upgrade_v0(net: pb.NetParameter, source: str) -> None:
    """V0 -> V1: per-type fields move into *_param messages; padding layers fold into their consumer."""
    legacy = list(net.layers)
    # Padding layers: "padding" has one bottom and one top, and the conv/pool that reads its top
    # takes the pad and reads the padding layer's bottom instead.
    padding_of: dict[str, tuple[str, int]] = {}
    kept = []
    for v1 in legacy:
        if v1.layer.type == "padding":
            if len(v1.bottom) != 1 or len(v1.top) != 1:
                raise UpgradeError(f"{source}: V0 padding layer {v1.layer.name!r} needs one bottom and one top")
            padding_of[v1.top[0]] = (v1.bottom[0], v1.layer.pad)
        else:
            kept.append(v1)
    del net.layers[:]
    for v1 in kept:
        out = net.layers.add()
        out.bottom.extend(v1.bottom)
        out.top.extend(v1.top)
        _v0_to_v1(v1.layer, out, source)
        for i, bottom in enumerate(out.bottom):
            if bottom in padding_of:
                if out.type not in (_V1.CONVOLUTION, _V1.POOLING):
                    raise UpgradeError(f"{source}: V0 padding feeds layer {out.name!r}, which is not conv or pool")
                out.bottom[i], pad = padding_of[bottom]
                if out.type == _V1.CONVOLUTION:
                    del out.convolution_param.pad[:]
                    out.convolution_param.pad.append(pad)
                else:
                    out.pooling_param.pad = pad


# ---------------------------------------------------------------------------------------------- V1
_SHARED_PARAM_FIELDS = [f.name for f in _V1.DESCRIPTOR.fields
                        if f.name.endswith("_param") and f.name in pb.LayerParameter.DESCRIPTOR.fields_by_name]


def v1_to_v2_layer(v1: _V1, source: str = "<net>") -> pb.LayerParameter:
    """One V1 layer as a V2 LayerParameter."""
    layer = pb.LayerParameter()
    layer.name = v1.name
    layer.bottom.extend(v1.bottom)
    layer.top.extend(v1.top)
    layer.include.extend(v1.include)
    layer.exclude.extend(v1.exclude)
    if v1.HasField("type"):
        if v1.type not in V1_TYPE_NAMES:
            raise UpgradeError(f"{source}: V1 layer {v1.name!r} has unknown type number {v1.type}")
        layer.type = V1_TYPE_NAMES[v1.type]
    layer.blobs.extend(v1.blobs)
    n_specs = max(len(v1.param), len(v1.blob_share_mode), len(v1.blobs_lr), len(v1.weight_decay))
    for i in range(n_specs):
        spec = layer.param.add()
        if i < len(v1.param):
            spec.name = v1.param[i]
        if i < len(v1.blob_share_mode):
            spec.share_mode = v1.blob_share_mode[i]
        if i < len(v1.blobs_lr):
            spec.lr_mult = v1.blobs_lr[i]
        if i < len(v1.weight_decay):
            spec.decay_mult = v1.weight_decay[i]
    layer.loss_weight.extend(v1.loss_weight)
    for field in _SHARED_PARAM_FIELDS:
        if v1.HasField(field):
            getattr(layer, field).CopyFrom(getattr(v1, field))
    return layer


def upgrade_v1(net: pb.NetParameter, source: str) -> None:
    """V1 (``layers``) -> V2 (``layer``)."""
    upgraded = [v1_to_v2_layer(v1, source) for v1 in net.layers]
    del net.layers[:]
    net.layer.extend(upgraded)


# ------------------------------------------------------------------------------------- other steps
def upgrade_data_transformation(net: pb.NetParameter) -> None:
    """Old Data layers kept scale/mean_file/crop_size/mirror in data_param; move them."""
    moved = ("scale", "mean_file", "crop_size", "mirror")
    for layer in net.layer:
        if not layer.HasField("data_param"):
            continue
        for field in moved:
            if layer.data_param.HasField(field):
                setattr(layer.transform_param, field, getattr(layer.data_param, field))
                layer.data_param.ClearField(field)


def upgrade_input_fields(net: pb.NetParameter, source: str) -> None:
    """``input:`` + ``input_shape``/``input_dim`` -> a leading ``Input`` layer named "input"."""
    if not net.input:
        return
    n = len(net.input)
    if net.input_shape and len(net.input_shape) not in (1, n):
        raise UpgradeError(f"{source}: {n} inputs but {len(net.input_shape)} input_shape entries")
    if net.input_dim and len(net.input_dim) != 4 * n:
        raise UpgradeError(f"{source}: {n} inputs need {4 * n} input_dim values, found {len(net.input_dim)}")
    layer = pb.LayerParameter(name="input", type="Input")
    layer.top.extend(net.input)
    for i in range(n):
        shape = layer.input_param.shape.add()
        if net.input_shape:
            shape.CopyFrom(net.input_shape[i if len(net.input_shape) == n else 0])
        elif net.input_dim:
            shape.dim.extend(net.input_dim[4 * i: 4 * i + 4])
        else:
            raise UpgradeError(f"{source}: input {net.input[i]!r} has no input_shape or input_dim")
    layers = [layer] + list(net.layer)
    del net.layer[:]
    net.layer.extend(layers)
    net.ClearField("input")
    net.ClearField("input_shape")
    net.ClearField("input_dim")


def upgrade_batch_norm(net: pb.NetParameter) -> None:
    """Old BatchNorm definitions carry three ``param { lr_mult: 0 }``; the layer now fixes them."""
    for layer in net.layer:
        if layer.type == "BatchNorm" and len(layer.param) == 3:
            del layer.param[:]


def upgrade_solver(solver: pb.SolverParameter) -> pb.SolverParameter:
    """The legacy ``solver_type: SGD`` enum becomes ``type: "SGD"``."""
    names = {pb.SolverParameter.SGD: "SGD", pb.SolverParameter.NESTEROV: "Nesterov",
             pb.SolverParameter.ADAGRAD: "AdaGrad", pb.SolverParameter.RMSPROP: "RMSProp",
             pb.SolverParameter.ADADELTA: "AdaDelta", pb.SolverParameter.ADAM: "Adam"}
    if solver.HasField("solver_type"):
        solver.type = names[solver.solver_type]
        solver.ClearField("solver_type")
    return solver
