"""Data at GPU speed (issue 35): netdef's Data and ImageData layers against the PyTorch DataLoader a user
writes for the same files, and convert-imageset on 1 and 2 cores.

The data: ``--images`` natural-looking JPEGs of 300-500 px (smooth colour fields, edges and noise,
quality 90), converted as Caffe's ImageNet recipe does (``convert_imageset --resize_height=256
--resize_width=256 --shuffle --encoded --encode_type=jpg``, then ``compute_image_mean``), and the same
images resized to 256 x 256 as JPEG files with a list (for ImageData). Every layer crops 224 at random,
mirrors, subtracts the mean (the mean image for Data, mean values for ImageData), batch 64.

The peer, for each: an ``lmdb`` + Pillow ``Dataset`` (or a Pillow file ``Dataset``) doing the same
crop, flip and mean in NumPy, under ``torch.utils.data.DataLoader`` with 0 and 2 worker processes.

Each contender runs in a fresh process, contenders in turn, ``--rounds`` times; a contender's figure
is the median over rounds of its images per second over ``--batches`` batches after 2 warm-up
batches, and its CPU seconds (user + system, worker processes included) per image. "k cores" pins
the process to k cores (its affinity) and gives netdef k data threads. Both run at the priority they are
started with. ``--baseline PATH`` adds the
Data and ImageData layers of another checkout on 1 and k cores (their own processes, PYTHONPATH=PATH),
e.g. the commit before a change.

    python benchmarks/data_pipeline.py --workdir /tmp/netdef-data-bench [--baseline ../main]

A control runs in the same rounds: threads that hold no GIL (hashing), on 1 and on k cores. Its k / 1
ratio is what the cores given to the contenders can give at that moment; on a machine shared with
other work it is often far below k.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time

import numpy as np

BATCH = 64
CROP = 224
SIDE = 256
MEAN_VALUES = (104, 117, 123)
WARMUP_BATCHES = 2
WARMUP_IMAGES = 8  # convert-imageset's


# ---------------------------------------------------------------------------------------------- the data
def natural_image(rng: np.random.Generator) -> np.ndarray:
    """An HWC RGB uint8 image of 300-500 px a side that compresses like a photograph: smooth fields
    (low-resolution noise enlarged), a few hard edges, and fine grain."""
    from PIL import Image

    h, w = (int(v) for v in rng.integers(300, 501, size=2))
    coarse = rng.integers(0, 256, (int(rng.integers(3, 9)), int(rng.integers(3, 9)), 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), dtype=np.float32)
    y, x = np.mgrid[0:h, 0:w]
    for _ in range(3):
        a, b, c = rng.normal(size=3)
        field += (a * (y - h / 2) + b * (x - w / 2) > c * 50)[:, :, None] * rng.uniform(-60, 60, 3)
    field += rng.normal(0, 6, field.shape)
    return np.clip(field, 0, 255).astype(np.uint8)


def build(workdir: pathlib.Path, count: int) -> None:
    """The JPEGs, their list, the LMDB and its mean, the 256 x 256 files and their list (once)."""
    from PIL import Image

    from netdef.data.convert import compute_image_mean, convert_imageset

    done = workdir / "built"
    if done.exists() and done.read_text() == str(count):
        return
    rng = np.random.default_rng(35)
    originals, resized = workdir / "originals", workdir / "resized"
    originals.mkdir(parents=True, exist_ok=True)
    resized.mkdir(exist_ok=True)
    lines = []
    for i in range(count):
        img = Image.fromarray(natural_image(rng))
        img.save(originals / f"{i:05d}.jpg", quality=90)
        img.resize((SIDE, SIDE), Image.BILINEAR).save(resized / f"{i:05d}.jpg", quality=90)
        lines.append(f"{i:05d}.jpg {i % 1000}")
    (workdir / "list.txt").write_text("\n".join(lines) + "\n")
    (resized / "list.txt").write_text("\n".join(lines) + "\n")
    db = workdir / "lmdb"
    if db.exists():
        for f in db.iterdir():
            f.unlink()
        db.rmdir()
    convert_imageset(f"{originals}/", workdir / "list.txt", db, resize_height=SIDE, resize_width=SIDE,
                     shuffle=True, encoded=True, encode_type="jpg")
    compute_image_mean(db, workdir / "mean.binaryproto")
    done.write_text(str(count))


# ---------------------------------------------------------------------------------------------- contenders
def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its child processes: the live ones (the
    DataLoader's workers) from Linux's /proc, the ones that ended and were waited for (the workers of
    an epoch that ended: the DataLoader starts new ones for each epoch) from os.times()."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    tick = os.sysconf("SC_CLK_TCK")
    for task in pathlib.Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:
            continue  # a thread that ended meanwhile (convert-imageset's pool closing)
        for child in children:
            try:
                fields = pathlib.Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue  # exited meanwhile
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def timed(batches, count: int) -> dict:
    """Images per second and CPU seconds per image over ``count`` batches after the warm-up."""
    for _ in range(WARMUP_BATCHES):
        next(batches)
    wall, cpu = time.perf_counter(), cpu_seconds()
    for _ in range(count):
        next(batches)
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    return {"images_per_s": count * BATCH / wall, "cpu_ms_per_image": 1e3 * cpu / (count * BATCH)}


def netdef_batches(workdir: pathlib.Path, layer: str):
    import netdef

    if layer == "Data":
        source = (f'data_param {{ source: "{workdir / "lmdb"}" batch_size: {BATCH} backend: LMDB }} '
                  f'transform_param {{ crop_size: {CROP} mirror: true mean_file: "{workdir / "mean.binaryproto"}" }}')
    else:
        means = " ".join(f"mean_value: {v}" for v in MEAN_VALUES)
        source = (f'image_data_param {{ source: "{workdir / "resized" / "list.txt"}" batch_size: {BATCH} '
                  f'root_folder: "{workdir / "resized"}/" }} transform_param {{ crop_size: {CROP} mirror: true {means} }}')
    net = netdef.Net(f'layer {{ name: "data" type: "{layer}" top: "data" top: "label" {source} }}', netdef.TRAIN)
    while True:
        net.forward()
        yield net.blobs["data"].data


class LmdbDataset:
    """What a PyTorch user writes for Caffe's LMDB: lmdb + Pillow, crop, flip and mean in NumPy."""

    def __init__(self, path: pathlib.Path, mean: np.ndarray):
        import lmdb

        self.path, self.mean, self.env = str(path), mean, None
        with lmdb.open(self.path, readonly=True, lock=False) as env, env.begin() as txn:
            self.keys = [key for key, _ in txn.cursor()]

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        import lmdb
        import torch
        from PIL import Image

        from netdef.proto import netdef_pb2 as pb

        if self.env is None:  # opened in each worker process
            self.env = lmdb.open(self.path, readonly=True, lock=False, readahead=False)
        with self.env.begin() as txn:
            datum = pb.Datum.FromString(txn.get(self.keys[i]))
        bgr = np.asarray(Image.open(io.BytesIO(datum.data)).convert("RGB"))[:, :, ::-1]
        y, x = random.randint(0, bgr.shape[0] - CROP), random.randint(0, bgr.shape[1] - CROP)
        out = bgr[y:y + CROP, x:x + CROP].transpose(2, 0, 1).astype(np.float32) - self.mean[:, y:y + CROP, x:x + CROP]
        if random.random() < 0.5:
            out = out[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(out)), datum.label


