"""HDF5 data sets that declare more than they hold are refused before reading (issue 32, class 1)."""
import resource

import h5py
import numpy as np
import pytest

import netdef
from netdef.data.hdf5 import read_dataset
from netdef.memory import BlobTooLargeError
from netdef.net import NetError

#: 2**40 float32 values: 4 TiB declared, more than any machine these tests run on.
HUGE_ROWS = 2**40


def write_declaring_file(path, rows=HUGE_ROWS):
    """A real HDF5 file of a few KB whose chunked data sets declare ``rows`` rows, never written: reading
    them back gives the fill value, ``rows`` of them."""
    with h5py.File(path, "w") as handle:
        chunk = min(rows, 1024)
        handle.create_dataset("data", shape=(rows, 1), dtype=np.float32, chunks=(chunk, 1), fillvalue=0.5)
        handle.create_dataset("label", shape=(rows,), dtype=np.float32, chunks=(chunk,), fillvalue=1)
    return path


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_the_file_is_small_and_declares_terabytes(tmp_path):
    path = write_declaring_file(tmp_path / "bomb.h5")
    assert path.stat().st_size < 20_000
    with h5py.File(path, "r") as handle:
        assert handle["data"].size * 4 == 4 * HUGE_ROWS


def test_hdf5_data_refuses_a_declared_size_naming_file_data_set_and_size(tmp_path):
    path = write_declaring_file(tmp_path / "bomb.h5")
    (tmp_path / "list.txt").write_text(f"{path}\n")
    net = ('layer { name: "h5" type: "HDF5Data" top: "data" top: "label" '
           f'hdf5_data_param {{ source: "{tmp_path / "list.txt"}" batch_size: 2 }} }}')
    before = peak_rss_bytes()
    with pytest.raises(NetError) as error:
        netdef.Net(net, netdef.TRAIN)
    assert peak_rss_bytes() - before < 50 * 2**20
    message = str(error.value)
    assert f"HDF5 file {path}: data set '/data' of shape ({HUGE_ROWS}, 1) needs {4 * HUGE_ROWS} bytes, more " \
           f"than" in message
    assert message.startswith("<prototxt string>:1: layer 'h5' (HDF5Data)")


def test_hdf5_weights_compare_the_declared_shape_before_reading(tmp_path):
    path = tmp_path / "weights.caffemodel.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("data/ip/0", shape=(HUGE_ROWS, 3), dtype=np.float32, chunks=(1024, 3))
        handle.create_dataset("data/ip/1", shape=(2,), dtype=np.float32)
    net = netdef.Net('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 3 } } }\n'
                     'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
                     'inner_product_param { num_output: 2 } }', netdef.TEST)
    before = peak_rss_bytes()
    with pytest.raises(netdef.weights.WeightsError, match=rf"{path}: cannot copy param 0 of layer 'ip': shape "
                                                          rf"mismatch; the file has \({HUGE_ROWS}, 3\)"):
        net.copy_from(str(path))
    assert peak_rss_bytes() - before < 50 * 2**20


def test_read_dataset_refuses_before_allocating(tmp_path):
    path = write_declaring_file(tmp_path / "bomb.h5")
    before = peak_rss_bytes()
    with h5py.File(path, "r") as handle:
        with pytest.raises(BlobTooLargeError, match=rf"^HDF5 file {path}: data set '/label' of shape "
                                                    rf"\({HUGE_ROWS},\) needs {4 * HUGE_ROWS} bytes, more than "):
            read_dataset(handle["label"], path)
        # Converting to another type counts both copies.
        small = write_declaring_file(tmp_path / "small.h5", rows=3)
        with h5py.File(small, "r") as small_handle:
            assert read_dataset(small_handle["label"], small, np.float64).dtype == np.float64
    assert peak_rss_bytes() - before < 50 * 2**20
