"""Writes the zoo's prototxts: train_val.prototxt, deploy.prototxt and solver.prototxt of every model
folder listed in MODELS (LeNet and digits are written by hand and are not touched).

The long definitions (ResNet-50's train_val has 232 layers) are easier to review as the loops below
than as text, and the TRAIN and deploy nets of a model come from the same function, so they cannot
drift apart. The files are committed; tests/test_models.py checks that they equal this script's output.
After changing this script, rewrite them:

    python models/tools/generate.py            # write the files
    python models/tools/generate.py --check    # exit 1 if a committed file differs
"""
from __future__ import annotations

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
MODELS_DIR = HERE.parent


# ------------------------------------------------------------------------------------------ text format
class Enum(str):
    """A protobuf enum value: written without quotes."""


def _value(v) -> str:
    if isinstance(v, Enum):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, float):
        return f"{v:.10f}".rstrip("0").rstrip(".")
    return str(v)


def _inline(key: str, fields: list) -> str:
    inner = " ".join(_inline(k, v) if isinstance(v, list) else f"{k}: {_value(v)}" for k, v in fields)
    return f"{key} {{ {inner} }}"


def _message(key: str, fields: list, indent: str, width: int = 100) -> list[str]:
    """``key { ... }`` on one line when it fits and holds no sub-message (input shapes excepted), else
    one field a line."""
    nested = any(isinstance(v, list) for _, v in fields)
    if not nested or key == "input_param":
        line = indent + _inline(key, fields)
        if len(line) <= width:
            return [line]
    out = [f"{indent}{key} {{"]
    for k, v in fields:
        if isinstance(v, list):
            out.extend(_message(k, v, indent + "  ", width))
        else:
            out.append(f"{indent}  {k}: {_value(v)}")
    out.append(f"{indent}}}")
    return out


def filler(kind: str, **kw) -> list:
    return [("type", kind)] + list(kw.items())


MAX, AVE, SUM = Enum("MAX"), Enum("AVE"), Enum("SUM")
TRAIN, TEST = Enum("TRAIN"), Enum("TEST")
LMDB = Enum("LMDB")
# param specs: weights learn at the base rate and decay; biases learn twice as fast and do not decay.
W_B = ({"lr_mult": 1, "decay_mult": 1}, {"lr_mult": 2, "decay_mult": 0})
FROZEN3 = ({"lr_mult": 0, "decay_mult": 0},) * 3  # BatchNorm's mean, variance and moving-average factor


GENERATED = "\n(Written by models/tools/generate.py: change that script, not this file.)"


class NetWriter:
    """Accumulates layers. ``deploy`` drops what only training needs: param specs, fillers, data
    layers, losses and accuracies."""

    def __init__(self, name: str, deploy: bool, header: str):
        self.deploy = deploy
        self.lines = [f"# {line}".rstrip() for line in (header.strip() + GENERATED).splitlines()]
        self.lines.append(f'name: "{name}"')

    def comment(self, text: str) -> None:
        self.lines.append(f"# {text}")

    def layer(self, name, kind, bottom=(), top=(), *, params=(), include=None, loss_weight=None,
              body=None, body_key=None, extra=()) -> None:
        bottom = [bottom] if isinstance(bottom, str) else list(bottom)
        top = [top] if isinstance(top, str) else list(top)
        out = ["layer {", f'  name: "{name}"', f'  type: "{kind}"']
        out += [f'  bottom: "{b}"' for b in bottom]
        out += [f'  top: "{t}"' for t in top]
        if include is not None:
            out.append(f"  include {{ phase: {include} }}")
        if loss_weight is not None:
            out.append(f"  loss_weight: {_value(loss_weight)}")
        if not self.deploy:
            for spec in params:
                out.extend(_message("param", list(spec.items()), "  "))
        for key, fields in extra:
            out.extend(_message(key, fields, "  "))
        if body:
            out.extend(_message(body_key, body, "  "))
        out.append("}")
        self.lines.extend(out)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    # ---------------------------------------------------------------------------------- data
    def data(self, train_batch, test_batch, transform_train, transform_test, deploy_shape) -> None:
        """Data layers reading train_lmdb / val_lmdb (TRAIN / TEST), or the deploy Input."""
        if self.deploy:
            self.layer("data", "Input", top="data",
                       body=[("shape", [("dim", d) for d in deploy_shape])], body_key="input_param")
            return
        for phase, batch, source, transform in ((TRAIN, train_batch, "train_lmdb", transform_train),
                                                (TEST, test_batch, "val_lmdb", transform_test)):
            self.layer("data", "Data", top=["data", "label"], include=phase,
                       extra=[("transform_param", transform)],
                       body=[("source", source), ("batch_size", batch), ("backend", LMDB)], body_key="data_param")

    # ---------------------------------------------------------------------------------- layers
    def conv(self, name, bottom, top, num_output, kernel, *, stride=1, pad=0, group=1, bias=True,
             weight_filler=None, bias_filler=None, params=None) -> None:
        body = [("num_output", num_output)]
        if not bias:
            body.append(("bias_term", False))
        if pad:
            body.append(("pad", pad))
        body.append(("kernel_size", kernel))
        if stride != 1:
            body.append(("stride", stride))
        if group != 1:
            body.append(("group", group))
        if not self.deploy:
            if weight_filler:
                body.append(("weight_filler", weight_filler))
            if bias and bias_filler:
                body.append(("bias_filler", bias_filler))
        if params is None:
            params = W_B if bias else ()
        self.layer(name, "Convolution", bottom, top, params=params, body=body, body_key="convolution_param")

    def fc(self, name, bottom, top, num_output, *, weight_filler=None, bias_filler=None, params=W_B) -> None:
        body = [("num_output", num_output)]
        if not self.deploy:
            if weight_filler:
                body.append(("weight_filler", weight_filler))
            if bias_filler:
                body.append(("bias_filler", bias_filler))
        self.layer(name, "InnerProduct", bottom, top, params=params, body=body, body_key="inner_product_param")

    def relu(self, name, blob) -> None:
        self.layer(name, "ReLU", blob, blob)

    def pool(self, name, bottom, top, method, kernel=None, stride=None, *, pad=0, global_pooling=False) -> None:
        body = [("pool", method)]
        if global_pooling:
            body.append(("global_pooling", True))
        else:
            body.append(("kernel_size", kernel))
            body.append(("stride", stride))
            if pad:
                body.append(("pad", pad))
        self.layer(name, "Pooling", bottom, top, body=body, body_key="pooling_param")

    def lrn(self, name, bottom, top, local_size, alpha, beta, region=None) -> None:
        body = [("local_size", local_size), ("alpha", alpha), ("beta", beta)]
        if region:
            body.append(("norm_region", Enum(region)))
        self.layer(name, "LRN", bottom, top, body=body, body_key="lrn_param")

    def dropout(self, name, blob, ratio) -> None:
        self.layer(name, "Dropout", blob, blob, body=[("dropout_ratio", ratio)], body_key="dropout_param")

    def concat(self, name, bottoms, top) -> None:
        self.layer(name, "Concat", bottoms, top)

    def bn_scale(self, bn_name, scale_name, blob) -> None:
        """Caffe-style batch normalization: BatchNorm (statistics only, in place) then a learned Scale
        with bias. The statistics are not learned: their lr_mult is 0."""
        self.layer(bn_name, "BatchNorm", blob, blob, params=FROZEN3)
        self.layer(scale_name, "Scale", blob, blob, body=[("bias_term", True)], body_key="scale_param")

    def loss_and_accuracy(self, bottom, *, loss="loss", top5=True, prob="prob", names=None) -> None:
        """Softmax loss (and TEST accuracies) in training; class probabilities in deploy."""
        if self.deploy:
            self.layer(prob, "Softmax", bottom, prob)
            return
        acc1, acc5 = names or ("accuracy", "accuracy_top5")
        self.layer(acc1, "Accuracy", [bottom, "label"], acc1, include=TEST)
        if top5:
            self.layer(acc5, "Accuracy", [bottom, "label"], acc5, include=TEST,
                       body=[("top_k", 5)], body_key="accuracy_param")
        self.layer(loss, "SoftmaxWithLoss", [bottom, "label"], loss)


