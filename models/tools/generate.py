"""Writes the zoo's prototxts: train_val.prototxt, deploy.prototxt and solver.prototxt of every model
folder listed in MODELS (LeNet and digits are written by hand and are not touched).

The nets are built with netdef's NetSpec (pycaffe's ``NetSpec``/``L``): the long definitions
(ResNet-152's train_val has 777 layers) are easier to review as the loops below than as text, and
the TRAIN and deploy nets of a model come from the same function, so they cannot drift apart. The
files are committed; tests/test_models.py checks that they equal this script's output. After
changing this script, rewrite them:

    python models/tools/generate.py            # write the files
    python models/tools/generate.py --check    # exit 1 if a committed file differs
"""
from __future__ import annotations

import io
import pathlib
import sys

from google.protobuf import text_format

from netdef import NetSpec
from netdef import layers as L

HERE = pathlib.Path(__file__).resolve().parent
MODELS_DIR = HERE.parent

GENERATED = "\n(Written by models/tools/generate.py: change that script, not this file.)"
WIDTH = 100  # a sub-message goes on one line when it fits in this many characters


def filler(kind: str, **fields) -> dict:
    return dict(type=kind, **fields)


# param specs: weights learn at the base rate and decay; biases learn twice as fast and do not decay.
W_B = (dict(lr_mult=1, decay_mult=1), dict(lr_mult=2, decay_mult=0))
FROZEN3 = (dict(lr_mult=0, decay_mult=0),) * 3  # BatchNorm's mean, variance and moving-average factor
TRAIN_ONLY, TEST_ONLY = dict(phase="TRAIN"), dict(phase="TEST")


# ------------------------------------------------------------------------------------------ text format
def _holds_messages(message) -> bool:
    return any(field.message_type is not None for field, _ in message.ListFields())


def message_lines(message, indent: str) -> list[str]:
    """``message``'s fields, one a line; a sub-message on one line when it fits and holds no message
    itself (input shapes excepted), else one field a line."""
    lines = []
    for field, value in message.ListFields():
        for item in (value if field.is_repeated else [value]):
            if field.message_type is None:
                out = io.StringIO()
                text_format.PrintField(field, item, out)
                lines.append(indent + out.getvalue().rstrip("\n"))
                continue
            one_line = f"{indent}{field.name} {{ {text_format.MessageToString(item, as_one_line=True)} }}"
            if (not _holds_messages(item) or field.name == "input_param") and len(one_line) <= WIDTH:
                lines.append(one_line)
            else:
                lines += [f"{indent}{field.name} {{", *message_lines(item, indent + "  "), f"{indent}}}"]
    return lines


def comment_lines(text: str) -> list[str]:
    return [f"# {line}".rstrip() for line in text.splitlines()]


