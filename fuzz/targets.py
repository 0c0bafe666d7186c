"""What the fuzzer feeds, and to what: each target has seed inputs (valid files netdef reads) and a
function that reads one (mutated) input the way netdef reads such a file.

A target's ``clean`` exceptions are netdef's own, whose messages name the file, layer or field; any
other exception that escapes is a "raw exception", a finding.
"""
from __future__ import annotations

import contextlib

import dataclasses
import io
import pathlib
from typing import Callable

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    seeds: Callable[[pathlib.Path], list[bytes]]      # (a scratch folder) -> seed inputs
    run: Callable[[bytes, pathlib.Path], None]          # (input, a scratch folder of its own) -> None
    clean: Callable[[], tuple[type, ...]]               # the exception classes that count as clear errors
    text: bool = False                                  # mutate as text too (numbers, lines)


# -------------------------------------------------------------------------------------- prototxt + Net
SMALL_NETS = [
    (REPO / "models" / "lenet" / "lenet.prototxt").read_text(),
    """name: "mixed"
layer { name: "in" type: "Input" top: "x" top: "y" input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } shape { dim: 2 } } }
layer { name: "conv" type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 4 kernel_size: 3 pad: 1 stride: 1
        weight_filler { type: "xavier" } } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "pool" type: "Pooling" bottom: "c" top: "p" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "lrn" type: "LRN" bottom: "p" top: "n" lrn_param { local_size: 3 } }
layer { name: "slice" type: "Slice" bottom: "n" top: "s1" top: "s2" slice_param { axis: 1 slice_point: 2 } }
layer { name: "cat" type: "Concat" bottom: "s2" bottom: "s1" top: "cat" }
layer { name: "ip" type: "InnerProduct" bottom: "cat" top: "ip" inner_product_param { num_output: 5 } }
layer { name: "drop" type: "Dropout" bottom: "ip" top: "ip" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "y" top: "loss" }
""",
]


def _net_seeds(_folder) -> list[bytes]:
    return [text.encode() for text in SMALL_NETS]


@contextlib.contextmanager
def _numpy_twins():
    """Run on the NumPy twins of the compiled kernels (layers' and the solver's update steps): the
    child is forked, and once the parent (the warm-up read, or the test session) has run a kernel,
    their thread pool (GNU OpenMP, not fork-safe) ends any child that starts one with SIGTERM."""
    from netdef.layers import jit

    enabled, jit.ENABLED = jit.ENABLED, False
    try:
        yield
    finally:
        jit.ENABLED = enabled


def _reseed_netdef() -> None:
    """netdef's random generator is process-wide: reseeded for each input, so that what an input's
    fillers draw does not depend on the inputs read before it in the same child (nor on the run)."""
    import netdef

    netdef.set_random_seed(0)


def _build_and_run_net(data: bytes, _folder) -> None:
    import netdef

    _reseed_netdef()
    with _numpy_twins():
        net = netdef.Net(data.decode("utf-8", errors="replace"), netdef.TRAIN, python_layers="deny")
        net.forward()
        net.backward()


def _net_errors() -> tuple[type, ...]:
    import netdef
    from netdef.blob import BlobTooLargeError
    from netdef.proto.io import ProtoFileError

    # BlobTooLargeError is a MemoryError, but a refusal before allocating that names the blob (`netdef`
    # prints it as one line): `dim: 4000000000` in an Input's shape ends there.
    return (netdef.NetError, netdef.LayerError, ProtoFileError, BlobTooLargeError)


# ----------------------------------------------------------------------------------------- caffemodel
def _lenet():
    import netdef

    _reseed_netdef()
    return netdef.Net(SMALL_NETS[0], netdef.TEST)


def _caffemodel_seeds(folder) -> list[bytes]:
    path = folder / "seed.caffemodel"
    _lenet().save(path)
    return [path.read_bytes()]


def _load_caffemodel(data: bytes, folder) -> None:
    path = folder / "input.caffemodel"
    path.write_bytes(data)
    _lenet().copy_from(path)


def _weights_errors() -> tuple[type, ...]:
    import netdef
    from netdef.proto.io import ProtoFileError

    return (netdef.WeightsError, ProtoFileError, netdef.NetError)


# ---------------------------------------------------------------------------------------------- Datum
def _datum_seeds(_folder) -> list[bytes]:
    from netdef.data.datum import array_to_datum, encoded_datum
    from netdef.data.image import encode_image

    rng = np.random.default_rng(0)
    raw = array_to_datum(rng.integers(0, 256, (1, 28, 28)).astype(np.uint8), label=7)
    floats = array_to_datum(rng.standard_normal((3, 4, 5)).astype(np.float32), label=2)
    png = encoded_datum(encode_image(rng.integers(0, 256, (3, 8, 8)).astype(np.uint8), "png"), 1)
    return [d.SerializeToString() for d in (raw, floats, png)]


def _decode_datum(data: bytes, _folder) -> None:
    from netdef.data.datum import datum_to_array, parse_datum

    datum_to_array(parse_datum(data, "fuzzed record"), name="fuzzed record")


def _data_errors() -> tuple[type, ...]:
    from netdef.data.errors import DataError

    return (DataError,)


