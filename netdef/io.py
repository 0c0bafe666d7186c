"""pycaffe's ``caffe.io``: images in, network inputs out.

    transformer = netdef.io.Transformer({"data": net.blobs["data"].data.shape})
    transformer.set_transpose("data", (2, 0, 1))      # H x W x K  ->  K x H x W
    transformer.set_channel_swap("data", (2, 1, 0))   # RGB -> BGR, the order Caffe's models were trained in
    transformer.set_raw_scale("data", 255)            # [0, 1] -> [0, 255]
    transformer.set_mean("data", mean)                # per channel (K,) or per pixel (K x H x W)
    net.blobs["data"].data[...] = transformer.preprocess("data", netdef.io.load_image("cat.jpg"))

Images are as pycaffe has them: ``load_image`` gives H x W x K float32 in [0, 1] with channels in
RGB order. ``preprocess`` applies, in pycaffe's order: resize to the input's H x W (bilinear),
transpose, channel swap, raw scale, mean subtraction, input scale; ``deprocess`` undoes them.

``resize_image`` interpolates bilinearly between pixel centres, without anti-aliasing: pycaffe calls
scikit-image, whose results differ from these in the last digits (and, when shrinking, by its
smoothing).
"""
from __future__ import annotations

import numpy as np
from google.protobuf.message import DecodeError

from .data.datum import (  # noqa: F401 - pycaffe's caffe.io has these too
    array_to_blobproto,
    array_to_datum,
    blobproto_to_array,
    datum_to_array,
)
from .data.image import ImageError, decode_image
from .proto import netdef_pb2 as pb


class TransformerError(ValueError):
    """A Transformer setting that does not fit its input."""


# ============================================================================================ blob vectors
def arraylist_to_blobprotovector_str(arraylist) -> bytes:
    """pycaffe's: the arrays as a serialized BlobProtoVector, one BlobProto each (``shape`` message)."""
    vector = pb.BlobProtoVector()
    vector.blobs.extend(array_to_blobproto(array) for array in arraylist)
    return vector.SerializeToString()


def blobprotovector_str_to_arraylist(serialized: bytes) -> list[np.ndarray]:
    """pycaffe's: the arrays of a serialized BlobProtoVector, in order."""
    vector = pb.BlobProtoVector()
    try:
        vector.ParseFromString(serialized)
    except DecodeError as exc:
        raise ValueError(f"blobprotovector_str_to_arraylist: not a serialized BlobProtoVector ({exc})") from None
    return [blobproto_to_array(blob) for blob in vector.blobs]


# ============================================================================================ images
def load_image(filename, color: bool = True) -> np.ndarray:
    """The image file as H x W x 3 float32 in [0, 1], RGB (``color``), or H x W x 1 grey."""
    try:
        with open(filename, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ImageError(f"could not open or find file {filename} ({exc.strerror or exc})") from None
    chw = decode_image(data, color=bool(color), name=str(filename))  # uint8, BGR when colour
    if color:
        chw = chw[::-1]
    return np.ascontiguousarray(chw.transpose(1, 2, 0), dtype=np.float32) / np.float32(255)


def _bilinear_axis(size_in: int, size_out: int):
    """Source indices and weights along one axis, pixel centres aligned (a half-pixel offset)."""
    position = (np.arange(size_out, dtype=np.float64) + 0.5) * (size_in / size_out) - 0.5
    position = np.clip(position, 0, size_in - 1)
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, size_in - 1)
    weight = (position - low).astype(np.float32)
    return low, high, weight