# ------------------------------------------------------------------------------------------ nets
class NetWriter:
    """One net of a model, built as a NetSpec. ``deploy`` drops what only training needs: param specs,
    fillers, data layers, losses and accuracies.

    Each method adds a layer and returns its top (in-place layers return theirs, so the next layer
    reads after them). A top is assigned to the spec under the layer's name, which names the layer
    and, unless the layer works in place, its blob."""

    def __init__(self, name: str, deploy: bool, header: str):
        self.name = name
        self.deploy = deploy
        self.header = header.strip() + GENERATED
        self.spec = NetSpec()
        self.label = None
        self.test_data = None   # TRAIN and TEST Data layers share their tops' names: the TEST one is kept apart
        self.comments: dict[str, str] = {}  # layer name: the comment line written before it
        self._pending_comment = None

    def comment(self, text: str) -> None:
        """A comment line before the next layer."""
        self._pending_comment = text

    def add(self, name: str, top):
        self.spec[name] = top
        if self._pending_comment:
            self.comments[top.fn.name or name] = self._pending_comment
            self._pending_comment = None
        return top

    def text(self) -> str:
        layers = list(self.spec.to_proto().layer)
        if self.test_data is not None:
            layers.insert(1, self.test_data)
        lines = comment_lines(self.header) + [f'name: "{self.name}"']
        for layer in layers:
            if layer.name in self.comments:
                lines += comment_lines(self.comments[layer.name])
            lines += ["layer {", *message_lines(layer, "  "), "}"]
        return "\n".join(lines) + "\n"

    # ---------------------------------------------------------------------------------- data
    def data(self, train_batch, test_batch, transform_train, transform_test, deploy_shape):
        """Data layers reading train_lmdb / val_lmdb (TRAIN / TEST), or the deploy Input."""
        if self.deploy:
            return self.add("data", L.Input(shape=dict(dim=list(deploy_shape))))
        data, self.label = L.Data(ntop=2, include=TRAIN_ONLY, transform_param=transform_train, source="train_lmdb",
                                  batch_size=train_batch, backend="LMDB")
        test = NetSpec()
        test.data, test.label = L.Data(ntop=2, include=TEST_ONLY, transform_param=transform_test, source="val_lmdb",
                                       batch_size=test_batch, backend="LMDB")
        self.test_data = test.to_proto().layer[0]
        self.add("data", data)
        self.spec.label = self.label
        return data

    # ---------------------------------------------------------------------------------- layers
    def conv(self, name, bottom, num_output, kernel, *, stride=1, pad=0, group=1, bias=True,
             weight_filler=None, bias_filler=None, params=None):
        fields = dict(num_output=num_output)
        if not bias:
            fields["bias_term"] = False
        if pad:
            fields["pad"] = pad
        fields["kernel_size"] = kernel
        if stride != 1:
            fields["stride"] = stride
        if group != 1:
            fields["group"] = group
        if not self.deploy:
            if weight_filler:
                fields["weight_filler"] = weight_filler
            if bias and bias_filler:
                fields["bias_filler"] = bias_filler
            params = (W_B if bias else ()) if params is None else params
            if params:
                fields["param"] = list(params)
        return self.add(name, L.Convolution(bottom, **fields))

    def fc(self, name, bottom, num_output, *, weight_filler=None, bias_filler=None, params=W_B):
        fields = dict(num_output=num_output)
        if not self.deploy:
            if weight_filler:
                fields["weight_filler"] = weight_filler
            if bias_filler:
                fields["bias_filler"] = bias_filler
            if params:
                fields["param"] = list(params)
        return self.add(name, L.InnerProduct(bottom, **fields))

    def relu(self, name, bottom):
        return self.add(name, L.ReLU(bottom, in_place=True))

    def pool(self, name, bottom, method, kernel=None, stride=None, *, pad=0, global_pooling=False):
        fields = dict(pool=method)
        if global_pooling:
            fields["global_pooling"] = True
        else:
            fields.update(kernel_size=kernel, stride=stride)
            if pad:
                fields["pad"] = pad
        return self.add(name, L.Pooling(bottom, **fields))

    def lrn(self, name, bottom, local_size, alpha, beta, region=None):
        fields = dict(local_size=local_size, alpha=alpha, beta=beta)
        if region:
            fields["norm_region"] = region
        return self.add(name, L.LRN(bottom, **fields))

    def dropout(self, name, bottom, ratio):
        return self.add(name, L.Dropout(bottom, in_place=True, dropout_ratio=ratio))

    def concat(self, name, bottoms):
        return self.add(name, L.Concat(*bottoms))

    def eltwise_sum(self, name, *bottoms):
        return self.add(name, L.Eltwise(*bottoms, operation="SUM"))

    def flatten(self, name, bottom):
        return self.add(name, L.Flatten(bottom))

    def bn_scale(self, bn_name, scale_name, bottom):
        """Caffe-style batch normalization: BatchNorm (statistics only, in place) then a learned Scale
        with bias. The statistics are not learned: their lr_mult is 0."""
        frozen = {} if self.deploy else dict(param=list(FROZEN3))
        normalized = self.add(bn_name, L.BatchNorm(bottom, in_place=True, **frozen))
        return self.add(scale_name, L.Scale(normalized, in_place=True, bias_term=True))

    def loss_and_accuracy(self, bottom, *, loss="loss", top5=True, prob="prob", names=None) -> None:
        """Softmax loss (and TEST accuracies) in training; class probabilities in deploy."""
        if self.deploy:
            self.add(prob, L.Softmax(bottom))
            return
        acc1, acc5 = names or ("accuracy", "accuracy_top5")
        self.add(acc1, L.Accuracy(bottom, self.label, include=TEST_ONLY))
        if top5:
            self.add(acc5, L.Accuracy(bottom, self.label, include=TEST_ONLY, top_k=5))
        self.add(loss, L.SoftmaxWithLoss(bottom, self.label))


def imagenet_transform(crop, *, mirror, mean_file=None, mean_value=(), scale=None) -> dict:
    transform = {}
    if scale is not None:
        transform["scale"] = scale
    if mirror:
        transform["mirror"] = True
    transform["crop_size"] = crop
    if mean_file:
        transform["mean_file"] = mean_file
    if mean_value:
        transform["mean_value"] = list(mean_value)
    return transform


def imagenet_data(w: NetWriter, crop, train_batch, test_batch, **mean):
    return w.data(train_batch, test_batch, imagenet_transform(crop, mirror=True, **mean),
                  imagenet_transform(crop, mirror=False, **mean), (10, 3, crop, crop))


DEPLOY_NOTE = ("Deployment net: the layers of train_val.prototxt behind an Input of 10 images (Caffe's ten crops),\n"
               "ending in class probabilities.")


