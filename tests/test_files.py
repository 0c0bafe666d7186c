"""netdef.files: bounded reads of regular files only; atomic writes with a plain open()'s permissions, and
nothing left behind on failure. The readers that use the helper refuse /dev/zero, FIFOs and folders."""
from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from netdef import files
from netdef.proto import io as proto_io
from netdef.proto import netdef_pb2 as pb
from tests.helpers import dummy_data_solver


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    """Set the process umask for one test, restoring the previous one afterwards."""
    previous = os.umask(0o022)
    os.umask(previous)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


def _write_small_hdf5(handle):
    handle["values"] = np.arange(3, dtype=np.float32)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_new_files_get_the_permissions_the_umask_allows(tmp_path, umask, mask):
    umask(mask)
    files.write_bytes_atomically(tmp_path / "a.bin", b"abc")
    assert _mode(tmp_path / "a.bin") == 0o666 & ~mask
    # The prototxt and caffemodel writers go through the same path (they used to leave 0600).
    proto_io.write_binary(tmp_path / "b.caffemodel", pb.NetParameter(name="n"))
    assert _mode(tmp_path / "b.caffemodel") == 0o666 & ~mask
    proto_io.write_text(tmp_path / "c.prototxt", pb.NetParameter(name="n"))
    assert _mode(tmp_path / "c.prototxt") == 0o666 & ~mask


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_new_hdf5_files_get_the_permissions_the_umask_allows(tmp_path, umask, mask):
    h5py = pytest.importorskip("h5py")
    umask(mask)
    files.write_hdf5_atomically(tmp_path / "a.h5", _write_small_hdf5)
    assert _mode(tmp_path / "a.h5") == 0o666 & ~mask
    with h5py.File(tmp_path / "a.h5", "r") as handle:
        np.testing.assert_array_equal(handle["values"][()], [0, 1, 2])