def resize_image(image, new_dims, interp_order: int = 1) -> np.ndarray:
    """``image`` (H x W x K) resized to ``new_dims`` (height, width), float32: bilinear
    (``interp_order`` 1) or nearest neighbour (0)."""
    image = np.asarray(image, dtype=np.float32)
    if image.ndim != 3:
        raise ValueError(f"resize_image: expected H x W x K, got shape {image.shape}")
    height, width = int(new_dims[0]), int(new_dims[1])
    if (height, width) == image.shape[:2]:
        return image.copy()
    if interp_order == 0:
        rows = np.minimum((np.arange(height) * image.shape[0]) // height, image.shape[0] - 1)
        cols = np.minimum((np.arange(width) * image.shape[1]) // width, image.shape[1] - 1)
        return image[rows][:, cols]
    if interp_order != 1:
        raise ValueError(f"resize_image: interp_order {interp_order} is not supported (0 or 1)")
    r0, r1, rw = _bilinear_axis(image.shape[0], height)
    c0, c1, cw = _bilinear_axis(image.shape[1], width)
    rows = image[r0] * (1 - rw)[:, None, None] + image[r1] * rw[:, None, None]
    return rows[:, c0] * (1 - cw)[None, :, None] + rows[:, c1] * cw[None, :, None]


def oversample(images, crop_dims) -> np.ndarray:
    """Ten crops of ``crop_dims`` (height, width) per image (N images of H x W x K): the four corners
    and the centre, then the same five mirrored left to right; (10 N) x h x w x K."""
    images = [np.asarray(im, dtype=np.float32) for im in images]
    if not images:
        return np.zeros((0, int(crop_dims[0]), int(crop_dims[1]), 0), np.float32)
    height, width = images[0].shape[:2]
    crop_h, crop_w = int(crop_dims[0]), int(crop_dims[1])
    if crop_h > height or crop_w > width:
        raise ValueError(f"oversample: crop {crop_h}x{crop_w} is larger than the image {height}x{width}")
    top = (height - crop_h) // 2
    left = (width - crop_w) // 2
    corners = [(0, 0), (0, width - crop_w), (height - crop_h, 0), (height - crop_h, width - crop_w), (top, left)]
    crops = []
    for image in images:
        if image.shape[:2] != (height, width):
            raise ValueError(f"oversample: images differ in size ({image.shape[:2]} and {(height, width)})")
        five = [image[r:r + crop_h, c:c + crop_w] for r, c in corners]
        crops.extend(five)
        crops.extend(crop[:, ::-1] for crop in five)
    return np.stack(crops).astype(np.float32, copy=False)


# ============================================================================================ the transformer
class Transformer:
    """Turns H x W x K images into the K x H x W inputs of a net, per input blob (module docstring).

    ``inputs``: {blob name: its shape (N, K, H, W)}.
    """

    def __init__(self, inputs: dict):
        self.inputs = {name: tuple(int(d) for d in shape) for name, shape in inputs.items()}
        self.transpose: dict = {}
        self.channel_swap: dict = {}
        self.raw_scale: dict = {}
        self.mean: dict = {}
        self.input_scale: dict = {}

    @classmethod
    def for_images(cls, in_: str, shape, mean=None, input_scale=None, raw_scale=None,
                   channel_swap=None) -> "Transformer":
        """pycaffe's Classifier and Detector set-up: H x W x K images into the input ``in_`` of
        ``shape``, transposed to K x H x W, then each setting that is not None."""
        transformer = cls({in_: shape})
        transformer.set_transpose(in_, (2, 0, 1))
        if mean is not None:
            transformer.set_mean(in_, mean)
        if input_scale is not None:
            transformer.set_input_scale(in_, input_scale)
        if raw_scale is not None:
            transformer.set_raw_scale(in_, raw_scale)
        if channel_swap is not None:
            transformer.set_channel_swap(in_, channel_swap)
        return transformer

    def _check_input(self, in_: str) -> None:
        if in_ not in self.inputs:
            raise TransformerError(f"{in_!r} is not one of the transformer's inputs ({', '.join(self.inputs)})")

    def set_transpose(self, in_: str, order) -> None:
        """The axis order that turns an image into the input's (e.g. (2, 0, 1): H x W x K -> K x H x W)."""
        self._check_input(in_)
        order = tuple(int(i) for i in order)
        if len(order) != len(self.inputs[in_]) - 1:
            raise TransformerError(f"{in_}: transpose order {order} does not have {len(self.inputs[in_]) - 1} axes")
        self.transpose[in_] = order

    def set_channel_swap(self, in_: str, order) -> None:
        """Reorder the channels (after the transpose), e.g. (2, 1, 0) for RGB to BGR."""
        self._check_input(in_)
        order = tuple(int(i) for i in order)
        if len(order) != self.inputs[in_][1]:
            raise TransformerError(f"{in_}: channel swap order {order} does not have the input's "
                                   f"{self.inputs[in_][1]} channels")
        self.channel_swap[in_] = order

    def set_raw_scale(self, in_: str, scale: float) -> None:
        """Multiply by ``scale`` before subtracting the mean (255 turns [0, 1] images into Caffe's pixels)."""
        self._check_input(in_)
        self.raw_scale[in_] = np.float32(scale)

    def set_mean(self, in_: str, mean) -> None:
        """Subtract ``mean``: one value per channel (K,) or a K x H x W image of the input's size."""
        self._check_input(in_)
        mean = np.asarray(mean, dtype=np.float32)
        channels_and_size = self.inputs[in_][1:]
        if mean.ndim == 1:
            if mean.shape[0] != channels_and_size[0]:
                raise TransformerError(f"{in_}: a mean of {mean.shape[0]} values for {channels_and_size[0]} channels")
            mean = mean[:, None, None]
        elif mean.shape != channels_and_size:
            raise TransformerError(f"{in_}: mean shape {mean.shape} is not the input's {channels_and_size}")
        self.mean[in_] = mean

    def set_input_scale(self, in_: str, scale: float) -> None:
        """Multiply by ``scale`` after subtracting the mean."""
        self._check_input(in_)
        self.input_scale[in_] = np.float32(scale)

    def preprocess(self, in_: str, data) -> np.ndarray:
        """One image (H x W x K) as the input ``in_`` takes it (K x H x W float32)."""
        self._check_input(in_)
        image = np.asarray(data, dtype=np.float32)
        size = self.inputs[in_][2:]
        if image.shape[:2] != size:
            image = resize_image(image, size)
        else:
            image = image.copy()
        if in_ in self.transpose:
            image = image.transpose(self.transpose[in_])
        if in_ in self.channel_swap:
            image = image[list(self.channel_swap[in_])]
        if in_ in self.raw_scale:
            image *= self.raw_scale[in_]
        if in_ in self.mean:
            image -= self.mean[in_]
        if in_ in self.input_scale:
            image *= self.input_scale[in_]
        return np.ascontiguousarray(image, dtype=np.float32)

    def deprocess(self, in_: str, data) -> np.ndarray:
        """Undo ``preprocess`` (except the resize) for one input (K x H x W, or 1 x K x H x W)."""
        self._check_input(in_)
        image = np.array(data, dtype=np.float32).squeeze()
        if image.ndim == 2:
            image = image[None]
        if in_ in self.input_scale:
            image /= self.input_scale[in_]
        if in_ in self.mean:
            image += self.mean[in_]
        if in_ in self.raw_scale:
            image /= self.raw_scale[in_]
        if in_ in self.channel_swap:
            image = image[np.argsort(self.channel_swap[in_])]
        if in_ in self.transpose:
            image = image.transpose(np.argsort(self.transpose[in_]))
        return image


__all__ = ["ImageError", "Transformer", "TransformerError", "array_to_blobproto", "array_to_datum",
           "arraylist_to_blobprotovector_str", "blobproto_to_array", "blobprotovector_str_to_arraylist", "datum_to_array", "load_image", "oversample", "resize_image"]