class FileDataset:
    """The same for the image list: Pillow reads each file; mean values per channel."""

    def __init__(self, folder: pathlib.Path):
        self.folder = folder
        self.lines = [line.rsplit(" ", 1) for line in (folder / "list.txt").read_text().splitlines()]
        self.mean = np.asarray(MEAN_VALUES, np.float32)[:, None, None]

    def __len__(self):
        return len(self.lines)

    def __getitem__(self, i):
        import torch
        from PIL import Image

        name, label = self.lines[i]
        bgr = np.asarray(Image.open(self.folder / name).convert("RGB"))[:, :, ::-1]
        y, x = random.randint(0, bgr.shape[0] - CROP), random.randint(0, bgr.shape[1] - CROP)
        out = bgr[y:y + CROP, x:x + CROP].transpose(2, 0, 1).astype(np.float32) - self.mean
        if random.random() < 0.5:
            out = out[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(out)), int(label)


def torch_batches(workdir: pathlib.Path, layer: str, workers: int):
    import torch.utils.data

    from netdef.data.datum import read_mean_file

    if layer == "Data":
        dataset = LmdbDataset(workdir / "lmdb", read_mean_file(workdir / "mean.binaryproto")[0].astype(np.float32))
    else:
        dataset = FileDataset(workdir / "resized")
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers, drop_last=True)
    while True:
        for data, _ in loader:
            yield data