def solver_text(header: str, fields: list) -> str:
    lines = [f"# {line}".rstrip() for line in (header.strip() + GENERATED).splitlines()]
    for item in fields:
        if isinstance(item, str):  # a comment line
            lines.append(f"# {item}")
            continue
        key, value = item
        values = value if isinstance(value, tuple) else (value,)
        lines.extend(f"{key}: {_value(v)}" for v in values)
    return "\n".join(lines) + "\n"


def imagenet_transform(crop, *, mirror, mean_file=None, mean_value=(), scale=None) -> list:
    t = []
    if scale is not None:
        t.append(("scale", scale))
    if mirror:
        t.append(("mirror", True))
    t.append(("crop_size", crop))
    if mean_file:
        t.append(("mean_file", mean_file))
    t += [("mean_value", v) for v in mean_value]
    return t


def imagenet_data(w: NetWriter, crop, train_batch, test_batch, **mean) -> None:
    w.data(train_batch, test_batch, imagenet_transform(crop, mirror=True, **mean),
           imagenet_transform(crop, mirror=False, **mean), (10, 3, crop, crop))


DEPLOY_NOTE = ("Deployment net: the layers of train_val.prototxt behind an Input of 10 images (Caffe's ten crops),\n"
               "ending in class probabilities.")


# ------------------------------------------------------------------------------------------ CIFAR-10
def cifar10_quick(deploy: bool) -> str:
    header = ("CIFAR-10 quick (Caffe's cifar10_quick example): three 5x5 convolution stages of 32, 32 and 64\n"
              "filters with max/average pooling, then fully connected 64 and 10. 32x32 RGB images, mean-subtracted.\n"
              + ("Deployment net: Input of one image, ending in class probabilities." if deploy else
                 "The Data layers read train_lmdb / val_lmdb and mean.binaryproto (see README.md)."))
    w = NetWriter("CIFAR10_quick", deploy, header)
    t = [("mean_file", "mean.binaryproto")]
    w.data(100, 100, t, t, (1, 3, 32, 32))
    wb = ({"lr_mult": 1}, {"lr_mult": 2})
    const = filler("constant")
    w.conv("conv1", "data", "conv1", 32, 5, pad=2, weight_filler=filler("gaussian", std=0.0001),
           bias_filler=const, params=wb)
    w.pool("pool1", "conv1", "pool1", MAX, 3, 2)
    w.relu("relu1", "pool1")
    w.conv("conv2", "pool1", "conv2", 32, 5, pad=2, weight_filler=filler("gaussian", std=0.01),
           bias_filler=const, params=wb)
    w.relu("relu2", "conv2")
    w.pool("pool2", "conv2", "pool2", AVE, 3, 2)
    w.conv("conv3", "pool2", "conv3", 64, 5, pad=2, weight_filler=filler("gaussian", std=0.01),
           bias_filler=const, params=wb)
    w.relu("relu3", "conv3")
    w.pool("pool3", "conv3", "pool3", AVE, 3, 2)
    w.fc("ip1", "pool3", "ip1", 64, weight_filler=filler("gaussian", std=0.1), bias_filler=const, params=wb)
    w.fc("ip2", "ip1", "ip2", 10, weight_filler=filler("gaussian", std=0.1), bias_filler=const, params=wb)
    w.loss_and_accuracy("ip2", top5=False)
    return w.text()


