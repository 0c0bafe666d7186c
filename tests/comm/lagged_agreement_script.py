"""Run under mpiexec by test_lagged_agreement.py: rank 1 alone asks for a stop at the end of
iteration 1 (from a callback, as a signal handler would); every rank prints the iteration it
stopped at and whether the solver saw the stop."""
from __future__ import annotations

import sys

from netdef.comm import create_communicator, create_solver
from netdef.comm.distributed import run_guarded


def main(solver_path: str) -> None:
    comm = create_communicator()
    solver = create_solver(solver_path, comm=comm)

    def on_update():
        if comm.rank == 1 and solver.iter == 2:
            solver.request_stop()

    solver.add_callback(after_update=on_update)
    solver.step(8)
    solver.close()
    print(f"rank {comm.rank} stopped at {solver.iter} early {solver.requested_early_exit}", flush=True)


if __name__ == "__main__":
    run_guarded(create_communicator(), main, sys.argv[1])