# ------------------------------------------------------------------------------------------ CIFAR-10
def _cifar10(deploy: bool, name: str, header: str, full: bool) -> str:
    w = NetWriter(name, deploy, header)
    mean = dict(mean_file="mean.binaryproto")
    x = w.data(100, 100, mean, mean, (1, 3, 32, 32))
    wb = (dict(lr_mult=1), dict(lr_mult=2))
    const = filler("constant")

    def conv(i: int, bottom, n: int, std: float):
        return w.conv(f"conv{i}", bottom, n, 5, pad=2, weight_filler=filler("gaussian", std=std), bias_filler=const,
                      params=wb)

    x = conv(1, x, 32, 0.0001)
    x = w.pool("pool1", x, "MAX", 3, 2)
    x = w.relu("relu1", x)
    if full:
        x = w.lrn("norm1", x, 3, 0.00005, 0.75, "WITHIN_CHANNEL")
    x = w.relu("relu2", conv(2, x, 32, 0.01))
    x = w.pool("pool2", x, "AVE", 3, 2)
    if full:
        x = w.lrn("norm2", x, 3, 0.00005, 0.75, "WITHIN_CHANNEL")
    x = w.relu("relu3", conv(3, x, 64, 0.01))
    x = w.pool("pool3", x, "AVE", 3, 2)
    if full:
        if not deploy:
            w.comment("The only fully connected layer: its weights decay 250 times harder than the convolutions'.")
        x = w.fc("ip1", x, 10, weight_filler=filler("gaussian", std=0.01), bias_filler=const,
                 params=(dict(lr_mult=1, decay_mult=250), dict(lr_mult=2, decay_mult=0)))
    else:
        x = w.fc("ip1", x, 64, weight_filler=filler("gaussian", std=0.1), bias_filler=const, params=wb)
        x = w.fc("ip2", x, 10, weight_filler=filler("gaussian", std=0.1), bias_filler=const, params=wb)
    w.loss_and_accuracy(x, top5=False)
    return w.text()


def _cifar10_header(description: str, deploy: bool) -> str:
    return description + ("Deployment net: Input of one image, ending in class probabilities." if deploy else
                          "The Data layers read train_lmdb / val_lmdb and mean.binaryproto (see README.md).")


def cifar10_quick(deploy: bool) -> str:
    header = _cifar10_header(
        "CIFAR-10 quick (Caffe's cifar10_quick example): three 5x5 convolution stages of 32, 32 and 64\n"
        "filters with max/average pooling, then fully connected 64 and 10. 32x32 RGB images, mean-subtracted.\n",
        deploy)
    return _cifar10(deploy, "CIFAR10_quick", header, full=False)


def cifar10_full(deploy: bool) -> str:
    header = _cifar10_header(
        "CIFAR-10 full (Caffe's cifar10_full example): cifar10_quick with local response normalization\n"
        "within channels after the first two stages and a single fully connected layer of 10 outputs.\n", deploy)
    return _cifar10(deploy, "CIFAR10_full", header, full=True)