# ---------------------------------------------------------------------------------------------- image
def _image_seeds(_folder) -> list[bytes]:
    from PIL import Image

    rng = np.random.default_rng(1)
    out = []
    for fmt, mode in (("PNG", "RGB"), ("PNG", "L"), ("JPEG", "RGB"), ("BMP", "RGB")):
        pixels = rng.integers(0, 256, (9, 7, 3) if mode == "RGB" else (9, 7)).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels, mode).save(buffer, fmt)
        out.append(buffer.getvalue())
    return out


def _decode_image(data: bytes, _folder) -> None:
    from netdef.data.image import decode_image

    decode_image(data, color=None, name="fuzzed image")


# ----------------------------------------------------------------------------------------------- LMDB
def _lmdb_seeds(folder) -> list[bytes]:
    from netdef.data.datum import array_to_datum
    from netdef.data.db import open_db

    rng = np.random.default_rng(2)
    db = open_db(folder / "seed_lmdb", "lmdb", "w")
    txn = db.transaction()
    for i in range(40):
        item = rng.integers(0, 256, (1, 6, 6)).astype(np.uint8)
        txn.put(b"%08d" % i, array_to_datum(item, label=i % 10).SerializeToString())
    txn.put(b"zz_big", array_to_datum(rng.integers(0, 256, (1, 70, 70)).astype(np.uint8), 0).SerializeToString())
    txn.commit()
    db.close()
    return [(folder / "seed_lmdb" / "data.mdb").read_bytes()]


def _read_lmdb(data: bytes, folder) -> None:
    from netdef.data.datum import datum_to_array, parse_datum
    from netdef.data.db import open_db

    path = folder / "input_lmdb"
    path.mkdir(exist_ok=True)
    (path / "data.mdb").write_bytes(data)
    db = open_db(path)
    try:
        len(db)
        for key, value in db.items():
            datum_to_array(parse_datum(value, f"record {key!r}"))
    finally:
        db.close()


# ----------------------------------------------------------------------------------------- solverstate
_SOLVER_NET = """name: "tiny"
layer { name: "data" type: "Data" top: "data" top: "label"
        data_param { source: "%s" batch_size: 3 backend: LMDB prefetch: 0 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 4 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""
_lmdb_cache: list = []


def _solver_lmdb() -> pathlib.Path:
    """An LMDB of 10 records, written once; every input's solver only reads it."""
    if not _lmdb_cache:
        import tempfile

        from netdef.data.datum import array_to_datum
        from netdef.data.db import open_db

        path = pathlib.Path(tempfile.mkdtemp(prefix="netdef-fuzz-solver-")) / "lmdb"
        db = open_db(path, "lmdb", "w")
        txn = db.transaction()
        for i in range(10):
            txn.put(b"%04d" % i, array_to_datum(np.full((1, 2, 2), i, np.uint8), label=i % 4).SerializeToString())
        txn.commit()
        db.close()
        _lmdb_cache.append(path)
    return _lmdb_cache[0]


def _tiny_solver(folder: pathlib.Path):
    """A small SGD solver over the shared LMDB that snapshots into ``folder``. A new one for every input:
    a restore changes the solver (counters, history, weights, data cursor), and in a persistent child
    the next input must not start from what this one restored."""
    from netdef.solver import get_solver

    return get_solver(f'net_param {{ {_SOLVER_NET % _solver_lmdb()} }}\nbase_lr: 0.1\nmomentum: 0.9\n'
                      f'lr_policy: "multistep"\nstepvalue: 1\nstepvalue: 3\nmax_iter: 2\nsnapshot: 2\n'
                      f'snapshot_prefix: "{folder / "s"}"\nrandom_seed: 3\naverage_loss: 4\n')


def _solverstate_seeds(folder) -> list[bytes]:
    from netdef.proto import netdef_pb2 as pb

    with _tiny_solver(folder) as solver:
        solver.step(2)
        _, state_path = solver.snapshot()
    state = pb.SolverState.FromString(pathlib.Path(state_path).read_bytes())
    state.ClearField("learned_net")  # the weights have their own target (caffemodel)
    return [state.SerializeToString()]


def _restore_solverstate(data: bytes, folder) -> None:
    path = folder / "input.solverstate"
    path.write_bytes(data)
    with _numpy_twins(), _tiny_solver(folder) as solver:
        solver.restore(path)
        solver.step(1)  # the restored counters, history, random and data state are used


def _solverstate_errors() -> tuple[type, ...]:
    import netdef
    from netdef.proto.io import ProtoFileError
    from netdef.solver.snapshot import SnapshotError

    return (SnapshotError, ProtoFileError, netdef.WeightsError)


TARGETS = {t.name: t for t in [
    Target("net", _net_seeds, _build_and_run_net, _net_errors, text=True),
    Target("caffemodel", _caffemodel_seeds, _load_caffemodel, _weights_errors),
    Target("datum", _datum_seeds, _decode_datum, _data_errors),
    Target("image", _image_seeds, _decode_image, _data_errors),
    Target("lmdb", _lmdb_seeds, _read_lmdb, _data_errors),
    Target("solverstate", _solverstate_seeds, _restore_solverstate, _solverstate_errors),
]}
