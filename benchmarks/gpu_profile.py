"""Where a training iteration's time goes on a GPU (issue 29): for each net, as gpu_train.py builds it
(the zoo's TRAIN net on a fixed device-resident batch, the solver ``netdef train`` makes):

- the iteration (forward, backward, update) and forward+backward alone, in ms, between device-wide
  synchronisations, and PyTorch's iteration on the same net for scale;
- the host's share: the host's CPU time per iteration while it queues work (``time.thread_time``);
  near the wall time, the GPU waits for Python;
- each layer type's device time forward and backward (CUDA events around each step, as
  ``netdef time --gpu``: a chain the net runs as one step counts under its first layer's type forward
  and its last's backward);
- the host functions with the most time of their own over a few iterations (cProfile);
- the CUDA kernels of an iteration of each framework, the longest first, with the share of the
  iteration the device was busy (PyTorch's profiler, which records every kernel of the process).

    python benchmarks/gpu_profile.py [--nets resnet50,googlenet] [--precision float32] [--batch-scale 1]
                                     [--iters 5] [--top 25] [--kernels 15] [--cuda-graphs]
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import sys
import time

import gpu_train
from netdef import backend


def layer_type_times(net, iterations: int) -> dict:
    """{layer type: [forward ms, backward ms, layers]} per iteration, by CUDA events."""
    from netdef.timing import LayerTimer, clock_for

    timer = LayerTimer(net, clock_for(0))
    for _ in range(iterations):
        timer.run_iteration()
    by_type = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for li, layer in enumerate(net.layers):
        entry = by_type[layer.type]
        entry[0] += timer.forward_ms[li] / iterations
        entry[1] += timer.backward_ms[li] / iterations
        entry[2] += 1
    return dict(by_type)


def kernel_table(torch, run, iterations: int) -> list[tuple[str, float, float]]:
    """[(kernel name, launches per iteration, device ms per iteration)] of every CUDA kernel launched
    while ``run(iterations)`` ran, the longest first, as PyTorch's profiler (CUPTI) records them: every
    kernel of the process, CuPy's and cuDNN's for netdef as much as PyTorch's own."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as recorded:
        run(iterations)
        torch.cuda.synchronize()
    rows = [(event.key, event.count / iterations, event.self_device_time_total / 1000 / iterations)
            for event in recorded.key_averages() if event.self_device_time_total > 0]
    return sorted(rows, key=lambda row: -row[2])


def print_kernels(title: str, rows, wall_ms: float, top: int) -> None:
    busy = sum(ms for _, _, ms in rows)
    print(f"# {title}: kernels {busy:.1f} ms of a {wall_ms:.1f} ms iteration ({busy / wall_ms:.0%} busy), "
          f"{sum(calls for _, calls, _ in rows):.0f} launches; the {top} longest:")
    for name, calls, ms in rows[:top]:
        print(f"#   {ms:8.2f} ms {calls:6.0f} x  {name[:110]}")


def profile_net(key: str, precision: str, args, device, torch) -> None:
    label, batch = gpu_train.NETS[key]
    batch = gpu_train.scaled_batch(batch, args.batch_scale)
    backend.set_precision(precision)
    device.configure_torch(torch, precision)
    device.free()
    solver = gpu_train.build_solver(gpu_train.solver_param(gpu_train.train_net_param(key, batch), True))
    solver.net.cuda_graphs = args.cuda_graphs
    gpu_train.fill_batch(solver.net)
    solver.step(4)  # with graphs, the fourth iteration records them (the first is a kind of its own)
    iteration_ms = gpu_train.timed_ms(solver.step, args.iters, device)
    forward_backward_ms = gpu_train.timed_ms(lambda n: [solver.net.forward_backward() for _ in range(n)],
                                             args.iters, device)
    device.synchronize()
    host_start = time.thread_time()
    wall_start = time.perf_counter()
    solver.step(args.iters)
    host_ms = (time.thread_time() - host_start) * 1000 / args.iters
    queued_ms = (time.perf_counter() - wall_start) * 1000 / args.iters
    device.synchronize()
    torch_iteration = gpu_train.torch_trainer(torch, solver.net, device.torch_device)
    for _ in range(3):
        torch_iteration()
    torch_ms = gpu_train.timed_ms(lambda n: [torch_iteration() for _ in range(n)], args.iters, device)
    print(f"\n## {label} batch {batch} {precision}: iteration {iteration_ms:.1f} ms "
          f"({batch / iteration_ms * 1000:.0f} img/s), forward+backward {forward_backward_ms:.1f} ms, "
          f"update {iteration_ms - forward_backward_ms:.1f} ms; host CPU {host_ms:.1f} ms of {queued_ms:.1f} ms "
          f"until step() returned; PyTorch {torch_ms:.1f} ms ({batch / torch_ms * 1000:.0f} img/s)", flush=True)

    profiler = cProfile.Profile()
    device.synchronize()
    profiler.enable()
    solver.step(args.iters)
    device.synchronize()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(args.top)
    print(f"# host functions by own time over {args.iters} iterations (cProfile adds its own overhead):")
    print("\n".join(line for line in text.getvalue().splitlines()[4:] if line.strip()), flush=True)

    if args.kernels:
        netdef_kernels = kernel_table(torch, solver.step, args.iters)
        torch_kernels = kernel_table(torch, lambda n: [torch_iteration() for _ in range(n)], args.iters)
        print_kernels("netdef", netdef_kernels, iteration_ms, args.kernels)
        print_kernels("PyTorch", torch_kernels, torch_ms, args.kernels)

    # Step by step, each step's own forward_range: without graphs, which would record each step alone.
    solver.net.cuda_graphs = False
    times = layer_type_times(solver.net, args.iters)
    total = sum(f + b for f, b, _ in times.values())
    print(f"{'layer type':<22}{'layers':>7}{'forward ms':>12}{'backward ms':>13}{'share':>7}")
    for kind, (fwd, bwd, count) in sorted(times.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
        print(f"{kind:<22}{count:>7}{fwd:>12.2f}{bwd:>13.2f}{(fwd + bwd) / total:>7.0%}")
    print(f"{'all (events)':<22}{len(solver.net.layers):>7}{sum(f for f, _, _ in times.values()):>12.2f}"
          f"{sum(b for _, b, _ in times.values()):>13.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nets", default="resnet50,googlenet")
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--batch-scale", type=float, default=1.0)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--top", type=int, default=25, help="host functions listed per net (default 25)")
    parser.add_argument("--kernels", type=int, default=15, metavar="N",
                        help="list the N longest CUDA kernels of an iteration of each framework (PyTorch's "
                             "profiler; 0: none)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="the iterations replay the net's stretches from CUDA graphs (the per-layer device "
                             "times are still taken layer by layer, without)")
    args = parser.parse_args(argv)
    import torch

    device = gpu_train.GpuDevice(0)
    device.use_for_netdef()
    for line in device.describe(torch):
        print(f"# {line}")
    for key in [k.strip() for k in args.nets.split(",") if k.strip()]:
        for precision in [p.strip() for p in args.precision.split(",") if p.strip()]:
            try:
                profile_net(key, precision, args, device, torch)
                device.free()  # the net and its PyTorch mirror are gone with profile_net's frame
            except Exception as exc:  # noqa: BLE001 - one net's failure must not hide the others' profiles
                print(f"\n## {key} {precision}: error: {type(exc).__name__}: {exc}", flush=True)
                device.free()


if __name__ == "__main__":
    sys.exit(main())