# ------------------------------------------------------------------------------------------ AlexNet
def _alexnet(deploy: bool, name: str, header: str, pool_before_norm: bool) -> str:
    w = NetWriter(name, deploy, header)
    x = imagenet_data(w, 227, 256, 50, mean_file="mean.binaryproto")

    def g(std):
        return filler("gaussian", std=std)

    c0, c1 = filler("constant", value=0), filler("constant", value=0.1)

    def pool_norm(i: int, bottom):
        if pool_before_norm:
            return w.lrn(f"norm{i}", w.pool(f"pool{i}", bottom, "MAX", 3, 2), 5, 0.0001, 0.75)
        return w.pool(f"pool{i}", w.lrn(f"norm{i}", bottom, 5, 0.0001, 0.75), "MAX", 3, 2)

    x = w.relu("relu1", w.conv("conv1", x, 96, 11, stride=4, weight_filler=g(0.01), bias_filler=c0))
    x = pool_norm(1, x)
    x = w.relu("relu2", w.conv("conv2", x, 256, 5, pad=2, group=2, weight_filler=g(0.01), bias_filler=c1))
    x = pool_norm(2, x)
    x = w.relu("relu3", w.conv("conv3", x, 384, 3, pad=1, weight_filler=g(0.01), bias_filler=c0))
    x = w.relu("relu4", w.conv("conv4", x, 384, 3, pad=1, group=2, weight_filler=g(0.01), bias_filler=c1))
    x = w.relu("relu5", w.conv("conv5", x, 256, 3, pad=1, group=2, weight_filler=g(0.01), bias_filler=c1))
    x = w.pool("pool5", x, "MAX", 3, 2)
    x = w.relu("relu6", w.fc("fc6", x, 4096, weight_filler=g(0.005), bias_filler=c1))
    x = w.dropout("drop6", x, 0.5)
    x = w.relu("relu7", w.fc("fc7", x, 4096, weight_filler=g(0.005), bias_filler=c1))
    x = w.dropout("drop7", x, 0.5)
    x = w.fc("fc8", x, 1000, weight_filler=g(0.01), bias_filler=c0)
    w.loss_and_accuracy(x)
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
    x = imagenet_data(w, 224, 64, 50, mean_value=(103.939, 116.779, 123.68))
    for stage, (width, depth) in enumerate(((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)), start=1):
        for i in range(1, depth + 1):
            x = w.conv(f"conv{stage}_{i}", x, width, 3, pad=1, weight_filler=filler("msra"),
                       bias_filler=filler("constant"))
            x = w.relu(f"relu{stage}_{i}", x)
        x = w.pool(f"pool{stage}", x, "MAX", 2, 2)
    c1 = filler("constant", value=0.1)
    x = w.relu("relu6", w.fc("fc6", x, 4096, weight_filler=filler("gaussian", std=0.005), bias_filler=c1))
    x = w.dropout("drop6", x, 0.5)
    x = w.relu("relu7", w.fc("fc7", x, 4096, weight_filler=filler("gaussian", std=0.005), bias_filler=c1))
    x = w.dropout("drop7", x, 0.5)
    x = w.fc("fc8", x, 1000, weight_filler=filler("gaussian", std=0.01), bias_filler=filler("constant"))
    w.loss_and_accuracy(x)
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
    x = imagenet_data(w, 224, 32, 50, mean_value=(104, 117, 123))
    xav, b02, b0 = filler("xavier"), filler("constant", value=0.2), filler("constant", value=0)

    def conv_relu(name: str, relu: str, bottom, n: int, k: int, **kw):
        return w.relu(relu, w.conv(name, bottom, n, k, weight_filler=xav, bias_filler=b02, **kw))

    x = conv_relu("conv1/7x7_s2", "conv1/relu_7x7", x, 64, 7, pad=3, stride=2)
    x = w.pool("pool1/3x3_s2", x, "MAX", 3, 2)
    x = w.lrn("pool1/norm1", x, 5, 0.0001, 0.75)
    x = conv_relu("conv2/3x3_reduce", "conv2/relu_3x3_reduce", x, 64, 1)
    x = conv_relu("conv2/3x3", "conv2/relu_3x3", x, 192, 3, pad=1)
    x = w.lrn("conv2/norm2", x, 5, 0.0001, 0.75)
    x = w.pool("pool2/3x3_s2", x, "MAX", 3, 2)

    def inception(tag: str, bottom):
        n1, r3, n3, r5, n5, pp = INCEPTION[tag]
        p = f"inception_{tag}"
        w.comment(f"{p}: 1x1 {n1}, 1x1 {r3} -> 3x3 {n3}, 1x1 {r5} -> 5x5 {n5}, 3x3 max pool -> 1x1 {pp}; "
                  f"{n1 + n3 + n5 + pp} channels out")
        one = conv_relu(f"{p}/1x1", f"{p}/relu_1x1", bottom, n1, 1)
        reduced = conv_relu(f"{p}/3x3_reduce", f"{p}/relu_3x3_reduce", bottom, r3, 1)
        three = conv_relu(f"{p}/3x3", f"{p}/relu_3x3", reduced, n3, 3, pad=1)
        reduced = conv_relu(f"{p}/5x5_reduce", f"{p}/relu_5x5_reduce", bottom, r5, 1)
        five = conv_relu(f"{p}/5x5", f"{p}/relu_5x5", reduced, n5, 5, pad=2)
        pooled = w.pool(f"{p}/pool", bottom, "MAX", 3, 1, pad=1)
        projected = conv_relu(f"{p}/pool_proj", f"{p}/relu_pool_proj", pooled, pp, 1)
        return w.concat(f"{p}/output", [one, three, five, projected])

    def auxiliary(i: int, bottom) -> None:
        if deploy:
            return
        p = f"loss{i}"
        w.comment(f"Auxiliary classifier {i} (training only): 5x5/3 average pool, 1x1 conv 128, fc 1024, "
                  "dropout 0.7, loss weight 0.3")
        y = w.pool(f"{p}/ave_pool", bottom, "AVE", 5, 3)
        y = conv_relu(f"{p}/conv", f"{p}/relu_conv", y, 128, 1)
        y = w.relu(f"{p}/relu_fc", w.fc(f"{p}/fc", y, 1024, weight_filler=xav, bias_filler=b02))
        y = w.dropout(f"{p}/drop_fc", y, 0.7)
        y = w.fc(f"{p}/classifier", y, 1000, weight_filler=xav, bias_filler=b0)
        w.add(f"{p}/loss{i}", L.SoftmaxWithLoss(y, w.label, name=f"{p}/loss", loss_weight=0.3))
        w.add(f"{p}/top-1", L.Accuracy(y, w.label, include=TEST_ONLY))
        w.add(f"{p}/top-5", L.Accuracy(y, w.label, include=TEST_ONLY, top_k=5))

    x = inception("3a", x)
    x = inception("3b", x)
    x = w.pool("pool3/3x3_s2", x, "MAX", 3, 2)
    x = inception("4a", x)
    auxiliary(1, x)
    for tag in ("4b", "4c", "4d"):
        x = inception(tag, x)
    auxiliary(2, x)
    x = inception("4e", x)
    x = w.pool("pool4/3x3_s2", x, "MAX", 3, 2)
    x = inception("5a", x)
    x = inception("5b", x)
    x = w.pool("pool5/7x7_s1", x, "AVE", 7, 1)
    x = w.dropout("pool5/drop_7x7_s1", x, 0.4)
    x = w.fc("loss3/classifier", x, 1000, weight_filler=xav, bias_filler=b0)
    w.loss_and_accuracy(x, loss="loss3/loss3", names=("loss3/top-1", "loss3/top-5"))
    return w.text()