def cifar10_full(deploy: bool) -> str:
    header = ("CIFAR-10 full (Caffe's cifar10_full example): cifar10_quick with local response normalization\n"
              "within channels after the first two stages and a single fully connected layer of 10 outputs.\n"
              + ("Deployment net: Input of one image, ending in class probabilities." if deploy else
                 "The Data layers read train_lmdb / val_lmdb and mean.binaryproto (see README.md)."))
    w = NetWriter("CIFAR10_full", deploy, header)
    t = [("mean_file", "mean.binaryproto")]
    w.data(100, 100, t, t, (1, 3, 32, 32))
    wb = ({"lr_mult": 1}, {"lr_mult": 2})
    const = filler("constant")
    w.conv("conv1", "data", "conv1", 32, 5, pad=2, weight_filler=filler("gaussian", std=0.0001),
           bias_filler=const, params=wb)
    w.pool("pool1", "conv1", "pool1", MAX, 3, 2)
    w.relu("relu1", "pool1")
    w.lrn("norm1", "pool1", "norm1", 3, 0.00005, 0.75, "WITHIN_CHANNEL")
    w.conv("conv2", "norm1", "conv2", 32, 5, pad=2, weight_filler=filler("gaussian", std=0.01),
           bias_filler=const, params=wb)
    w.relu("relu2", "conv2")
    w.pool("pool2", "conv2", "pool2", AVE, 3, 2)
    w.lrn("norm2", "pool2", "norm2", 3, 0.00005, 0.75, "WITHIN_CHANNEL")
    w.conv("conv3", "norm2", "conv3", 64, 5, pad=2, weight_filler=filler("gaussian", std=0.01),
           bias_filler=const, params=wb)
    w.relu("relu3", "conv3")
    w.pool("pool3", "conv3", "pool3", AVE, 3, 2)
    if not deploy:
        w.comment("The only fully connected layer: its weights decay 250 times harder than the convolutions'.")
    w.fc("ip1", "pool3", "ip1", 10, weight_filler=filler("gaussian", std=0.01), bias_filler=const,
         params=({"lr_mult": 1, "decay_mult": 250}, {"lr_mult": 2, "decay_mult": 0}))
    w.loss_and_accuracy("ip1", top5=False)
    return w.text()


# ------------------------------------------------------------------------------------------ AlexNet
def _alexnet(deploy: bool, name: str, header: str, pool_before_norm: bool) -> str:
    w = NetWriter(name, deploy, header)
    imagenet_data(w, 227, 256, 50, mean_file="mean.binaryproto")

    def g(std):
        return filler("gaussian", std=std)

    c0, c1 = filler("constant", value=0), filler("constant", value=0.1)

    def pool_norm(i: int, bottom: str) -> str:
        pool, norm = f"pool{i}", f"norm{i}"
        if pool_before_norm:
            w.pool(pool, bottom, pool, MAX, 3, 2)
            w.lrn(norm, pool, norm, 5, 0.0001, 0.75)
            return norm
        w.lrn(norm, bottom, norm, 5, 0.0001, 0.75)
        w.pool(pool, norm, pool, MAX, 3, 2)
        return pool

    w.conv("conv1", "data", "conv1", 96, 11, stride=4, weight_filler=g(0.01), bias_filler=c0)
    w.relu("relu1", "conv1")
    x = pool_norm(1, "conv1")
    w.conv("conv2", x, "conv2", 256, 5, pad=2, group=2, weight_filler=g(0.01), bias_filler=c1)
    w.relu("relu2", "conv2")
    x = pool_norm(2, "conv2")
    w.conv("conv3", x, "conv3", 384, 3, pad=1, weight_filler=g(0.01), bias_filler=c0)
    w.relu("relu3", "conv3")
    w.conv("conv4", "conv3", "conv4", 384, 3, pad=1, group=2, weight_filler=g(0.01), bias_filler=c1)
    w.relu("relu4", "conv4")
    w.conv("conv5", "conv4", "conv5", 256, 3, pad=1, group=2, weight_filler=g(0.01), bias_filler=c1)
    w.relu("relu5", "conv5")
    w.pool("pool5", "conv5", "pool5", MAX, 3, 2)
    w.fc("fc6", "pool5", "fc6", 4096, weight_filler=g(0.005), bias_filler=c1)
    w.relu("relu6", "fc6")
    w.dropout("drop6", "fc6", 0.5)
    w.fc("fc7", "fc6", "fc7", 4096, weight_filler=g(0.005), bias_filler=c1)
    w.relu("relu7", "fc7")
    w.dropout("drop7", "fc7", 0.5)
    w.fc("fc8", "fc7", "fc8", 1000, weight_filler=g(0.01), bias_filler=c0)
    w.loss_and_accuracy("fc8")
    return w.text()


