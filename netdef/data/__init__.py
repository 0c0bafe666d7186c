"""Data sources, transforms and converters.

- ``netdef.data.datum``: Datum <-> numpy, mean files (BlobProto).
- ``netdef.data.image``: image decoding/encoding/resizing with Caffe's (OpenCV's) conventions.
- ``netdef.data.db``: LMDB / LevelDB access (``open_db``).
- ``netdef.data.transform``: Caffe's DataTransformer.
- ``netdef.data.convert``: convert_mnist, convert_imageset, compute_image_mean, IDX writing, MNIST download,
  scikit-learn digits.
- ``netdef.data.idx``: IDX reading.

The data layers that use them are in ``netdef.layers.datasets``.
"""
from .errors import DataError

__all__ = ["DataError"]