# ------------------------------------------------------------------------------------------ ResNet
RESNET_STAGES = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def _resnet_block_tag(depth: int, stage: int, block: int, blocks: int) -> str:
    """2a, 2b, 2c ...; in the authors' ResNet-101 and -152 a stage of more than three blocks numbers
    them after the first: 4a, 4b1, 4b2 ... 4b22."""
    if depth > 50 and blocks > 3 and block > 0:
        return f"{stage}b{block}"
    return f"{stage}{chr(ord('a') + block)}"


def _resnet(depth: int, deploy: bool) -> str:
    stages = RESNET_STAGES[depth]
    header = (f"ResNet-{depth} (He, Zhang, Ren & Sun 2016) in the style of the authors' Caffe release: every\n"
              "convolution (no bias) is followed by BatchNorm and a Scale with bias; bottleneck blocks\n"
              "(1x1, 3x3, 1x1) add their input (identity, or a 1x1 projection in each stage's first block) with\n"
              f"an Eltwise SUM before the ReLU. Stages of {', '.join(map(str, stages))} blocks; the first block of "
              "stages 3-5\nsubsamples by 2 in its first 1x1 convolution, as the authors' Caffe model does. 224x224 "
              "BGR crops\nminus the mean image.\n"
              + (DEPLOY_NOTE if deploy else "The Data layers read train_lmdb / val_lmdb and mean.binaryproto "
                 "(see README.md)."))
    w = NetWriter(f"ResNet-{depth}", deploy, header)
    x = imagenet_data(w, 224, 32, 50, mean_file="mean.binaryproto")
    msra = filler("msra")

    def conv_bn(conv: str, suffix: str, bottom, n: int, k: int, *, stride=1, pad=0, relu=True):
        y = w.conv(conv, bottom, n, k, stride=stride, pad=pad, bias=False, weight_filler=msra)
        y = w.bn_scale(f"bn{suffix}", f"scale{suffix}", y)
        return w.relu(f"{conv}_relu", y) if relu else y

    x = conv_bn("conv1", "_conv1", x, 64, 7, stride=2, pad=3)
    x = w.pool("pool1", x, "MAX", 3, 2)
    for stage, (blocks, width) in enumerate(zip(stages, (64, 128, 256, 512)), start=2):
        w.comment(f"---- res{stage}: {blocks} bottleneck blocks, {width} -> {4 * width} channels")
        for b in range(blocks):
            tag = _resnet_block_tag(depth, stage, b, blocks)
            stride = 2 if (b == 0 and stage > 2) else 1
            if b == 0:
                shortcut = conv_bn(f"res{tag}_branch1", f"{tag}_branch1", x, 4 * width, 1, stride=stride, relu=False)
            else:
                shortcut = x
            y = conv_bn(f"res{tag}_branch2a", f"{tag}_branch2a", x, width, 1, stride=stride)
            y = conv_bn(f"res{tag}_branch2b", f"{tag}_branch2b", y, width, 3, pad=1)
            y = conv_bn(f"res{tag}_branch2c", f"{tag}_branch2c", y, 4 * width, 1, relu=False)
            x = w.relu(f"res{tag}_relu", w.eltwise_sum(f"res{tag}", shortcut, y))
    x = w.pool("pool5", x, "AVE", 7, 1)
    x = w.fc("fc1000", x, 1000, weight_filler=filler("gaussian", std=0.01), bias_filler=filler("constant"))
    w.loss_and_accuracy(x)
    return w.text()


def resnet50(deploy: bool) -> str:
    return _resnet(50, deploy)


def resnet101(deploy: bool) -> str:
    return _resnet(101, deploy)


def resnet152(deploy: bool) -> str:
    return _resnet(152, deploy)


