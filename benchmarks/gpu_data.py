"""Issue 29's data target: a zoo net trained on a GPU from an LMDB of JPEG Datums, Caffe's ImageNet recipe
(256 x 256 images, random 224 crop, mirror, mean image), against the same net on a batch already on the
device; the LMDB run should be within 5% of the synthetic one.

    python benchmarks/gpu_data.py [--net resnet50] [--batch 128] [--images 2000] [--iters 10] [--rounds 3]
    python benchmarks/gpu_data.py --device cpu --net squeezenet --batch 4 --images 64 --iters 2 --rounds 1
                                  # a check of the script, no GPU

The LMDB: ``--images`` natural-looking JPEGs (data_pipeline.py's, 300-500 px) converted as Caffe's recipe
does (``convert-imageset --resize_height=256 --resize_width=256 --shuffle --encoded``, then
``compute-image-mean``), built once in ``--workdir``. The nets: the zoo's train_val.prototxt, TRAIN
phase, with its data layer either an Input holding one random batch on the device (gpu_train.py's) or a
Data layer reading that LMDB (``crop_size: 224 mirror: true mean_file``, the prefetcher decoding on the
host's cores into pinned buffers); the solver ``netdef train`` builds (SGD, momentum 0.9, weight decay
5e-4). Rounds alternate the two; each times ``--iters`` iterations between device-wide
synchronisations after 3 warm-up iterations; medians. The log line of the data threads says how many the
Data layer took.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import data_pipeline  # noqa: E402
import gpu_train  # noqa: E402
from netdef import backend  # noqa: E402
from netdef.proto import netdef_pb2 as pb  # noqa: E402

WARMUP = 3


def lmdb_net_param(key: str, batch: int, workdir: pathlib.Path) -> pb.NetParameter:
    """gpu_train's TRAIN net with its Input replaced by a Data layer on the LMDB in ``workdir``."""
    param = gpu_train.train_net_param(key, batch)
    data = param.layer[0]
    assert data.type == "Input" and list(data.top) == ["data", "label"], data
    data.type = "Data"
    data.ClearField("input_param")
    data.data_param.source = str(workdir / "lmdb")
    data.data_param.batch_size = batch
    data.data_param.backend = pb.DataParameter.LMDB
    data.transform_param.crop_size = gpu_train.image_shape(key)[-1]
    data.transform_param.mirror = True
    data.transform_param.mean_file = str(workdir / "mean.binaryproto")
    return param


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--net", default="resnet50", choices=list(gpu_train.NETS))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", default="float32", choices=gpu_train.PRECISIONS)
    parser.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("/tmp/netdef-gpu-data"))
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    args = parser.parse_args(argv)
    if args.images < args.batch:
        parser.error("--images must be at least --batch")

    started = time.perf_counter()
    data_pipeline.build(args.workdir, args.images)
    print(f"# LMDB of {args.images} JPEG Datums (256 x 256) in {args.workdir}: "
          f"ready after {time.perf_counter() - started:.0f} s", flush=True)
    device = gpu_train.GpuDevice(0) if args.device == "gpu" else gpu_train.CpuDevice()
    device.use_for_netdef()
    backend.set_precision(args.precision)
    gpu = args.device == "gpu"
    solvers = {
        "synthetic": gpu_train.build_solver(gpu_train.solver_param(gpu_train.train_net_param(args.net, args.batch), gpu)),
        "lmdb": gpu_train.build_solver(gpu_train.solver_param(lmdb_net_param(args.net, args.batch, args.workdir), gpu)),
    }
    gpu_train.fill_batch(solvers["synthetic"].net)
    for solver in solvers.values():
        solver.step(WARMUP)
    times = {name: [] for name in solvers}
    for round_index in range(args.rounds):
        order = list(solvers) if round_index % 2 == 0 else list(reversed(solvers))
        for name in order:
            times[name].append(gpu_train.timed_ms(solvers[name].step, args.iters, device))
    label = gpu_train.NETS[args.net][0]
    medians = {name: statistics.median(ms) for name, ms in times.items()}
    ratio = medians["lmdb"] / medians["synthetic"]
    print(f"# {args.device}, {label} batch {args.batch}, {args.precision}, medians of {args.rounds} rounds of "
          f"{args.iters} iterations")
    for name, ms in medians.items():
        print(f"{name:<10} {ms:8.1f} ms/iteration  {args.batch / ms * 1000:8.1f} img/s   "
              f"(rounds: {', '.join(f'{m:.1f}' for m in times[name])})")
    print(f"lmdb / synthetic: {ratio:.3f} (target <= 1.05)")
    return {"medians_ms": medians, "ratio": ratio, "times": times}


if __name__ == "__main__":
    main()