def convert_rate(workdir: pathlib.Path, threads: int, count: int) -> dict:
    import shutil
    import tempfile

    from netdef.data.convert import convert_imageset

    lines = (workdir / "list.txt").read_text().splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        # Untimed first: loading the compiled resize (numba) is once per process, not per image.
        lst = pathlib.Path(tmp) / "list.txt"
        lst.write_text("\n".join(lines[-WARMUP_IMAGES:]) + "\n")
        convert_imageset(f"{workdir / 'originals'}/", lst, pathlib.Path(tmp) / "warm", resize_height=SIDE,
                         resize_width=SIDE, encoded=True, encode_type="jpg", threads=threads)
        lst.write_text("\n".join(lines[:count]) + "\n")
        wall, cpu = time.perf_counter(), cpu_seconds()
        convert_imageset(f"{workdir / 'originals'}/", lst, pathlib.Path(tmp) / "db", resize_height=SIDE,
                         resize_width=SIDE, shuffle=True, encoded=True, encode_type="jpg", threads=threads)
        wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
        shutil.rmtree(pathlib.Path(tmp) / "db")
    return {"images_per_s": count / wall, "cpu_ms_per_image": 1e3 * cpu / count}


def machine_rate(threads: int, seconds: float = 1.0) -> dict:
    """What the cores given to a contender compute when nothing holds the GIL: ``threads`` threads
    hashing 4 MiB buffers (hashlib releases the GIL while it hashes) for ``seconds``; MiB per second
    in the ``images_per_s`` field. On a machine others share, a second core may give far less than a
    first: the ratio of this control's k cores to its 1 core is what a contender could reach."""
    import hashlib
    import threading

    buffer = os.urandom(4 << 20)
    done = [0] * threads
    stop = time.perf_counter() + seconds

    def work(i):
        while time.perf_counter() < stop:
            hashlib.sha256(buffer).digest()
            done[i] += 1

    wall, cpu = time.perf_counter(), cpu_seconds()
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    mebibytes = 4 * sum(done)
    return {"images_per_s": mebibytes / wall, "cpu_ms_per_image": 1e3 * cpu / mebibytes}


def measure(workdir: pathlib.Path, contender: str, batches: int, convert_images: int) -> dict:
    """Run one contender in this process: "<netdef|baseline|torch0|torch2|convert>:<Data|ImageData|->:<cores>"."""
    who, layer, cores = contender.split(":")
    cores = int(cores)
    if cores < len(os.sched_getaffinity(0)):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
    os.environ["NETDEF_DATA_THREADS"] = str(cores)
    if who == "convert":
        return convert_rate(workdir, cores, convert_images)
    if who == "machine":
        return machine_rate(cores)
    if who.startswith("torch"):
        return timed(torch_batches(workdir, layer, int(who[len("torch"):])), batches)
    return timed(netdef_batches(workdir, layer), batches)