# ------------------------------------------------------------------------------------------ SqueezeNet
def _fire(w: NetWriter, i: int, bottom, squeeze: int, expand: int):
    """A Fire module: a 1x1 squeeze convolution feeding 1x1 and 3x3 expand convolutions, concatenated."""
    p = f"fire{i}"
    xav, b0 = filler("xavier"), filler("constant")
    w.comment(f"{p}: squeeze 1x1 {squeeze}, expand 1x1 {expand} + 3x3 {expand}")
    squeezed = w.conv(f"{p}/squeeze1x1", bottom, squeeze, 1, weight_filler=xav, bias_filler=b0, params=())
    squeezed = w.relu(f"{p}/relu_squeeze1x1", squeezed)
    one = w.conv(f"{p}/expand1x1", squeezed, expand, 1, weight_filler=xav, bias_filler=b0, params=())
    one = w.relu(f"{p}/relu_expand1x1", one)
    three = w.conv(f"{p}/expand3x3", squeezed, expand, 3, pad=1, weight_filler=xav, bias_filler=b0, params=())
    three = w.relu(f"{p}/relu_expand3x3", three)
    return w.concat(f"{p}/concat", [one, three])


def _squeezenet_head(w: NetWriter, x, conv10_pad: int) -> None:
    """Dropout, conv10 (1x1 to 1000 classes), global average pooling and a Flatten to N x 1000."""
    x = w.dropout("drop9", x, 0.5)
    x = w.conv("conv10", x, 1000, 1, pad=conv10_pad, weight_filler=filler("gaussian", mean=0.0, std=0.01),
               bias_filler=filler("constant"), params=())
    x = w.relu("relu_conv10", x)
    x = w.pool("pool10", x, "AVE", global_pooling=True)
    w.comment("N x 1000 x 1 x 1 to N x 1000, so the scores have the shape of every other model's.")
    w.loss_and_accuracy(w.flatten("flatten", x))


def _squeezenet_header(version: str, body: str, deploy: bool) -> str:
    return (f"SqueezeNet v{version} (Iandola et al. 2016; {body}).\n"
            "A Fire module is a 1x1 squeeze convolution feeding 1x1 and 3x3 expand convolutions whose outputs are\n"
            "concatenated; no fully connected layer. 227x227 BGR crops minus the per-channel mean.\n"
            + (DEPLOY_NOTE if deploy else "The Data layers read train_lmdb / val_lmdb (see README.md)."))


def squeezenet(deploy: bool) -> str:
    header = _squeezenet_header("1.1", "DeepScale's v1.1 revision): a 3x3/2 convolution of 64, eight Fire\n"
                                "modules, dropout, a 1x1 convolution to 1000 channels and global average pooling",
                                deploy)
    w = NetWriter("SqueezeNet_v1.1", deploy, header)
    x = imagenet_data(w, 227, 32, 25, mean_value=(104, 117, 123))
    x = w.conv("conv1", x, 64, 3, stride=2, weight_filler=filler("xavier"), bias_filler=filler("constant"),
               params=())
    x = w.pool("pool1", w.relu("relu_conv1", x), "MAX", 3, 2)
    x = _fire(w, 3, _fire(w, 2, x, 16, 64), 16, 64)
    x = w.pool("pool3", x, "MAX", 3, 2)
    x = _fire(w, 5, _fire(w, 4, x, 32, 128), 32, 128)
    x = w.pool("pool5", x, "MAX", 3, 2)
    for i, (squeeze, expand) in zip(range(6, 10), ((48, 192), (48, 192), (64, 256), (64, 256))):
        x = _fire(w, i, x, squeeze, expand)
    _squeezenet_head(w, x, conv10_pad=0)
    return w.text()


def squeezenet_v1_0(deploy: bool) -> str:
    header = _squeezenet_header("1.0", "the paper's network, as DeepScale released it): a 7x7/2 convolution of\n"
                                "96, eight Fire modules with max pooling after conv1, fire4 and fire8, dropout, a 1x1\n"
                                "convolution to 1000 channels (pad 1, as the release) and global average pooling",
                                deploy)
    w = NetWriter("SqueezeNet_v1.0", deploy, header)
    x = imagenet_data(w, 227, 32, 25, mean_value=(104, 117, 123))
    x = w.conv("conv1", x, 96, 7, stride=2, weight_filler=filler("xavier"), bias_filler=filler("constant"),
               params=())
    x = w.pool("pool1", w.relu("relu_conv1", x), "MAX", 3, 2)
    x = _fire(w, 2, x, 16, 64)
    x = _fire(w, 3, x, 16, 64)
    x = _fire(w, 4, x, 32, 128)
    x = w.pool("pool4", x, "MAX", 3, 2)
    for i, (squeeze, expand) in zip(range(5, 9), ((32, 128), (48, 192), (48, 192), (64, 256))):
        x = _fire(w, i, x, squeeze, expand)
    x = w.pool("pool8", x, "MAX", 3, 2)
    x = _fire(w, 9, x, 64, 256)
    _squeezenet_head(w, x, conv10_pad=1)
    return w.text()