def alexnet(deploy: bool) -> str:
    header = ("AlexNet (Krizhevsky, Sutskever & Hinton 2012) as BVLC trained it in Caffe: five convolutions (conv2,\n"
              "conv4, conv5 in two groups, the paper's two GPUs), LRN before max pooling, three fully connected\n"
              "layers with dropout. 227x227 BGR crops of 256x256 images minus the mean image.\n"
              + (DEPLOY_NOTE if deploy else "The Data layers read train_lmdb / val_lmdb and mean.binaryproto "
                 "(see README.md)."))
    return _alexnet(deploy, "AlexNet", header, pool_before_norm=False)


def caffenet(deploy: bool) -> str:
    header = ("CaffeNet (BVLC reference CaffeNet): AlexNet with max pooling before local response normalization\n"
              "instead of after. 227x227 BGR crops of 256x256 images minus the mean image.\n"
              + (DEPLOY_NOTE if deploy else "The Data layers read train_lmdb / val_lmdb and mean.binaryproto "
                 "(see README.md)."))
    return _alexnet(deploy, "CaffeNet", header, pool_before_norm=True)


# ------------------------------------------------------------------------------------------ VGG-16
def vgg16(deploy: bool) -> str:
    header = ("VGG-16 (Simonyan & Zisserman 2015, configuration D): thirteen 3x3 convolutions (pad 1) in five\n"
              "stages of 64, 128, 256, 512, 512 filters, each stage ending in 2x2 max pooling, then fully\n"
              "connected 4096, 4096, 1000 with dropout. 224x224 BGR crops minus the per-channel mean.\n"
              + (DEPLOY_NOTE if deploy else "The Data layers read train_lmdb / val_lmdb (see README.md)."))
    w = NetWriter("VGG_ILSVRC_16_layers", deploy, header)
    imagenet_data(w, 224, 64, 50, mean_value=(103.939, 116.779, 123.68))
    x = "data"
    for stage, (width, depth) in enumerate(((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)), start=1):
        for i in range(1, depth + 1):
            name = f"conv{stage}_{i}"
            w.conv(name, x, name, width, 3, pad=1, weight_filler=filler("msra"), bias_filler=filler("constant"))
            w.relu(f"relu{stage}_{i}", name)
            x = name
        w.pool(f"pool{stage}", x, f"pool{stage}", MAX, 2, 2)
        x = f"pool{stage}"
    c1 = filler("constant", value=0.1)
    w.fc("fc6", "pool5", "fc6", 4096, weight_filler=filler("gaussian", std=0.005), bias_filler=c1)
    w.relu("relu6", "fc6")
    w.dropout("drop6", "fc6", 0.5)
    w.fc("fc7", "fc6", "fc7", 4096, weight_filler=filler("gaussian", std=0.005), bias_filler=c1)
    w.relu("relu7", "fc7")
    w.dropout("drop7", "fc7", 0.5)
    w.fc("fc8", "fc7", "fc8", 1000, weight_filler=filler("gaussian", std=0.01), bias_filler=filler("constant"))
    w.loss_and_accuracy("fc8")
    return w.text()


# ------------------------------------------------------------------------------------------ GoogLeNet
INCEPTION = {  # name: (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection)
    "3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64), "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64), "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128), "5b": (384, 192, 384, 48, 128, 128),
}


