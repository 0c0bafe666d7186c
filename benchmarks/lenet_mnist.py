"""Train models/lenet on real MNIST digits end to end with the command line, and report the figures.

    python benchmarks/lenet_mnist.py [--mnist DIR] [--work DIR] [--iterations N]

The MNIST test set (t10k, 10,000 images; ../shared/data/mnist by default) is split as the training issue
asks: the first 8,000 images train, the last 2,000 test. Both splits go through the real tools
(`netdef convert-mnist` on IDX files), then `netdef train models/lenet/lenet_solver.prototxt` runs in the
work folder. Prints the final test accuracy, iterations, wall time, iterations per second and the
training process's peak resident memory.
"""
from __future__ import annotations

import argparse
import pathlib
import re
import resource
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def run(cmd, cwd) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"failed: {' '.join(map(str, cmd))}")
    return done.stdout + done.stderr


def prepare_splits(mnist: pathlib.Path, work: pathlib.Path) -> None:
    """``mnist_train_lmdb`` (the first 8,000 t10k images) and ``mnist_test_lmdb`` (the last 2,000) in
    ``work``, through `netdef convert-mnist`; kept when already there (the reliability scripts' LMDBs)."""
    sys.path.insert(0, str(REPO))
    from reliability.mnist import make_lenet_lmdbs

    make_lenet_lmdbs(work, mnist)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mnist", default=str(REPO.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--work", default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--iterations", type=int, default=0, help="override max_iter")
    args = parser.parse_args()

    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="netdef-lenet-"))
    prepare_splits(pathlib.Path(args.mnist), work)
    netdef_cmd = [sys.executable, "-m", "netdef.cli"]
    train = netdef_cmd + ["train", str(REPO / "models" / "lenet" / "lenet_solver.prototxt")]
    if args.iterations:
        train.append(f"--iterations={args.iterations}")
    start = time.perf_counter()
    log = run(train, work)
    wall = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    (work / "train.log").write_text(log)

    accuracies = [float(m) for m in re.findall(r"Test net output #\d+: accuracy = ([\d.eE+-]+)", log)]
    iters = [int(m) for m in re.findall(r"Iteration (\d+), loss", log)]
    final_iter = max(iters) if iters else 0
    print(f"work folder         {work} (log: train.log)")
    print("train / test images 8000 / 2000 (MNIST t10k split)")
    print(f"iterations          {final_iter} (batch 64)")
    print(f"final test accuracy {accuracies[-1]:.4f}" if accuracies else "final test accuracy: none logged")
    print(f"wall time           {wall:.1f} s (process start to exit, tests and snapshots included)")
    print(f"iterations / s      {final_iter / wall:.1f}")
    print(f"peak RSS            {peak_kib / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
