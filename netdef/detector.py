"""pycaffe's ``caffe.Detector``: class scores for windows of images, R-CNN style.

    detector = netdef.Detector("deploy.prototxt", "weights.caffemodel", mean=mean, raw_scale=255,
                               channel_swap=(2, 1, 0), context_pad=16)
    detections = detector.detect_windows([("cat.jpg", [(ymin, xmin, ymax, xmax), ...]), ...])
    # [{"window": ..., "prediction": scores of the net's first output, "filename": ...}, ...]

Each window (rows ymin:ymax, columns xmin:xmax of the image as ``io.load_image`` gives it) is cut out,
warped to the net's input size and preprocessed by ``io.Transformer`` (transpose, channel swap, raw
scale, mean, input scale). With ``context_pad`` the window is first grown so that, once warped, it has
``context_pad`` pixels of its surroundings on each side, as R-CNN trained; what falls outside the
image is filled with the mean (in image space) and the window is placed where it would have been.
"""
from __future__ import annotations

import numpy as np

from . import io
from .classifier import ImageInputNet


class Detector(ImageInputNet):
    """A TEST-phase, forward-only Net with a ``transformer``, ``detect_windows`` and ``crop`` (module
    docstring); ``detect_selective_search`` needs the ``selective_search_ijcv_with_python`` module, as
    pycaffe's does."""

    def __init__(self, model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None,
                 channel_swap=None, context_pad=None):
        super().__init__(model_file, pretrained_file, mean, input_scale, raw_scale, channel_swap)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows) -> list[dict]:
        """Scores for each (image file, [window, ...]) pair's windows, in order: a list of
        {"window", "prediction", "filename"} dicts."""
        images_windows = [(filename, list(windows)) for filename, windows in images_windows]
        crops = []
        for filename, windows in images_windows:
            image = io.load_image(filename)
            crops.extend(self.crop(image, window) for window in windows)
        in_ = self.inputs[0]
        if not crops:
            return []
        batch = np.stack([self.transformer.preprocess(in_, crop) for crop in crops])
        predictions = self.forward_all(**{in_: batch})[self.outputs[0]]
        windows_in_order = [(filename, window) for filename, windows in images_windows for window in windows]
        return [{"window": window, "prediction": prediction, "filename": filename}
                for (filename, window), prediction in zip(windows_in_order, predictions)]

    def detect_selective_search(self, image_fnames) -> list[dict]:
        """``detect_windows`` over Selective Search's proposals (the selective_search_ijcv_with_python
        module, which runs MATLAB)."""
        import os

        try:
            import selective_search_ijcv_with_python as selective_search
        except ImportError:
            raise ImportError("detect_selective_search needs the selective_search_ijcv_with_python module "
                              "(and MATLAB), as pycaffe's; give your own windows to detect_windows instead") from None
        image_fnames = [os.path.abspath(f) for f in image_fnames]
        return self.detect_windows(zip(image_fnames, selective_search.get_windows(image_fnames)))

    def configure_crop(self, context_pad) -> None:
        """The crop size in image layout (H x W x K) and, with ``context_pad``, the fill for what lies
        outside the image: the transformer's mean taken back to image space (else zeros)."""
        in_ = self.inputs[0]
        to_image = np.argsort(self.transformer.transpose[in_])
        self.crop_dims = np.array(self.blobs[in_].data.shape[1:])[to_image]
        self.context_pad = context_pad
        mean = self.transformer.mean.get(in_)
        if not context_pad:
            return
        if mean is None:
            self.crop_mean = np.zeros(self.crop_dims, np.float32)
            return
        crop_mean = np.broadcast_to(mean, self.blobs[in_].data.shape[1:]).transpose(to_image).astype(np.float32)
        swap = self.transformer.channel_swap.get(in_)
        if swap is not None:
            crop_mean = crop_mean[:, :, np.argsort(swap)]
        raw_scale = self.transformer.raw_scale.get(in_)
        if raw_scale is not None:
            crop_mean = crop_mean / raw_scale
        self.crop_mean = crop_mean

    def crop(self, image, window) -> np.ndarray:
        """The window (ymin, xmin, ymax, xmax) of ``image`` (H x W x K), with its context when
        ``context_pad`` is set (module docstring)."""
        window = np.asarray(window)
        if not self.context_pad:
            return image[window[0]:window[2], window[1]:window[3]]
        crop_size = int(self.blobs[self.inputs[0]].shape[3])  # R-CNN's inputs are square
        scale = crop_size / (1.0 * crop_size - self.context_pad * 2)
        half_h = (window[2] - window[0] + 1) / 2.0
        half_w = (window[3] - window[1] + 1) / 2.0
        center = (window[0] + half_h, window[1] + half_w)
        box = np.round(np.tile(center, 2) + scale * np.array((-half_h, -half_w, half_h, half_w)))
        scale_h = crop_size / (box[2] - box[0] + 1)
        scale_w = crop_size / (box[3] - box[1] + 1)
        # Where the grown box starts outside the image, the image part is placed that far in.
        pad_y = round(max(0, -box[0]) * scale_h)
        pad_x = round(max(0, -box[1]) * scale_w)
        image_h, image_w = image.shape[:2]
        box = np.clip(box, 0.0, [image_h, image_w, image_h, image_w])
        crop_h = min(round((box[2] - box[0] + 1) * scale_h), crop_size - pad_y)
        crop_w = min(round((box[3] - box[1] + 1) * scale_w), crop_size - pad_x)
        inside = image[int(box[0]):int(box[2]), int(box[1]):int(box[3])]
        filled = np.array(np.broadcast_to(self.crop_mean, tuple(self.crop_dims)), dtype=np.float32)
        filled[pad_y:pad_y + crop_h, pad_x:pad_x + crop_w] = io.resize_image(inside, (crop_h, crop_w))
        return filled