def googlenet(deploy: bool) -> str:
    header = ("GoogLeNet (Szegedy et al. 2015, Inception v1) as BVLC trained it in Caffe: a 7x7 and a 3x3 stem,\n"
              "nine Inception modules (parallel 1x1, 3x3, 5x5 and pooled branches, concatenated), global\n"
              "average pooling, dropout 0.4, one fully connected classifier. 224x224 BGR crops minus the\n"
              "per-channel mean.\n"
              + ("Deployment net: no auxiliary classifiers; Input of 10 images, ending in class probabilities."
                 if deploy else
                 "Training adds the paper's two auxiliary classifiers on inception_4a and inception_4d, whose\n"
                 "losses count 0.3 each. The Data layers read train_lmdb / val_lmdb (see README.md)."))
    w = NetWriter("GoogleNet", deploy, header)
    imagenet_data(w, 224, 32, 50, mean_value=(104, 117, 123))
    xav, b02, b0 = filler("xavier"), filler("constant", value=0.2), filler("constant", value=0)

    w.conv("conv1/7x7_s2", "data", "conv1/7x7_s2", 64, 7, pad=3, stride=2, weight_filler=xav, bias_filler=b02)
    w.relu("conv1/relu_7x7", "conv1/7x7_s2")
    w.pool("pool1/3x3_s2", "conv1/7x7_s2", "pool1/3x3_s2", MAX, 3, 2)
    w.lrn("pool1/norm1", "pool1/3x3_s2", "pool1/norm1", 5, 0.0001, 0.75)
    w.conv("conv2/3x3_reduce", "pool1/norm1", "conv2/3x3_reduce", 64, 1, weight_filler=xav, bias_filler=b02)
    w.relu("conv2/relu_3x3_reduce", "conv2/3x3_reduce")
    w.conv("conv2/3x3", "conv2/3x3_reduce", "conv2/3x3", 192, 3, pad=1, weight_filler=xav, bias_filler=b02)
    w.relu("conv2/relu_3x3", "conv2/3x3")
    w.lrn("conv2/norm2", "conv2/3x3", "conv2/norm2", 5, 0.0001, 0.75)
    w.pool("pool2/3x3_s2", "conv2/norm2", "pool2/3x3_s2", MAX, 3, 2)
    x = "pool2/3x3_s2"

    def inception(tag: str, bottom: str) -> str:
        n1, r3, n3, r5, n5, pp = INCEPTION[tag]
        p = f"inception_{tag}"
        w.comment(f"{p}: 1x1 {n1}, 1x1 {r3} -> 3x3 {n3}, 1x1 {r5} -> 5x5 {n5}, 3x3 max pool -> 1x1 {pp}; "
                  f"{n1 + n3 + n5 + pp} channels out")
        branches = []
        for conv, n, k, pad, src in (("1x1", n1, 1, 0, bottom), ("3x3_reduce", r3, 1, 0, bottom),
                                     ("3x3", n3, 3, 1, f"{p}/3x3_reduce"), ("5x5_reduce", r5, 1, 0, bottom),
                                     ("5x5", n5, 5, 2, f"{p}/5x5_reduce")):
            w.conv(f"{p}/{conv}", src, f"{p}/{conv}", n, k, pad=pad, weight_filler=xav, bias_filler=b02)
            w.relu(f"{p}/relu_{conv}", f"{p}/{conv}")
            if conv in ("1x1", "3x3", "5x5"):
                branches.append(f"{p}/{conv}")
        w.pool(f"{p}/pool", bottom, f"{p}/pool", MAX, 3, 1, pad=1)
        w.conv(f"{p}/pool_proj", f"{p}/pool", f"{p}/pool_proj", pp, 1, weight_filler=xav, bias_filler=b02)
        w.relu(f"{p}/relu_pool_proj", f"{p}/pool_proj")
        w.concat(f"{p}/output", branches + [f"{p}/pool_proj"], f"{p}/output")
        return f"{p}/output"

    def auxiliary(i: int, bottom: str) -> None:
        if deploy:
            return
        p = f"loss{i}"
        w.comment(f"Auxiliary classifier {i} (training only): 5x5/3 average pool, 1x1 conv 128, fc 1024, "
                  "dropout 0.7, loss weight 0.3")
        w.pool(f"{p}/ave_pool", bottom, f"{p}/ave_pool", AVE, 5, 3)
        w.conv(f"{p}/conv", f"{p}/ave_pool", f"{p}/conv", 128, 1, weight_filler=xav, bias_filler=b02)
        w.relu(f"{p}/relu_conv", f"{p}/conv")
        w.fc(f"{p}/fc", f"{p}/conv", f"{p}/fc", 1024, weight_filler=xav, bias_filler=b02)
        w.relu(f"{p}/relu_fc", f"{p}/fc")
        w.dropout(f"{p}/drop_fc", f"{p}/fc", 0.7)
        w.fc(f"{p}/classifier", f"{p}/fc", f"{p}/classifier", 1000, weight_filler=xav, bias_filler=b0)
        w.layer(f"{p}/loss", "SoftmaxWithLoss", [f"{p}/classifier", "label"], f"{p}/loss{i}", loss_weight=0.3)
        w.layer(f"{p}/top-1", "Accuracy", [f"{p}/classifier", "label"], f"{p}/top-1", include=TEST)
        w.layer(f"{p}/top-5", "Accuracy", [f"{p}/classifier", "label"], f"{p}/top-5", include=TEST,
                body=[("top_k", 5)], body_key="accuracy_param")

    x = inception("3a", x)
    x = inception("3b", x)
    w.pool("pool3/3x3_s2", x, "pool3/3x3_s2", MAX, 3, 2)
    x = inception("4a", "pool3/3x3_s2")
    auxiliary(1, x)
    for tag in ("4b", "4c", "4d"):
        x = inception(tag, x)
    auxiliary(2, x)
    x = inception("4e", x)
    w.pool("pool4/3x3_s2", x, "pool4/3x3_s2", MAX, 3, 2)
    x = inception("5a", "pool4/3x3_s2")
    x = inception("5b", x)
    w.pool("pool5/7x7_s1", x, "pool5/7x7_s1", AVE, 7, 1)
    w.dropout("pool5/drop_7x7_s1", "pool5/7x7_s1", 0.4)
    w.fc("loss3/classifier", "pool5/7x7_s1", "loss3/classifier", 1000, weight_filler=xav, bias_filler=b0)
    w.loss_and_accuracy("loss3/classifier", loss="loss3/loss3", names=("loss3/top-1", "loss3/top-5"))
    return w.text()