# ------------------------------------------------------------------------------------------ MobileNet
MOBILENET = [  # (output channels of the pointwise convolution, stride of the depthwise one)
    (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
    (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1),
]
# The block names of the widely used Caffe port, numbered by the resolution they work at.
MOBILENET_TAGS = ["conv2_1", "conv2_2", "conv3_1", "conv3_2", "conv4_1", "conv4_2",
                  "conv5_1", "conv5_2", "conv5_3", "conv5_4", "conv5_5", "conv5_6", "conv6"]
MOBILENET_MEAN = dict(mean_value=(103.94, 116.78, 123.68), scale=0.017)


def mobilenet(deploy: bool) -> str:
    header = ("MobileNet v1 1.0-224 (Howard et al. 2017): a 3x3/2 convolution of 32, then 13 depthwise separable\n"
              "blocks (a 3x3 depthwise convolution, i.e. a Convolution with group == channels, then a 1x1\n"
              "pointwise one), each convolution (no bias) followed by BatchNorm, Scale with bias and ReLU;\n"
              "global average pooling and one fully connected classifier. 224x224 BGR crops minus the\n"
              "per-channel mean, times 0.017.\n"
              + (DEPLOY_NOTE if deploy else "The Data layers read train_lmdb / val_lmdb (see README.md). The depthwise "
                 "filters do not\ndecay (decay_mult 0), as the paper advises."))
    w = NetWriter("MobileNet", deploy, header)
    x = imagenet_data(w, 224, 64, 50, **MOBILENET_MEAN)

    def conv_bn_relu(name: str, bottom, n: int, k: int, *, stride=1, pad=0, group=1, params=()):
        y = w.conv(name, bottom, n, k, stride=stride, pad=pad, group=group, bias=False, weight_filler=filler("msra"),
                   params=params)
        return w.relu(f"{name}/relu", w.bn_scale(f"{name}/bn", f"{name}/scale", y))

    x = conv_bn_relu("conv1", x, 32, 3, stride=2, pad=1)
    channels = 32
    for tag, (out, stride) in zip(MOBILENET_TAGS, MOBILENET):
        w.comment(f"{tag}: depthwise 3x3/{stride} over {channels} channels, pointwise 1x1 to {out}")
        x = conv_bn_relu(f"{tag}/dw", x, channels, 3, stride=stride, pad=1, group=channels,
                         params=(dict(lr_mult=1, decay_mult=0),))
        x = conv_bn_relu(f"{tag}/sep", x, out, 1)
        channels = out
    x = w.pool("pool6", x, "AVE", global_pooling=True)
    x = w.fc("fc7", x, 1000, weight_filler=filler("gaussian", std=0.01), bias_filler=filler("constant"))
    w.loss_and_accuracy(x)
    return w.text()


# (expansion t, output channels c, repeats n, stride s of the first repeat): the paper's table 2.
MOBILENET_V2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))
# The 17 blocks' names in the widely used Caffe port (shicai/MobileNet-Caffe).
MOBILENET_V2_TAGS = ["conv2_1", "conv2_2", "conv3_1", "conv3_2", "conv4_1", "conv4_2", "conv4_3", "conv4_4",
                     "conv4_5", "conv4_6", "conv4_7", "conv5_1", "conv5_2", "conv5_3", "conv6_1", "conv6_2", "conv6_3"]


def mobilenet_v2(deploy: bool) -> str:
    header = ("MobileNet v2 1.0-224 (Sandler et al. 2018): a 3x3/2 convolution of 32, 17 inverted residual blocks\n"
              "(a 1x1 expansion to t times the channels, a 3x3 depthwise convolution, i.e. a Convolution with\n"
              "group == channels, and a linear 1x1 projection; the input added back where the shapes agree), a 1x1\n"
              "convolution to 1280, global average pooling and one fully connected classifier. Every convolution\n"
              "(no bias) is followed by BatchNorm and Scale with bias, and all but the projections by ReLU (the\n"
              "paper's ReLU6 as the Caffe ports have it). 224x224 BGR crops minus the per-channel mean, times 0.017.\n"
              + (DEPLOY_NOTE if deploy else "The Data layers read train_lmdb / val_lmdb (see README.md)."))
    w = NetWriter("MobileNetV2", deploy, header)
    x = imagenet_data(w, 224, 64, 50, **MOBILENET_MEAN)

    def conv_bn(name: str, bottom, n: int, k: int, relu: str | None, *, stride=1, group=1):
        y = w.conv(name, bottom, n, k, stride=stride, pad=(k - 1) // 2, group=group, bias=False,
                   weight_filler=filler("msra"))
        y = w.bn_scale(f"{name}/bn", f"{name}/scale", y)
        return w.relu(relu, y) if relu else y

    x = conv_bn("conv1", x, 32, 3, "relu1", stride=2)
    tags = iter(MOBILENET_V2_TAGS)
    channels = 32
    for t, c, n, s in MOBILENET_V2:
        for i in range(n):
            tag = next(tags)
            number = tag[len("conv"):]
            stride = s if i == 0 else 1
            hidden = channels * t
            w.comment(f"{tag}: expand 1x1 to {hidden}, depthwise 3x3/{stride}, project 1x1 to {c}"
                      + (", plus the input" if stride == 1 and channels == c else ""))
            y = x if t == 1 else conv_bn(f"{tag}/expand", x, hidden, 1, f"relu{number}/expand")
            y = conv_bn(f"{tag}/dwise", y, hidden, 3, f"relu{number}/dwise", stride=stride, group=hidden)
            y = conv_bn(f"{tag}/linear", y, c, 1, None)
            x = w.eltwise_sum(f"block_{number}", x, y) if stride == 1 and channels == c else y
            channels = c
    x = conv_bn("conv6_4", x, 1280, 1, "relu6_4")
    x = w.pool("pool6", x, "AVE", global_pooling=True)
    x = w.fc("fc7", x, 1000, weight_filler=filler("gaussian", std=0.01), bias_filler=filler("constant"))
    w.loss_and_accuracy(x)
    return w.text()


