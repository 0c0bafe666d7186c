"""The MNIST LMDBs the reliability scripts train LeNet on, made from ../shared/data/mnist.

The project's machines hold only the MNIST test set (t10k, 10,000 images); as in
``benchmarks/lenet_mnist.py`` its first 8,000 images train and the last 2,000 test. Both splits go
through the real converter (``netdef convert-mnist``).
"""
from __future__ import annotations

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MNIST = REPO.parent / "shared" / "data" / "mnist"
NETDEF = [sys.executable, "-m", "netdef.cli"]


def make_lenet_lmdbs(work: pathlib.Path, mnist: pathlib.Path = DEFAULT_MNIST) -> None:
    """``work``/mnist_train_lmdb and ``work``/mnist_test_lmdb (kept when they exist already)."""
    from netdef.data.convert import write_idx
    from netdef.data.idx import read_idx

    images_file, labels_file = mnist / "t10k-images-idx3-ubyte.gz", mnist / "t10k-labels-idx1-ubyte.gz"
    if not images_file.exists():
        raise SystemExit(f"reliability: {images_file} not found: these scripts need the shared MNIST test set "
                         f"(--mnist DIR)")
    images, labels = read_idx(images_file), read_idx(labels_file)
    work.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", slice(0, 8000)), ("test", slice(8000, 10000))):
        if (work / f"mnist_{split}_lmdb").exists():
            continue
        write_idx(work / f"{split}-images.idx", images[part])
        write_idx(work / f"{split}-labels.idx", labels[part])
        subprocess.run(NETDEF + ["convert-mnist", f"{split}-images.idx", f"{split}-labels.idx",
                                 f"mnist_{split}_lmdb"], cwd=work, check=True, capture_output=True)


def lenet_solver(work: pathlib.Path, *, max_iter: int, snapshot: int, test_interval: int, test_iter: int,
                 display: int = 100, prefix: str = "snapshots/lenet", extra: str = "") -> pathlib.Path:
    """A copy of models/lenet's solver in ``work`` with these settings; returns its path."""
    net = REPO / "models" / "lenet" / "lenet_train_test.prototxt"
    (work / pathlib.Path(prefix).parent).mkdir(parents=True, exist_ok=True)
    text = (f'net: "{net}"\ntest_iter: {test_iter}\ntest_interval: {test_interval}\nbase_lr: 0.01\n'
            f'momentum: 0.9\nweight_decay: 0.0005\nlr_policy: "inv"\ngamma: 0.0001\npower: 0.75\n'
            f'display: {display}\nmax_iter: {max_iter}\nsnapshot: {snapshot}\nsnapshot_prefix: "{prefix}"\n'
            f'random_seed: 1\nsolver_mode: CPU\n{extra}')
    path = work / "solver.prototxt"
    path.write_text(text)
    return path