# ------------------------------------------------------------------------------------------ ResNet-50
def resnet50(deploy: bool) -> str:
    header = ("ResNet-50 (He, Zhang, Ren & Sun 2016) in the style of the authors' Caffe release: every\n"
              "convolution (no bias) is followed by BatchNorm and a Scale with bias; bottleneck blocks\n"
              "(1x1, 3x3, 1x1) add their input (identity, or a 1x1 projection in each stage's first block) with\n"
              "an Eltwise SUM before the ReLU. Stages of 3, 4, 6, 3 blocks; the first block of stages 3-5\n"
              "subsamples by 2 in its first 1x1 convolution, as the authors' Caffe model does. 224x224 BGR crops\n"
              "minus the mean image.\n"
              + (DEPLOY_NOTE if deploy else "The Data layers read train_lmdb / val_lmdb and mean.binaryproto "
                 "(see README.md)."))
    w = NetWriter("ResNet-50", deploy, header)
    imagenet_data(w, 224, 32, 50, mean_file="mean.binaryproto")
    msra = filler("msra")

    def conv_bn(conv, suffix, bottom, n, k, *, stride=1, pad=0, relu=True) -> str:
        w.conv(conv, bottom, conv, n, k, stride=stride, pad=pad, bias=False, weight_filler=msra)
        w.bn_scale(f"bn{suffix}", f"scale{suffix}", conv)
        if relu:
            w.relu(f"{conv}_relu", conv)
        return conv

    conv_bn("conv1", "_conv1", "data", 64, 7, stride=2, pad=3)
    w.pool("pool1", "conv1", "pool1", MAX, 3, 2)
    x = "pool1"
    for stage, (blocks, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512)), start=2):
        w.comment(f"---- res{stage}: {blocks} bottleneck blocks, {width} -> {4 * width} channels")
        for b in range(blocks):
            tag = f"{stage}{chr(ord('a') + b)}"
            stride = 2 if (b == 0 and stage > 2) else 1
            if b == 0:
                shortcut = conv_bn(f"res{tag}_branch1", f"{tag}_branch1", x, 4 * width, 1, stride=stride,
                                   relu=False)
            else:
                shortcut = x
            y = conv_bn(f"res{tag}_branch2a", f"{tag}_branch2a", x, width, 1, stride=stride)
            y = conv_bn(f"res{tag}_branch2b", f"{tag}_branch2b", y, width, 3, pad=1)
            y = conv_bn(f"res{tag}_branch2c", f"{tag}_branch2c", y, 4 * width, 1, relu=False)
            w.layer(f"res{tag}", "Eltwise", [shortcut, y], f"res{tag}", body=[("operation", SUM)],
                    body_key="eltwise_param")
            w.relu(f"res{tag}_relu", f"res{tag}")
            x = f"res{tag}"
    w.pool("pool5", x, "pool5", AVE, 7, 1)
    w.fc("fc1000", "pool5", "fc1000", 1000, weight_filler=filler("gaussian", std=0.01),
         bias_filler=filler("constant"))
    w.loss_and_accuracy("fc1000")
    return w.text()


# ------------------------------------------------------------------------------------------ SqueezeNet
def squeezenet(deploy: bool) -> str:
    header = ("SqueezeNet v1.1 (Iandola et al. 2016; DeepScale's v1.1 revision): a 3x3/2 convolution of 64, eight\n"
              "Fire modules (a 1x1 squeeze convolution feeding 1x1 and 3x3 expand convolutions whose outputs are\n"
              "concatenated), dropout, a 1x1 convolution to 1000 channels and global average pooling; no fully\n"
              "connected layer. 227x227 BGR crops minus the per-channel mean.\n"
              + (DEPLOY_NOTE if deploy else "The Data layers read train_lmdb / val_lmdb (see README.md)."))
    w = NetWriter("SqueezeNet_v1.1", deploy, header)
    imagenet_data(w, 227, 32, 25, mean_value=(104, 117, 123))
    xav, b0 = filler("xavier"), filler("constant")

    def fire(i: int, bottom: str, squeeze: int, expand: int) -> str:
        p = f"fire{i}"
        w.comment(f"{p}: squeeze 1x1 {squeeze}, expand 1x1 {expand} + 3x3 {expand}")
        w.conv(f"{p}/squeeze1x1", bottom, f"{p}/squeeze1x1", squeeze, 1, weight_filler=xav, bias_filler=b0, params=())
        w.relu(f"{p}/relu_squeeze1x1", f"{p}/squeeze1x1")
        w.conv(f"{p}/expand1x1", f"{p}/squeeze1x1", f"{p}/expand1x1", expand, 1, weight_filler=xav, bias_filler=b0,
               params=())
        w.relu(f"{p}/relu_expand1x1", f"{p}/expand1x1")
        w.conv(f"{p}/expand3x3", f"{p}/squeeze1x1", f"{p}/expand3x3", expand, 3, pad=1, weight_filler=xav,
               bias_filler=b0, params=())
        w.relu(f"{p}/relu_expand3x3", f"{p}/expand3x3")
        w.concat(f"{p}/concat", [f"{p}/expand1x1", f"{p}/expand3x3"], f"{p}/concat")
        return f"{p}/concat"

    w.conv("conv1", "data", "conv1", 64, 3, stride=2, weight_filler=xav, bias_filler=b0, params=())
    w.relu("relu_conv1", "conv1")
    w.pool("pool1", "conv1", "pool1", MAX, 3, 2)
    x = fire(2, "pool1", 16, 64)
    x = fire(3, x, 16, 64)
    w.pool("pool3", x, "pool3", MAX, 3, 2)
    x = fire(4, "pool3", 32, 128)
    x = fire(5, x, 32, 128)
    w.pool("pool5", x, "pool5", MAX, 3, 2)
    x = fire(6, "pool5", 48, 192)
    x = fire(7, x, 48, 192)
    x = fire(8, x, 64, 256)
    x = fire(9, x, 64, 256)
    w.dropout("drop9", x, 0.5)
    w.conv("conv10", x, "conv10", 1000, 1, weight_filler=filler("gaussian", mean=0.0, std=0.01), bias_filler=b0,
           params=())
    w.relu("relu_conv10", "conv10")
    w.pool("pool10", "conv10", "pool10", AVE, global_pooling=True)
    # N x 1000 x 1 x 1 to N x 1000, so the scores have the shape of every other model's.
    w.layer("flatten", "Flatten", "pool10", "flatten")
    w.loss_and_accuracy("flatten")
    return w.text()