def test_a_replaced_file_keeps_its_permissions_as_with_open(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "private.bin"
    path.write_bytes(b"old")
    os.chmod(path, 0o600)
    files.write_bytes_atomically(path, b"new")
    assert path.read_bytes() == b"new" and _mode(path) == 0o600
    os.chmod(path, 0o664)
    files.write_bytes_atomically(path, b"newer")
    assert _mode(path) == 0o664


def test_hdf5_writer_raising_midway_leaves_old_file_and_no_temp(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "model.h5"
    files.write_hdf5_atomically(path, _write_small_hdf5)
    before = path.read_bytes()

    def half_written(handle):
        handle["values"] = np.zeros(1000, dtype=np.float32)  # something is written before the failure
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        files.write_hdf5_atomically(path, half_written)
    assert os.listdir(tmp_path) == ["model.h5"]
    assert path.read_bytes() == before
    with h5py.File(path, "r") as handle:
        assert handle["values"].shape == (3,)


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_bytes_writer_failing_midway_leaves_old_file_and_no_temp(tmp_path, monkeypatch, failing):
    path = tmp_path / "state.bin"
    files.write_bytes_atomically(path, b"old contents")

    def disk_error(*args, **kwargs):
        raise OSError(5, "Input/output error")

    # fsync: the data is in the temporary file, which is not yet on disk; replace: the rename fails.
    monkeypatch.setattr(files.os, failing, disk_error)
    with pytest.raises(OSError, match="Input/output"):
        files.write_bytes_atomically(path, b"new contents that never land")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["state.bin"]
    assert path.read_bytes() == b"old contents"


def test_two_phase_write_touches_targets_only_at_replace(tmp_path):
    model, state = tmp_path / "m", tmp_path / "s"
    model.write_bytes(b"old model")
    state.write_bytes(b"old state")
    temps = [files.bytes_to_temp(model, b"new model"), files.bytes_to_temp(state, b"new state")]
    assert all(os.path.dirname(t) == str(tmp_path) for t in temps)  # beside the targets: atomic rename
    assert model.read_bytes() == b"old model" and state.read_bytes() == b"old state"
    files.replace(temps[0], model)
    assert model.read_bytes() == b"new model" and state.read_bytes() == b"old state"
    files.replace(temps[1], state)
    assert state.read_bytes() == b"new state"
    assert sorted(os.listdir(tmp_path)) == ["m", "s"]


def test_replace_flushes_the_folder(tmp_path, monkeypatch):
    synced = []
    real = files._fsync_path
    monkeypatch.setattr(files, "_fsync_path", lambda path: (synced.append(str(path)), real(path)))
    files.write_bytes_atomically(tmp_path / "x", b"1")
    assert synced == [str(tmp_path)]  # the file itself is flushed through its open handle


def test_temp_beside_is_new_and_hidden_and_missing_folder_fails(tmp_path):
    first, second = files.temp_beside(tmp_path / "t"), files.temp_beside(tmp_path / "t")
    assert first != second and os.path.getsize(first) == 0
    assert os.path.basename(first).startswith(".t.") and first.endswith(".tmp")
    files.remove_quietly(first)
    files.remove_quietly(first)  # already gone: no error
    assert os.listdir(tmp_path) == [os.path.basename(second)]
    with pytest.raises(FileNotFoundError):
        files.temp_beside(tmp_path / "no" / "such" / "folder")
    with pytest.raises(files.FileWriteError, match=f"^cannot write {tmp_path}/no/such/folder: No such file or "
                                                   f"directory; the file of that name, if there was one, is unchanged$"):
        files.write_bytes_atomically(tmp_path / "no" / "such" / "folder", b"")


# ------------------------------------------------------------------------------------- bounded reads
@pytest.fixture
def fifo(tmp_path):
    """A FIFO with no writer: opening it for reading the ordinary way would block forever."""
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_read_input_file_reads_a_regular_file_within_its_limit(tmp_path):
    path = tmp_path / "small.bin"
    path.write_bytes(b"12345")
    assert files.read_input_file(path, "test file", 5) == b"12345"
    with pytest.raises(files.InputFileError, match=rf"test file {path}: 5 bytes, more than such a file can hold "
                                                   r"\(4 bytes\)"):
        files.read_input_file(path, "test file", 4)


def test_read_input_file_reads_past_the_size_it_was_opened_with_but_never_past_its_limit():
    """Reads are sized by the file (not by the limit, which Python would allocate first); a file that
    holds more than its size said (one that grew; here a /proc file, whose size reads as 0) is read
    on in chunks, up to the limit."""
    status = "/proc/self/status"
    if not os.path.exists(status) or os.stat(status).st_size != 0:
        pytest.skip("needs Linux's /proc, whose files report size 0")
    whole = files.read_input_file(status, "status file", 1 << 20)
    assert whole.startswith(b"Name:") and len(whole) > 100
    with pytest.raises(files.InputFileError, match=f"status file {status}: grew past 50 bytes while being read"):
        files.read_input_file(status, "status file", 50)


@pytest.mark.parametrize("special, kind", [("/dev/zero", "a character device"), ("fifo", r"a FIFO \(named pipe\)"),
                                           ("folder", "a folder"), ("missing", None)])
def test_read_input_file_refuses_what_is_not_a_regular_file(tmp_path, fifo, special, kind):
    path = {"fifo": fifo, "folder": tmp_path, "missing": tmp_path / "nothing"}.get(special, special)
    expected = f"is {kind}, not a regular file" if kind else "no such file"
    with pytest.raises(files.InputFileError, match=rf"weights file {path}: {expected}"):
        files.read_input_file(path, "weights file", files.PROTOBUF_LIMIT)
    with pytest.raises(files.InputFileError):
        files.check_input_file(path, "weights file")


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_readers_of_named_files_refuse_devices_and_fifos(fifo, special):
    import netdef
    from netdef.data.datum import read_mean_file
    from netdef.data.errors import DataError
    from netdef.data.idx import IdxError, read_idx
    from netdef.data.image import ImageError, read_image, read_image_list

    path = str(fifo) if special == "fifo" else special
    net_text = ('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }\n'
                'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 2 } }')
    refused = "not a regular file"
    with pytest.raises(netdef.WeightsError, match=f"weights file {path}: is .*{refused}"):
        netdef.Net(net_text, "TEST", weights=path)
    with pytest.raises(proto_io.ProtoFileError, match=f"prototxt {path}: is .*{refused}"):
        proto_io.read_text(path, pb.NetParameter)
    with pytest.raises(proto_io.ProtoFileError, match=f"binary BlobProto file {path}: is .*{refused}"):
        proto_io.read_binary(path, pb.BlobProto)
    with pytest.raises(DataError, match=f"mean file {path}: is .*{refused}"):
        read_mean_file(path)
    with pytest.raises(IdxError, match=f"IDX file {path}: is .*{refused}"):
        read_idx(path)
    with pytest.raises(ImageError, match=f"image {path}: is .*{refused}"):
        read_image(path)
    with pytest.raises(files.InputFileError, match=f"image list {path}: is .*{refused}"):
        read_image_list(path)


def test_idx_reader_reads_no_more_than_its_header_announces(tmp_path):
    import gzip

    from netdef.data.idx import IdxError, read_idx

    # A header announcing 2 x 3 bytes, then far more (a gzip bomb in miniature): refused, not read whole.
    header = bytes([0, 0, 0x08, 2]) + (2).to_bytes(4, "big") + (3).to_bytes(4, "big")
    with gzip.open(tmp_path / "bomb.idx.gz", "wb") as handle:
        handle.write(header + bytes(10_000_000))
    with pytest.raises(IdxError, match=r"header says \(2, 3\) \(6 bytes of data\) but the file holds more bytes"):
        read_idx(tmp_path / "bomb.idx.gz")
    (tmp_path / "ok.idx").write_bytes(header + bytes(range(6)))
    assert read_idx(tmp_path / "ok.idx").tolist() == [[0, 1, 2], [3, 4, 5]]


def test_file_names_holding_a_nul_byte_are_refused_naming_the_field(tmp_path):
    """A string field can hold a NUL byte (``\\000`` in a prototxt); the OS calls would raise a bare
    ValueError ("embedded null byte"), found by fuzzing."""
    import netdef
    from netdef.data.datum import read_mean_file
    from netdef.data.errors import DataError
    from netdef.solver import get_solver
    from netdef.solver.updates import SolverConfigError

    nul = "the name holds a NUL byte"
    with pytest.raises(proto_io.ProtoFileError, match=rf"prototxt '\\x00 LeNet': {nul}"):
        netdef.Net("\0 LeNet", "TEST")
    with pytest.raises(DataError, match=rf"mean file '{tmp_path}/m\\x00': {nul}"):
        read_mean_file(f"{tmp_path}/m\0")
    data = 'layer { name: "d" type: "Data" top: "x" data_param { source: "db\\000" batch_size: 1 backend: LMDB } }'
    with pytest.raises(netdef.NetError, match=rf"layer 'd' \(Data\).*lmdb database 'db\\x00': {nul}"):
        netdef.Net(data, "TEST")
    output = ('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }\n'
              'layer { name: "out" type: "HDF5Output" bottom: "x" bottom: "x" hdf5_output_param { file_name: "o\\000" } }')
    with pytest.raises(netdef.NetError, match=rf"layer 'out' \(HDF5Output\).*hdf5_output_param.file_name 'o\\x00': {nul}"):
        netdef.Net(output, "TEST")
    net = ('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 } } }\n'
           'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 1 } }')
    with pytest.raises(SolverConfigError, match=rf"snapshot_prefix '{tmp_path}/s\\x00': {nul}"):
        get_solver(f'net_param {{ {net} }} base_lr: 0.1 lr_policy: "fixed" snapshot_prefix: "{tmp_path}/s\\000"')


# ------------------------------------------------------------------ links that lead nowhere (issue 32, class 11)
LOOP = "Too many levels of symbolic links"


@pytest.fixture
def link_loop(tmp_path):
    """``loop_a`` -> ``loop_b`` -> ``loop_a``: a name that is there but opens nothing."""
    os.symlink("loop_b", tmp_path / "loop_a")
    os.symlink("loop_a", tmp_path / "loop_b")
    return tmp_path / "loop_a"


def test_a_weights_path_in_a_link_loop_is_reported_as_a_loop_not_missing(link_loop):
    import netdef
    from netdef.weights import WeightsError

    net = netdef.Net('layer { name: "d" type: "Input" top: "d" input_param { shape { dim: 1 } } }', netdef.TEST)
    with pytest.raises(WeightsError, match=f"^weights file {link_loop}: {LOOP}$"):
        net.copy_from(str(link_loop))


def test_a_solver_state_in_a_link_loop_is_reported_as_a_loop(link_loop):
    from netdef.solver import snapshot

    with pytest.raises(files.InputFileError, match=f"^solver state {link_loop}: {LOOP}$"):
        snapshot.restore(None, str(link_loop))


def test_an_lmdb_in_a_link_loop_is_reported_as_a_loop(link_loop):
    from netdef.data.db import DBError, open_db

    with pytest.raises(DBError, match=f"^{link_loop}: no such LMDB \\({link_loop} is a link that leads nowhere: {LOOP}\\)$"):
        open_db(str(link_loop))


# ------------------------------------------------------------------ a write that fails names the file (issue 32, class 9)
# 300 inputs: a model of about 2.4 KB, past the 1,500-byte limit below.
WRITE_SOLVER = dummy_data_solver(300)


def _limit_file_size(limit: int):
    """In the child: files may grow to ``limit`` bytes; a write past it fails with EFBIG, as a full disk
    fails with ENOSPC (SIGXFSZ ignored, so the write returns the error instead of killing the process)."""
    import resource
    import signal

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.parametrize("fmt", ["BINARYPROTO", "HDF5"])
def test_a_snapshot_that_cannot_be_written_names_its_file_and_keeps_the_earlier_one(tmp_path, fmt):
    import subprocess
    import sys

    (tmp_path / "snaps").mkdir()
    (tmp_path / "solver.prototxt").write_text(WRITE_SOLVER + f"snapshot_format: {fmt}\n")
    command = [sys.executable, "-m", "netdef.cli", "train", "solver.prototxt"]
    subprocess.run(command, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    earlier = {path.name: path.read_bytes() for path in (tmp_path / "snaps").iterdir()}
    model = "run_iter_2.caffemodel" + (".h5" if fmt == "HDF5" else "")
    assert model in earlier and len(earlier[model]) > 2000
    # The same run again, where no file may grow past 1,500 bytes: its snapshot of the same name fails.
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          preexec_fn=_limit_file_size(1500))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (f"netdef: error: cannot write snaps/{model}: File too large; the file "
                                            f"of that name, if there was one, is unchanged")
    assert {path.name: path.read_bytes() for path in (tmp_path / "snaps").iterdir()} == earlier
