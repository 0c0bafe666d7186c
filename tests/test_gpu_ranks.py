"""Two MPI ranks on one GPU (``mpiexec -n 2 netdef train ... --gpu all``): how the GPU machines,
which have one device each, test the distributed solver on GPUs. Each rank takes the machine's GPU
in turn (netdef/devices.py), the log names the sharing, and 2 ranks at batch B end with the weights
of one GPU process at batch 2B over the same records (to float32 rounding: the sums run in another
order), the gradients going through pinned host buffers (netdef/comm/gradient_staging.py). Skips without a GPU or without MPI, saying which."""
from __future__ import annotations

import numpy as np
import pytest

from tests.comm.fixtures import mpi_available, run_netdef, write_case
from tests.comm.test_mpi import BATCH, ITERATIONS, RECORDS, relative_error, weights
from tests.helpers import gpu_missing

MISSING = gpu_missing()
MPI_OK, MPI_WHY_NOT = mpi_available()
pytestmark = [pytest.mark.skipif(MISSING is not None, reason=f"no GPU: {MISSING}"),
              pytest.mark.skipif(not MPI_OK, reason=MPI_WHY_NOT)]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """One GPU process at batch 2B: its folder and final weights."""
    folder = tmp_path_factory.mktemp("one_gpu")
    single = write_case(folder, "single", 2 * BATCH, ITERATIONS, records=RECORDS)
    run = run_netdef(["train", str(single), "--gpu", "0"], 0, folder, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    return weights(single.with_name("single_net.prototxt"), folder / f"single_iter_{ITERATIONS}.caffemodel")


# The staged path's exchange (gradient_staging.py) under the schedules and overlap settings.
FLAGS = [pytest.param([], id="priority"), pytest.param(["--schedule", "fifo"], id="fifo"),
         pytest.param(["--overlap", "off", "--schedule", "fifo"], id="fifo-no-overlap")]


@pytest.mark.parametrize("flags", FLAGS)
def test_two_ranks_share_the_gpu_and_train_as_one_process_at_twice_the_batch(tmp_path, one_process, flags):
    pair = write_case(tmp_path, "pair", BATCH, ITERATIONS, records=RECORDS)
    two = run_netdef(["train", str(pair), "--gpu", "all"] + flags, 2, tmp_path, timeout=180)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "rank 0 -> GPU 0 on " in two.stderr and "(shared with rank(s) 1)" in two.stderr, two.stderr[-3000:]
    got = weights(pair.with_name("pair_net.prototxt"), tmp_path / f"pair_iter_{ITERATIONS}.caffemodel")
    for name, blobs in one_process.items():
        for a, b in zip(got[name], blobs):
            assert relative_error(np.asarray(a), np.asarray(b)) < 1e-5, name