# ------------------------------------------------------------------------------------------ MobileNet
MOBILENET = [  # (output channels of the pointwise convolution, stride of the depthwise one)
    (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
    (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1),
]


def mobilenet(deploy: bool) -> str:
    header = ("MobileNet v1 1.0-224 (Howard et al. 2017): a 3x3/2 convolution of 32, then 13 depthwise separable\n"
              "blocks (a 3x3 depthwise convolution, i.e. a Convolution with group == channels, then a 1x1\n"
              "pointwise one), each convolution (no bias) followed by BatchNorm, Scale with bias and ReLU;\n"
              "global average pooling and one fully connected classifier. 224x224 BGR crops minus the\n"
              "per-channel mean, times 0.017.\n"
              + (DEPLOY_NOTE if deploy else "The Data layers read train_lmdb / val_lmdb (see README.md). The depthwise "
                 "filters do not\ndecay (decay_mult 0), as the paper advises."))
    w = NetWriter("MobileNet", deploy, header)
    imagenet_data(w, 224, 64, 50, mean_value=(103.94, 116.78, 123.68), scale=0.017)
    msra = filler("msra")

    def conv_bn_relu(name, bottom, n, k, *, stride=1, pad=0, group=1, params=()) -> str:
        w.conv(name, bottom, name, n, k, stride=stride, pad=pad, group=group, bias=False, weight_filler=msra,
               params=params)
        w.bn_scale(f"{name}/bn", f"{name}/scale", name)
        w.relu(f"{name}/relu", name)
        return name

    x = conv_bn_relu("conv1", "data", 32, 3, stride=2, pad=1)
    channels = 32
    for i, (out, stride) in enumerate(MOBILENET):
        tag = _mobilenet_tag(i)
        w.comment(f"{tag}: depthwise 3x3/{stride} over {channels} channels, pointwise 1x1 to {out}")
        x = conv_bn_relu(f"{tag}/dw", x, channels, 3, stride=stride, pad=1, group=channels,
                         params=({"lr_mult": 1, "decay_mult": 0},))
        x = conv_bn_relu(f"{tag}/sep", x, out, 1)
        channels = out
    w.pool("pool6", x, "pool6", AVE, global_pooling=True)
    w.fc("fc7", "pool6", "fc7", 1000, weight_filler=filler("gaussian", std=0.01), bias_filler=filler("constant"))
    w.loss_and_accuracy("fc7")
    return w.text()


def _mobilenet_tag(i: int) -> str:
    """conv2_1, conv2_2, conv3_1, conv3_2, conv4_1, conv4_2, conv5_1 ... conv5_6, conv6: the block names
    of the widely used Caffe port, numbered by the resolution they work at."""
    names = ["conv2_1", "conv2_2", "conv3_1", "conv3_2", "conv4_1", "conv4_2",
             "conv5_1", "conv5_2", "conv5_3", "conv5_4", "conv5_5", "conv5_6", "conv6"]
    return names[i]


# ------------------------------------------------------------------------------------------ solvers
# model: (header comment, test_iter, test_interval, display, snapshot, the recipe's fields)
SOLVERS = {
    "cifar10_quick": (
        ("Caffe's cifar10_quick recipe in one file: 4,000 iterations at 0.001 (cifar10_quick_solver), then\n"
         "1,000 at 0.0001 (cifar10_quick_solver_lr1), batch 100. The 10,000 test images are 100 batches of 100."),
        100, 500, 100, 5000,
        [("base_lr", 0.001), ("momentum", 0.9), ("weight_decay", 0.004), ("lr_policy", "multistep"),
         ("gamma", 0.1), ("stepvalue", 4000), ("max_iter", 5000)]),
    "cifar10_full": (
        ("Caffe's cifar10_full recipe in one file: 60,000 iterations at 0.001, 5,000 at 0.0001, 5,000 at\n"
         "0.00001 (cifar10_full_solver, _lr1, _lr2), batch 100. The 10,000 test images are 100 batches of 100."),
        100, 1000, 200, 10000,
        [("base_lr", 0.001), ("momentum", 0.9), ("weight_decay", 0.004), ("lr_policy", "multistep"),
         ("gamma", 0.1), ("stepvalue", (60000, 65000)), ("max_iter", 70000)]),
    "alexnet": (
        ("BVLC's AlexNet recipe: SGD with momentum 0.9, weight decay 0.0005, batch 256, learning rate 0.01\n"
         "divided by 10 every 100,000 iterations (about 20 epochs), 450,000 iterations (90 epochs).\n"
         "The 50,000 validation images are 1,000 batches of 50."),
        1000, 1000, 20, 10000,
        [("base_lr", 0.01), ("lr_policy", "step"), ("gamma", 0.1), ("stepsize", 100000), ("max_iter", 450000),
         ("momentum", 0.9), ("weight_decay", 0.0005)]),
    "caffenet": (
        ("BVLC's reference CaffeNet recipe: SGD with momentum 0.9, weight decay 0.0005, batch 256, learning rate\n"
         "0.01 divided by 10 every 100,000 iterations, 450,000 iterations (90 epochs).\n"
         "The 50,000 validation images are 1,000 batches of 50."),
        1000, 1000, 20, 10000,
        [("base_lr", 0.01), ("lr_policy", "step"), ("gamma", 0.1), ("stepsize", 100000), ("max_iter", 450000),
         ("momentum", 0.9), ("weight_decay", 0.0005)]),
    "vgg16": (
        ("The VGG paper's recipe (Simonyan & Zisserman 2015, section 3.1): SGD with momentum 0.9, weight decay\n"
         "0.0005, batch 256 (here 64 images x iter_size 4), learning rate 0.01 divided by 10 three times, 370,000\n"
         "iterations (74 epochs). The paper divided when the validation accuracy stopped improving; the fixed\n"
         "steps below stand in for that. The 50,000 validation images are 1,000 batches of 50."),
        1000, 5000, 20, 10000,
        [("test_initialization", False), ("iter_size", 4), ("base_lr", 0.01), ("lr_policy", "multistep"),
         ("gamma", 0.1), ("stepvalue", (100000, 200000, 300000)), ("max_iter", 370000), ("momentum", 0.9),
         ("weight_decay", 0.0005)]),
    "googlenet": (
        ("BVLC's GoogLeNet recipe (quick_solver, which trained the released model): SGD with momentum 0.9,\n"
         "weight decay 0.0002, batch 32, learning rate 0.01 with polynomial decay of power 0.5 to zero over\n"
         "2,400,000 iterations (60 epochs). The 50,000 validation images are 1,000 batches of 50."),
        1000, 4000, 40, 40000,
        [("test_initialization", False), ("average_loss", 40), ("base_lr", 0.01), ("lr_policy", "poly"),
         ("power", 0.5), ("max_iter", 2400000), ("momentum", 0.9), ("weight_decay", 0.0002)]),
    "resnet50": (
        ("The ResNet paper's ImageNet recipe (He et al. 2016, section 3.4): SGD with momentum 0.9, weight decay\n"
         "0.0001, batch 256 (here 32 images x iter_size 8), learning rate 0.1 divided by 10 when the error\n"
         "plateaus, up to 600,000 iterations; the fixed steps below (every 30 epochs) stand in for the\n"
         "plateaus. The 50,000 validation images are 1,000 batches of 50."),
        1000, 5000, 20, 10000,
        [("test_initialization", False), ("iter_size", 8), ("base_lr", 0.1), ("lr_policy", "multistep"),
         ("gamma", 0.1), ("stepvalue", (150000, 300000, 450000)), ("max_iter", 600000), ("momentum", 0.9),
         ("weight_decay", 0.0001)]),
    "squeezenet": (
        ("DeepScale's SqueezeNet recipe: SGD with momentum 0.9, weight decay 0.0002, batch 512 (32 images x\n"
         "iter_size 16), learning rate 0.04 decaying linearly (poly, power 1) to zero over 170,000 iterations.\n"
         "The 50,000 validation images are 2,000 batches of 25."),
        2000, 1000, 40, 1000,
        [("test_initialization", False), ("average_loss", 40), ("iter_size", 16), ("base_lr", 0.04),
         ("lr_policy", "poly"), ("power", 1.0), ("max_iter", 170000), ("momentum", 0.9),
         ("weight_decay", 0.0002), ("random_seed", 42)]),
    "mobilenet": (
        ("The MobileNet paper trained with asynchronous RMSProp in TensorFlow and gives no complete schedule; this\n"
         "is a plain SGD adaptation: momentum 0.9, a small weight decay (0.00004, as TensorFlow's reference\n"
         "MobileNet code; none on the depthwise filters, as the paper advises), batch 256 (64 images x iter_size\n"
         "4), learning rate 0.1 divided by 10 every 30 epochs, 90 epochs. The 50,000 validation images are\n"
         "1,000 batches of 50."),
        1000, 5000, 20, 10000,
        [("test_initialization", False), ("iter_size", 4), ("base_lr", 0.1), ("lr_policy", "multistep"),
         ("gamma", 0.1), ("stepvalue", (150000, 300000)), ("max_iter", 450000), ("momentum", 0.9),
         ("weight_decay", 0.00004)]),
}


def solver(model: str) -> str:
    header, test_iter, test_interval, display, snapshot, recipe = SOLVERS[model]
    head = [("net", "train_val.prototxt"), ("test_iter", test_iter), ("test_interval", test_interval)]
    tail = [("display", display), ("snapshot", snapshot), ("snapshot_prefix", model), ("solver_mode", Enum("CPU"))]
    return solver_text(header, head + recipe + tail)


MODELS = {
    "cifar10_quick": cifar10_quick, "cifar10_full": cifar10_full, "alexnet": alexnet, "caffenet": caffenet,
    "vgg16": vgg16, "googlenet": googlenet, "resnet50": resnet50, "squeezenet": squeezenet,
    "mobilenet": mobilenet,
}


def generate() -> dict[str, str]:
    """{path relative to models/: file text} for every generated file."""
    out = {}
    for model, build in MODELS.items():
        out[f"{model}/train_val.prototxt"] = build(False)
        out[f"{model}/deploy.prototxt"] = build(True)
        out[f"{model}/solver.prototxt"] = solver(model)
    return out


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for rel, text in generate().items():
        path = MODELS_DIR / rel
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote models/{rel}")
    if stale:
        print("out of date (run python models/tools/generate.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