# ------------------------------------------------------------------------------------------ solvers
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


def solver_text(header: str, fields: list) -> str:
    lines = comment_lines(header.strip() + GENERATED)
    for key, value in fields:
        values = value if isinstance(value, tuple) else (value,)
        lines.extend(f"{key}: {_value(v)}" for v in values)
    return "\n".join(lines) + "\n"


# The three ResNets train alike: the paper trained them all with this recipe.
RESNET_SOLVER = (
    ("The ResNet paper's ImageNet recipe (He et al. 2016, section 3.4): SGD with momentum 0.9, weight decay\n"
     "0.0001, batch 256 (here 32 images x iter_size 8), learning rate 0.1 divided by 10 when the error\n"
     "plateaus, up to 600,000 iterations; the fixed steps below (every 30 epochs) stand in for the\n"
     "plateaus. The 50,000 validation images are 1,000 batches of 50."),
    1000, 5000, 20, 10000,
    [("test_initialization", False), ("iter_size", 8), ("base_lr", 0.1), ("lr_policy", "multistep"),
     ("gamma", 0.1), ("stepvalue", (150000, 300000, 450000)), ("max_iter", 600000), ("momentum", 0.9),
     ("weight_decay", 0.0001)])
# DeepScale released one recipe for both SqueezeNets.
SQUEEZENET_SOLVER = (
    ("DeepScale's SqueezeNet recipe (forresti/SqueezeNet, the same for v1.0 and v1.1): SGD with momentum 0.9,\n"
     "weight decay 0.0002, batch 512 (32 images x iter_size 16), learning rate 0.04 decaying linearly (poly,\n"
     "power 1) to zero over 170,000 iterations. The 50,000 validation images are 2,000 batches of 25."),
    2000, 1000, 40, 1000,
    [("test_initialization", False), ("average_loss", 40), ("iter_size", 16), ("base_lr", 0.04),
     ("lr_policy", "poly"), ("power", 1.0), ("max_iter", 170000), ("momentum", 0.9),
     ("weight_decay", 0.0002), ("random_seed", 42)])
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
    "resnet50": RESNET_SOLVER,
    "resnet101": RESNET_SOLVER,
    "resnet152": RESNET_SOLVER,
    "squeezenet": SQUEEZENET_SOLVER,
    "squeezenet_v1_0": SQUEEZENET_SOLVER,
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
    "mobilenet_v2": (
        ("MobileNet v2 with the paper's learning rate (0.045, times 0.98 after every epoch) and weight decay\n"
         "(0.00004), in torchvision's reference recipe that reproduced it with SGD instead of the paper's\n"
         "asynchronous RMSProp (Caffe's RMSProp takes no momentum): momentum 0.9, batch 256 (64 images x\n"
         "iter_size 4), 300 epochs of 5,005 iterations. The 50,000 validation images are 1,000 batches of 50."),
        1000, 5005, 20, 10000,
        [("test_initialization", False), ("iter_size", 4), ("base_lr", 0.045), ("lr_policy", "step"),
         ("gamma", 0.98), ("stepsize", 5005), ("max_iter", 1501500), ("momentum", 0.9),
         ("weight_decay", 0.00004)]),
}


def solver(model: str) -> str:
    header, test_iter, test_interval, display, snapshot, recipe = SOLVERS[model]
    head = [("net", "train_val.prototxt"), ("test_iter", test_iter), ("test_interval", test_interval)]
    tail = [("display", display), ("snapshot", snapshot), ("snapshot_prefix", model), ("solver_mode", Enum("CPU"))]
    return solver_text(header, head + recipe + tail)


MODELS = {
    "cifar10_quick": cifar10_quick, "cifar10_full": cifar10_full, "alexnet": alexnet, "caffenet": caffenet,
    "vgg16": vgg16, "googlenet": googlenet, "resnet50": resnet50, "resnet101": resnet101, "resnet152": resnet152,
    "squeezenet": squeezenet, "squeezenet_v1_0": squeezenet_v1_0, "mobilenet": mobilenet,
    "mobilenet_v2": mobilenet_v2,
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
