"""The scaling model's predictions beside published scaling results (docs/scaling.md).

    python benchmarks/scaling_published.py                       # uses benchmarks/profiles/*.json
    python benchmarks/scaling_published.py --remeasure           # times the zoo nets again first

Each case takes the layer profile of a zoo net (``netdef time --json`` on this CPU, batch 2,
DummyData in place of the data layers: only the shape of the per-layer times and the parameter
sizes are used), rescales it to the per-GPU iteration time of the paper's hardware
(``--compute_ms``), and runs ``netdef simulate`` with the paper's interconnect and exchange
schedule. Every figure and its source is in ``CASES``; where a paper does not state a figure, the
value is an assumption, marked as such here and in docs/scaling.md.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
PROFILES = HERE / "profiles"
sys.path.insert(0, str(HERE))

# The zoo nets: (train_val, image shape).
NETS = {
    "alexnet": ("models/alexnet/train_val.prototxt", (3, 227, 227)),
    "googlenet": ("models/googlenet/train_val.prototxt", (3, 224, 224)),
    "vgg16": ("models/vgg16/train_val.prototxt", (3, 224, 224)),
    "resnet50": ("models/resnet50/train_val.prototxt", (3, 224, 224)),
    "resnet101": ("models/resnet101/train_val.prototxt", (3, 224, 224)),
}

TF_P100 = "tensorflow/tensorflow docs_src/performance/benchmarks.md, DGX-1 P100, synthetic data"
THEANO_MPI = "uoguelph-mlrg/Theano-MPI README, 'BSP tested on up to eight Tesla K80 GPUs' (nccl32, copper)"
HOROVOD = "horovod docs/benchmarks: 128 servers x 4 Pascal GPUs, RoCE-capable 25 Gbit/s"

# Each case: what was published, and the simulate flags that describe the paper's setup.
CASES = [
    {"name": "Synkhronos, ResNet-50, 8 GPUs (DGX-1)", "net": "resnet50", "workers": 8,
     "published": ("speed-up", 7.5, "Stooke & Abbeel 2017, arXiv:1710.04162 abstract"),
     # Per-GPU batch and Theano's speed are not in the abstract: assumed batch 32 at TensorFlow's
     # P100 rate, 195 images/s (TF_P100, batch 32) -> 164 ms.
     "compute_ms": 32 / 195 * 1e3, "compute_note": "assumed: batch 32 at 195 img/s (TF P100 table)",
     # DGX-1: 8 P100 over NVLink, NCCL; a ring at ~18 GB/s (assumed: NCCL's P100 NVLink ring);
     # Synkhronos reduces the gradients after the Theano function has computed them all.
     "flags": ["--topology=nodes", "--ranks_per_node=8", "--intra_bandwidth=18GB/s", "--intra_latency=10us",
               "--overlap=off", "--schedule=fifo", "--bucket_bytes=1000000000", "--update_rate=300"]},
    {"name": "Theano-MPI, AlexNet (128/GPU), 8 K80", "net": "alexnet", "workers": 8,
     "published": ("speed-up", 20.50 / (2.63 + 0.61), THEANO_MPI),
     "compute_ms": 20.50 / 40 * 1e3, "compute_note": "20.50 s per 5,120 images on 1 GPU (Theano-MPI README)",
     # Copper: 8 K80 GPUs in one node over PCIe 3 switches; an NCCL ring at ~5 GB/s is assumed.
     # BSP: the exchange follows the step (the README adds the two times).
     "flags": ["--topology=nodes", "--ranks_per_node=8", "--intra_bandwidth=5GB/s", "--intra_latency=15us",
               "--overlap=off", "--schedule=fifo", "--bucket_bytes=1000000000", "--update_rate=100"]},
    {"name": "Theano-MPI, GoogLeNet (32/GPU), 8 K80", "net": "googlenet", "workers": 8,
     "published": ("speed-up", 63.89 / (7.69 + 0.80), THEANO_MPI),
     "compute_ms": 63.89 / 160 * 1e3, "compute_note": "63.89 s per 5,120 images on 1 GPU (Theano-MPI README)",
     "flags": ["--topology=nodes", "--ranks_per_node=8", "--intra_bandwidth=5GB/s", "--intra_latency=15us",
               "--overlap=off", "--schedule=fifo", "--bucket_bytes=1000000000", "--update_rate=100"]},
    {"name": "Theano-MPI, ResNet-50 (64/GPU), 8 K80", "net": "resnet50", "workers": 8,
     "published": ("speed-up", 163.15 / (20.12 + 0.57), THEANO_MPI),
     "compute_ms": 163.15 / 80 * 1e3, "compute_note": "163.15 s per 5,120 images on 1 GPU (Theano-MPI README)",
     "flags": ["--topology=nodes", "--ranks_per_node=8", "--intra_bandwidth=5GB/s", "--intra_latency=15us",
               "--overlap=off", "--schedule=fifo", "--bucket_bytes=1000000000", "--update_rate=100"]},
    {"name": "Horovod, ResNet-101 (64/GPU), 512 GPUs", "net": "resnet101", "workers": 512,
     "published": ("efficiency", 0.90, HOROVOD),
     # The benchmarks page's example: 16 GPUs, 1,656.82 images/s -> 103.6 per GPU at batch 64.
     "compute_ms": 64 / (1656.82 / 16) * 1e3, "compute_note": "1,656.82 img/s on 16 GPUs (Horovod benchmarks page)",
     # 4 GPUs per server (PCIe, ~10 GB/s assumed), 25 Gbit/s RoCE between servers (~5 us assumed);
     # Tensor Fusion: gradients allreduced in backward order as they are ready, 64 MB fusion buffer,
     # by NCCL's ring across all GPUs.
     "flags": ["--topology=nodes", "--ranks_per_node=4", "--intra_bandwidth=10GB/s", "--intra_latency=5us",
               "--bandwidth=25gbit", "--latency=5us", "--schedule=fifo", "--bucket_bytes=67108864",
               "--update_rate=300", "--allreduce_algorithm=ring"]},
    {"name": "Horovod, VGG-16 (64/GPU), 512 GPUs", "net": "vgg16", "workers": 512,
     "published": ("efficiency", 0.68, HOROVOD),
     "compute_ms": 64 / 154 * 1e3, "compute_note": "154 img/s at batch 64 (TF P100 table)",
     "flags": ["--topology=nodes", "--ranks_per_node=4", "--intra_bandwidth=10GB/s", "--intra_latency=5us",
               "--bandwidth=25gbit", "--latency=5us", "--schedule=fifo", "--bucket_bytes=67108864",
               "--update_rate=300", "--allreduce_algorithm=ring"]},
    {"name": "IBM PowerAI DDL, ResNet-50, 256 P100: 90 epochs", "net": "resnet50", "workers": 256,
     "published": ("minutes for 90 epochs", 50.0, "Cho et al. 2017, arXiv:1708.02188 abstract"),
     # Per-GPU batch 32 (assumed, as in Goyal et al.'s 8k batch on 256 GPUs) at 195 img/s (TF P100).
     "compute_ms": 32 / 195 * 1e3, "compute_note": "assumed: batch 32 at 195 img/s (TF P100 table)",
     # 64 S822LC servers, 4 P100 each on NVLink (~18 GB/s ring assumed), InfiniBand between
     # servers (100 Gbit/s EDR assumed); DDL overlaps its multi-ring allreduce with backprop (modelled
     # by the cheapest of the algorithms; the multicolor column is the rank-ordered trees).
     "flags": ["--topology=nodes", "--ranks_per_node=4", "--intra_bandwidth=18GB/s", "--intra_latency=5us",
               "--bandwidth=100gbit", "--latency=2us", "--schedule=fifo", "--bucket_bytes=67108864",
               "--update_rate=300"],
     "images": 1281167 * 90, "batch": 32},
]


def measure_profiles(folder: pathlib.Path) -> None:
    from dummy_data import dummy_data_text

    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    with tempfile.TemporaryDirectory() as scratch:
        for net, (path, shape) in NETS.items():
            model = pathlib.Path(scratch) / f"{net}.prototxt"
            model.write_text(dummy_data_text(str(REPO / path), 2, shape))
            subprocess.run([sys.executable, "-m", "netdef.cli", "time", f"--model={model}", "--iterations=2",
                            f"--json={folder / (net + '.json')}"], env=env, check=True, capture_output=True)
            doc = json.loads((folder / f"{net}.json").read_text())
            doc["model"] = path  # the zoo file, not the scratch copy
            (folder / f"{net}.json").write_text(json.dumps(doc) + "\n")  # compact: committed to the repo
            print(f"# profiled {net}", flush=True)


# Every case exchanges through NCCL or the GPUs' own copies, which no communication thread polls
# (netdef's 2 ms poll is a CPU rank's), and with every rank on a GPU of its own: no sync term.
GPU_FLAGS = ["--poll_ms=0"]


def simulate(case: dict, profiles: pathlib.Path, exchange: str = "allreduce", extra=()) -> dict:
    command = [sys.executable, "-m", "netdef.cli", "simulate", str(profiles / f"{case['net']}.json"),
               f"--workers=1,{case['workers']}", f"--compute_ms={case['compute_ms']:.3f}", f"--exchange={exchange}",
               "--json", *GPU_FLAGS, *case["flags"], *extra]
    done = subprocess.run(command, capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])))
    return json.loads(done.stdout)["predictions"][-1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default=str(PROFILES), help="folder of the zoo nets' profiles")
    parser.add_argument("--remeasure", action="store_true", help="run netdef time on the zoo nets first")
    args = parser.parse_args(argv)
    profiles = pathlib.Path(args.profiles)
    if args.remeasure or not all((profiles / f"{n}.json").exists() for n in NETS):
        measure_profiles(profiles)
    print("| case | published | predicted (allreduce) | predicted (multicolor) | per-GPU compute |")
    print("| --- | --- | --- | --- | --- |")
    for case in CASES:
        kind, value, source = case["published"]
        cells = []
        for rule in ("allreduce", "multicolor"):
            p = simulate(case, profiles, rule)
            if kind == "speed-up":
                cells.append(f"{p['speedup']:.2f}x (eff. {p['efficiency']:.2f})")
            elif kind == "efficiency":
                cells.append(f"{p['efficiency']:.2f} ({p['speedup']:.0f}x)")
            else:
                minutes = case["images"] / (case["batch"] * case["workers"]) * p["iteration_s"] / 60
                cells.append(f"{minutes:.0f} min (eff. {p['efficiency']:.2f})")
        shown = f"{value:.2f}x" if kind == "speed-up" else f"{value:.2f}" if kind == "efficiency" else f"{value:.0f} min"
        print(f"| {case['name']} | {shown} ({source}) | {cells[0]} | {cells[1]} | {case['compute_ms']:.0f} ms: "
              f"{case['compute_note']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
