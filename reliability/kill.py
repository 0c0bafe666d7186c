"""Kill test: SIGKILL ``netdef train`` at random moments and check that every snapshot left resumes exactly.

    nice -n 19 python -m reliability.kill [--kills 200] [--ranks 1] [--minutes 0] [--work DIR] [--seed 1]
    nice -n 19 python -m reliability.kill --ranks 3 --kills 20       # a 3-rank mpiexec job

LeNet trains on the MNIST split of ``reliability/mnist.py`` for 100 iterations, snapshotting every 5
(so that many kills land inside a snapshot write), with a test pass every 25. First one uninterrupted
run writes the reference snapshots. Then a chain of runs in one folder: each resumes from the newest
snapshot there (``--snapshot``), is SIGKILLed at a random moment of its training (half of them
within 2 ms of a temporary snapshot file's appearance) (one random rank's
process with ``--ranks`` > 1: the launcher must end the others), and the chain starts again from
scratch once a run reaches iteration 100. After every kill:

- every file under a final snapshot name equals, byte for byte, the reference run's file of that name
  (weights, update history, iteration, random and data-reader state: resumption is bit-exact, and no
  torn file is ever under a final name);
- the newest snapshot's state file names a model that is there (it loads);
- the temporary files that the previous kill left are gone (the next run removes its own leftovers).

A kill counts as "inside a snapshot write" when a temporary snapshot file is left right after it.
Prints the figures and writes them to ``kill-summary.json`` in the work folder; exit status 1 on any
failed check. ``--minutes`` stops after that long (0: no limit), reporting how many kills were done.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

from .mnist import NETDEF, lenet_solver, make_lenet_lmdbs

MAX_ITER = 100
PREFIX = "snap/lenet"
STATE = re.compile(r"lenet_iter_(\d+)\.solverstate$")
TRAINING = b"Starting Optimization"


def launcher(ranks: int) -> list[str]:
    if ranks == 1:
        return []
    mpiexec = pathlib.Path(sys.executable).parent / "mpiexec"
    return [str(mpiexec), "-n", str(ranks)]


def environment() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    repo = str(pathlib.Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([repo, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def train_command(ranks: int, solver: pathlib.Path, resume: str | None) -> list[str]:
    return launcher(ranks) + NETDEF + ["train", f"--solver={solver}"] + ([f"--snapshot={resume}"] if resume else [])


def newest_state(folder: pathlib.Path) -> str | None:
    found = [(int(m.group(1)), name) for name in os.listdir(folder / "snap") if (m := STATE.match(name))]
    return f"{PREFIX}_iter_{max(found)[0]}.solverstate" if found else None


def temp_files(folder: pathlib.Path) -> set[str]:
    return {name for name in os.listdir(folder / "snap") if name.endswith(".tmp")}


def final_files(folder: pathlib.Path) -> set[str]:
    return {name for name in os.listdir(folder / "snap") if not name.startswith(".")}


def rank_pids(job: subprocess.Popen, ranks: int) -> list[int]:
    """The processes running netdef train in the job (the job's own with one rank)."""
    if ranks == 1:
        return [job.pid]
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                if b"netdef.cli" in cmdline and b"train" in cmdline \
                        and _descends_from(int(entry), job.pid):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def run_until_killed(folder: pathlib.Path, solver: pathlib.Path, ranks: int, rng: random.Random,
                     log: pathlib.Path, window_s: float) -> tuple[str, float]:
    """One run of the chain: 'killed' (and how long it had trained) or 'finished'. Half of the kills
    come at a uniformly random moment of ``window_s`` (a whole run's training time), half within
    two milliseconds of a temporary snapshot file's appearance."""
    with open(log, "wb") as out:
        job = subprocess.Popen(train_command(ranks, solver, newest_state(folder)), cwd=folder, env=environment(),
                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while job.poll() is None and TRAINING not in log.read_bytes():
            time.sleep(0.05)
        began = time.monotonic()
        if rng.random() < 0.5:
            deadline = began + rng.uniform(0, window_s)
            while job.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
        else:
            # Aim inside a snapshot write (a few milliseconds here): as soon as a temporary file appears.
            while job.poll() is None and not temp_files(folder):
                pass
            time.sleep(rng.uniform(0, 0.002))
        delay = time.monotonic() - began
        if job.poll() is not None:
            if job.returncode != 0:
                raise RuntimeError(f"netdef train failed (exit {job.returncode}): {log.read_text()[-2000:]}")
            return "finished", delay
        victims = rank_pids(job, ranks)
        os.kill(rng.choice(victims) if victims else job.pid, signal.SIGKILL)
        try:
            job.wait(timeout=30)  # the launcher must end the other ranks by itself
        except subprocess.TimeoutExpired:
            raise RuntimeError("the job did not end within 30 s of a rank's SIGKILL") from None
        return "killed", delay
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def check(folder: pathlib.Path, reference: pathlib.Path) -> list[str]:
    """Failed checks after a kill (see the module docstring)."""
    problems = []
    for name in sorted(final_files(folder)):
        ours, theirs = folder / "snap" / name, reference / "snap" / name
        if not theirs.exists() or ours.read_bytes() != theirs.read_bytes():
            problems.append(f"{name} differs from the uninterrupted run's")
    state = newest_state(folder)
    if state is not None and not (folder / state.replace(".solverstate", ".caffemodel")).exists():
        problems.append(f"{state} names a model that is not there")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=0, help="stop after this long (0: when all kills are done)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work", default=None)
    args = parser.parse_args()
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="netdef-kill-"))
    make_lenet_lmdbs(work / "data")
    rng = random.Random(args.seed)
    folders = {}
    for role in ("reference", "chain"):
        folder = work / f"{role}-{args.ranks}"
        folder.mkdir(parents=True, exist_ok=True)
        for split in ("train", "test"):
            link = folder / f"mnist_{split}_lmdb"
            if not link.exists():
                link.symlink_to(work / "data" / f"mnist_{split}_lmdb")
        lenet_solver(folder, max_iter=MAX_ITER, snapshot=5, test_interval=25, test_iter=2, display=5, prefix=PREFIX)
        folders[role] = folder
    reference, chain = folders["reference"], folders["chain"]
    for old in (reference / "snap").iterdir():
        old.unlink()
    # The uninterrupted run: its snapshots are the reference, its training time the kills' window.
    done = subprocess.run(train_command(args.ranks, reference / "solver.prototxt", None), cwd=reference,
                          env=environment(), check=True, capture_output=True)
    stamps = [float(h) * 3600 + float(m) * 60 + float(sec) for h, m, sec in
              re.findall(rb" (\d\d):(\d\d):(\d\d\.\d+) +\d+ \S+\] (?:Starting Optimization|Optimization Done)",
                         done.stdout + done.stderr)]
    window_s = stamps[-1] - stamps[0] if len(stamps) >= 2 else 5.0
    for old in (chain / "snap").iterdir():
        old.unlink()

    figures = {"ranks": args.ranks, "kill_window_s": round(window_s, 2), "kills": 0, "inside_snapshot_writes": 0, "completed_chains": 0,
               "snapshot_files_compared": 0, "failures": [], "leftovers_not_removed": 0}
    start = time.monotonic()
    left_by_last_kill: set[str] = set()
    while figures["kills"] < args.kills:
        if args.minutes and time.monotonic() - start > 60 * args.minutes:
            break
        outcome, _ = run_until_killed(chain, chain / "solver.prototxt", args.ranks, rng, chain / "train.log",
                                      window_s)
        if left_by_last_kill & temp_files(chain):
            figures["leftovers_not_removed"] += len(left_by_last_kill & temp_files(chain))
            figures["failures"].append(f"kill {figures['kills']}: the previous kill's temporary files are still there")
        if outcome == "finished":
            figures["completed_chains"] += 1
            problems = check(chain, reference)
            figures["failures"] += [f"completed chain {figures['completed_chains']}: {p}" for p in problems]
            for old in (chain / "snap").iterdir():
                old.unlink()
            left_by_last_kill = set()
            continue
        figures["kills"] += 1
        left_by_last_kill = temp_files(chain)
        figures["inside_snapshot_writes"] += bool(left_by_last_kill)
        figures["snapshot_files_compared"] += len(final_files(chain))
        problems = check(chain, reference)
        figures["failures"] += [f"kill {figures['kills']}: {p}" for p in problems]
        if figures["kills"] % 10 == 0:
            print(f"{figures['kills']} kills, {figures['inside_snapshot_writes']} inside snapshot writes, "
                  f"{len(figures['failures'])} failures", file=sys.stderr, flush=True)
    figures["minutes"] = round((time.monotonic() - start) / 60, 1)
    (work / f"kill-summary-{args.ranks}.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))
    return 1 if figures["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