# ---------------------------------------------------------------------------------------------- the table
def run_contender(args, contender: str, pythonpath: str) -> dict:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    out = subprocess.run([sys.executable, __file__, "--workdir", str(args.workdir), "--measure", contender,
                          "--batches", str(args.batches), "--convert-images", str(args.convert_images)],
                         env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{contender} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=pathlib.Path, required=True, help="where the data is built (kept)")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=12, help="timed batches per contender and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--convert-images", type=int, default=300, help="images convert-imageset converts per round")
    parser.add_argument("--baseline", type=pathlib.Path,
                        help="another checkout whose Data and ImageData layers to time too")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.workdir, args.measure, args.batches, args.convert_images)))
        return 0
    here = str(pathlib.Path(__file__).resolve().parents[1])
    build(args.workdir, args.images)
    cores = len(os.sched_getaffinity(0))
    contenders = []
    for layer in ("Data", "ImageData"):
        contenders += [(f"netdef:{layer}:1", here), (f"netdef:{layer}:{cores}", here),
                       (f"torch0:{layer}:{cores}", here), (f"torch2:{layer}:{cores}", here)]
    if args.baseline:
        contenders += [(f"baseline:{layer}:{k}", str(args.baseline.resolve())) for layer in ("Data", "ImageData")
                       for k in (1, cores)]
    contenders += [("convert:-:1", here), (f"convert:-:{cores}", here), ("machine:-:1", here),
                   (f"machine:-:{cores}", here)]
    results: dict[str, list] = {name: [] for name, _ in contenders}
    for r in range(args.rounds):
        order = contenders if r % 2 == 0 else contenders[::-1]  # alternate, so no contender always runs first
        for name, path in order:
            results[name].append(run_contender(args, name, path))
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)

    def median(name, key):
        return statistics.median(m[key] for m in results[name])

    print(f"{'contender':<24} {'cores':>5} {'images/s':>9} {'CPU ms/image':>13} {'images/CPU-s':>13}  (medians of "
          f"{args.rounds} rounds, {args.batches} batches of {BATCH} each)")
    for name, _ in contenders:
        who, layer, k = name.split(":")
        label = {"netdef": f"netdef {layer}", "baseline": f"baseline {layer}", "torch0": f"DataLoader 0 workers {layer}",
                 "torch2": f"DataLoader 2 workers {layer}", "convert": "convert-imageset",
                 "machine": "control (MiB/s hashed)"}[who]
        rate, cpu = median(name, "images_per_s"), median(name, "cpu_ms_per_image")
        print(f"{label:<24} {k:>5} {rate:>9.0f} {cpu:>13.2f} {1e3 / cpu:>13.0f}")
    print()
    for layer in ("Data", "ImageData"):
        ours = median(f"netdef:{layer}:{cores}", "images_per_s")
        peer = median(f"torch2:{layer}:{cores}", "images_per_s")
        one = median(f"netdef:{layer}:1", "images_per_s")
        per_cpu = median(f"torch2:{layer}:{cores}", "cpu_ms_per_image") / median(f"netdef:{layer}:{cores}", "cpu_ms_per_image")
        ratios = [m["images_per_s"] / p["images_per_s"] for m, p in zip(results[f"netdef:{layer}:{cores}"],
                                                                         results[f"torch2:{layer}:{cores}"])]
        print(f"{layer}: netdef / DataLoader(2 workers) = {ours / peer:.2f} (per round: "
              f"{', '.join(f'{x:.2f}' for x in ratios)}); images per CPU-second, netdef / DataLoader = "
              f"{per_cpu:.2f}; {cores} cores / 1 core = {ours / one:.2f} (target >= {0.8 * cores:.1f})")
    if args.baseline:
        for layer in ("Data", "ImageData"):
            gains = [median(f"netdef:{layer}:{k}", "images_per_s") / median(f"baseline:{layer}:{k}", "images_per_s")
                     for k in (1, cores)]
            print(f"{layer}: this checkout / baseline = {gains[0]:.2f} on 1 core, {gains[1]:.2f} on {cores}")
    conv1, convk = median("convert:-:1", "images_per_s"), median(f"convert:-:{cores}", "images_per_s")
    print(f"convert-imageset: {cores} cores / 1 core = {convk / conv1:.2f}")
    machine = median(f"machine:-:{cores}", "images_per_s") / median("machine:-:1", "images_per_s")
    machine_rounds = [k["images_per_s"] / one["images_per_s"]
                      for one, k in zip(results["machine:-:1"], results[f"machine:-:{cores}"])]
    print(f"the machine itself (the control: threads that hold no GIL): {cores} cores / 1 core = {machine:.2f} "
          f"(per round: {', '.join(f'{x:.2f}' for x in machine_rounds)}); on a machine shared with other work "
          f"the contenders' {cores}-core figures are bounded by it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
