"""pycaffe's ``caffe.Classifier``: class probabilities for images, with pycaffe's ten-crop oversampling.

    classifier = netdef.Classifier("deploy.prototxt", "weights.caffemodel", image_dims=(256, 256),
                                   mean=mean_per_channel, raw_scale=255, channel_swap=(2, 1, 0))
    probabilities = classifier.predict([netdef.io.load_image("cat.jpg")])   # N x classes

Images are H x W x K float arrays as ``netdef.io.load_image`` returns them. ``predict`` resizes each to
``image_dims`` (default: the net's input size), then either averages the net's output over ten crops
of the input's size (``oversample=True``: four corners, centre, and their mirror images) or takes the
centre crop, and runs the crops through ``io.Transformer`` (transpose to K x H x W, channel swap, raw
scale, mean, input scale).
"""
from __future__ import annotations

import numpy as np

from . import io
from .layers.base import TEST
from .net import Net


class ImageInputNet(Net):
    """What pycaffe's Classifier and Detector share: a TEST-phase, ``forward_only`` Net of the weights
    ``pretrained_file`` whose first input takes images through ``transformer`` (io.Transformer.for_images)."""

    def __init__(self, model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None, channel_swap=None):
        super().__init__(model_file, TEST, weights=pretrained_file)
        self.forward_only = True  # only forward runs: per-channel layers may run fused (net.py)
        if not self.inputs:
            raise ValueError(f"{model_file}: a {type(self).__name__} needs a net with an input blob (an Input "
                             f"layer or input:)")
        in_ = self.inputs[0]
        self.transformer = io.Transformer.for_images(in_, self.blobs[in_].data.shape, mean, input_scale,
                                                     raw_scale, channel_swap)


class Classifier(ImageInputNet):
    """A TEST-phase, ``forward_only`` Net with a preprocessing ``transformer`` and ``predict`` (module
    docstring)."""

    def __init__(self, model_file, pretrained_file, image_dims=None, mean=None, input_scale=None, raw_scale=None,
                 channel_swap=None):
        super().__init__(model_file, pretrained_file, mean, input_scale, raw_scale, channel_swap)
        in_ = self.inputs[0]
        self.crop_dims = np.array(self.blobs[in_].data.shape[2:])
        self.image_dims = self.crop_dims if image_dims is None else np.array(image_dims)

    def predict(self, inputs, oversample: bool = True) -> np.ndarray:
        """Output probabilities (N x classes) of the net's first output for N images (H x W x K)."""
        images = [io.resize_image(image, self.image_dims) for image in inputs]
        if oversample:
            crops = io.oversample(images, self.crop_dims)
        else:
            top, left = ((self.image_dims - self.crop_dims) // 2).astype(int)
            height, width = self.crop_dims.astype(int)
            crops = np.stack([image[top:top + height, left:left + width] for image in images])
        in_ = self.inputs[0]
        batch = np.stack([self.transformer.preprocess(in_, crop) for crop in crops]) if len(crops) else \
            np.zeros((0,) + self.blobs[in_].data.shape[1:], np.float32)
        predictions = self.forward_all(**{in_: batch})[self.outputs[0]]
        if oversample:
            predictions = predictions.reshape((len(predictions) // 10, 10, -1)).mean(axis=1)
        return predictions
