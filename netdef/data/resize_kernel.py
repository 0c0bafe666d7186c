"""OpenCV's 8-bit bilinear resize (``cv::resize(..., INTER_LINEAR)``) compiled: the loop of
``image.resize_reference`` row by row, without its int32 copies of the image and its gathers
(benchmarks/README.md, "Decoded items in reused memory": the NumPy version took most of the time
convert-imageset spent on each ImageNet-sized image, and ImageData's ``new_height``/``new_width`` paid
the same for every item of every batch).

The same integers as the reference in the same order (every term is non-negative, so the shifts are
the same floor divisions in any width), hence the same bytes; tests/data/test_resize_kernel.py
compares them. Serial and without the GIL (``nogil``): the data threads and convert-imageset's threads
run one image each, side by side.
"""
from __future__ import annotations

from ..threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402 (after the wait policy)


@njit(nogil=True, cache=True)
def resize_bilinear(image, xs, ax0, ax1, ys, by0, by1, out):
    """Write the C x H x W uint8 ``image`` resized into ``out`` (C x height x width uint8), from the
    column taps (``xs``: first source column, clamped; ``ax0``, ``ax1``: 11-bit int32 weights) and the
    row taps (``ys``: first source row, unclamped; ``by0``, ``by1``) of ``image._linear_taps``."""
    channels, h, w = image.shape
    height, width = out.shape[1], out.shape[2]
    next_xs = np.minimum(xs + 1, w - 1)
    # The two source rows of an output row after the horizontal pass (11-bit fixed point, >> 4), in
    # int32 as the reference computes them; the largest term, 2048 x 32640, fits.
    top = np.empty(width, np.int32)
    bottom = np.empty(width, np.int32)
    for c in range(channels):
        for y in range(height):
            upper = image[c, min(max(ys[y], 0), h - 1)]
            lower = image[c, min(max(ys[y] + 1, 0), h - 1)]
            for x in range(width):
                top[x] = (np.int32(upper[xs[x]]) * ax0[x] + np.int32(upper[next_xs[x]]) * ax1[x]) >> 4
                bottom[x] = (np.int32(lower[xs[x]]) * ax0[x] + np.int32(lower[next_xs[x]]) * ax1[x]) >> 4
            # The vertical pass with OpenCV's rounding.
            w0, w1 = by0[y], by1[y]
            row = out[c, y]
            for x in range(width):
                value = (((w0 * top[x]) >> 16) + ((w1 * bottom[x]) >> 16) + 2) >> 2
                row[x] = min(max(value, 0), 255)
