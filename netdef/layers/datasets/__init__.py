"""File-backed data layers, one module each: Data (db.py: an LMDB or LevelDB of Datums), ImageData
(images.py: an image list file), HDF5Data and HDF5Output (hdf5.py: HDF5 files).

The three readers share ``DataSourceLayer`` (source.py): a background thread prefetches batches,
``set_shard`` reads one rank's share of the records, and ``data_state``/``restore_data_state`` resume
a run exactly where it stopped. Importing this package registers the four layer types.
"""
from .db import DataLayer
from .hdf5 import HDF5DataLayer, HDF5OutputLayer
from .images import ImageDataLayer
from .source import DataSourceLayer

__all__ = ["DataLayer", "DataSourceLayer", "HDF5DataLayer", "HDF5OutputLayer", "ImageDataLayer"]
