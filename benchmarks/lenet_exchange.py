"""Train Caffe's LeNet recipe on MNIST with an exchange rule over MPI, and score the result.

    python benchmarks/lenet_exchange.py --exchange easgd --ranks 3 [--mnist DIR] [--work DIR]
        [--iterations 1500] [--batch 32] [-- extra netdef train flags, e.g. --group_size=2]

Issue 9's check: the first 8,000 MNIST t10k images train, the other 2,000 test (the splits of
``lenet_mnist.py``), per-rank batch 32, 1,500 iterations, ``models/lenet``'s solver otherwise (SGD
with momentum 0.9, base_lr 0.01, the "inv" policy, weight decay 5e-4, random_seed 1). Runs
``mpiexec -n RANKS netdef train`` (the mpiexec beside this Python: the MPICH wheel, shared memory)
with ``--exchange``, then scores the saved model (the centre for elastic rules, rank 0's weights
for gossip) with one process over all 2,000 test images (``netdef test``, 20 batches of 100), since
the distributed test shards 2,000 images unevenly over 3 ranks. Prints the final accuracy, the
distributed tests' accuracies logged during training, and the wall time.
"""
from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys
import tempfile
import time

from lenet_mnist import REPO, prepare_splits, run


def write_recipe(work: pathlib.Path, batch: int, iterations: int, prefix: str,
                 test_interval: int = 500) -> pathlib.Path:
    """models/lenet's net and solver in ``work``, with the per-rank batch, iterations, test interval
    and a snapshot at the end only."""
    net = (REPO / "models" / "lenet" / "lenet_train_test.prototxt").read_text()
    net, count = re.subn(r"(source: \"mnist_train_lmdb\" batch_size: )64", rf"\g<1>{batch}", net)
    if count != 1:
        raise SystemExit("models/lenet/lenet_train_test.prototxt: the train batch_size 64 was not found")
    (work / "lenet_train_test.prototxt").write_text(net)
    solver = (REPO / "models" / "lenet" / "lenet_solver.prototxt").read_text()
    solver = re.sub(r"max_iter: \d+", f"max_iter: {iterations}", solver)
    solver = re.sub(r"snapshot: \d+", "snapshot: 0", solver)
    solver = re.sub(r"test_interval: \d+", f"test_interval: {test_interval}", solver)
    solver = re.sub(r'snapshot_prefix: "[^"]*"', f'snapshot_prefix: "{prefix}"', solver)
    path = work / f"{prefix}_solver.prototxt"
    path.write_text(solver)
    return path


def score(work: pathlib.Path, model: pathlib.Path) -> float:
    """The accuracy of ``model`` on all 2,000 test images of ``work`` (`netdef test` in one process,
    20 batches of 100)."""
    scored = subprocess.run([sys.executable, "-m", "netdef.cli", "test", "--model", "lenet_train_test.prototxt",
                             "--weights", str(model), "--iterations", "20"], cwd=work, capture_output=True, text=True)
    accuracies = re.findall(r"accuracy = ([\d.eE+-]+)", scored.stdout + scored.stderr)
    if scored.returncode != 0 or not accuracies:
        sys.stderr.write(scored.stdout + scored.stderr)
        raise SystemExit(f"scoring {model} failed")
    return float(accuracies[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exchange", default="allreduce")
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--mnist", default=str(REPO.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--work", default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--iterations", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=32, help="per-rank train batch")
    parser.add_argument("extra", nargs="*", help="more `netdef train` flags (after --)")
    args = parser.parse_args()

    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="netdef-lenet-exchange-"))
    prepare_splits(pathlib.Path(args.mnist), work)
    prefix = f"lenet_{args.exchange}_{args.ranks}"
    solver = write_recipe(work, args.batch, args.iterations, prefix)
    mpiexec = pathlib.Path(sys.executable).parent / "mpiexec"
    train = [str(mpiexec), "-n", str(args.ranks), sys.executable, "-m", "netdef.cli", "train", str(solver),
             f"--exchange={args.exchange}", *args.extra]
    start = time.perf_counter()
    log = run(train, work)
    wall = time.perf_counter() - start
    (work / f"{prefix}.log").write_text(log)
    final = score(work, work / f"{prefix}_iter_{args.iterations}.caffemodel")
    during = re.findall(r"Iteration (\d+), Testing net.*?\n.*?accuracy = ([\d.eE+-]+)", log, flags=re.S)
    described = re.search(r"Gradient exchange: (.*)", log)
    print(f"work folder      {work} (log: {prefix}.log)")
    print(f"rule             {described.group(1) if described else args.exchange}")
    print(f"ranks x batch    {args.ranks} x {args.batch}, {args.iterations} iterations, flags {' '.join(args.extra)}")
    print(f"tests in the run {', '.join(f'{i}: {float(a):.4f}' for i, a in during)}")
    print(f"final accuracy   {final:.4f} (the saved model, one process, all 2,000 test images)")
    print(f"wall time        {wall:.1f} s")


if __name__ == "__main__":
    main()
