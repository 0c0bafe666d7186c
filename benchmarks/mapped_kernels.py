"""The kernels that apply a channel map to the output they write, alone: the blocked depthwise
convolution (``depthwise.forward_mapped``) and the pointwise product by panels
(``matmul.matmul_row_mapped``), with BatchNorm + Scale + ReLU mapped in, on MobileNet v2's and
ResNet-50's shapes. Median microseconds per call.

``--baseline PATH`` times another checkout's kernels in the same process, call for call in turn with
this checkout's (the order swapped every other call), and checks that both give the same bits (its
``netdef/layers`` modules loaded under another package name: other_checkout.py). An earlier version
ran each checkout in processes of its own, alternating: the process that ran second in a round ran
faster whichever checkout it was, by as much as the change being measured.

    python benchmarks/mapped_kernels.py --batches 8,1 --baseline /path/to/other/checkout
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import other_checkout  # noqa: E402

DEPTHWISE = ((144, 56), (576, 14), (960, 7))  # channels, plane side (MobileNet v2's expansions)
POINTWISE = ((256, 64, 56), (960, 160, 7), (64, 384, 14))  # output channels, input channels, side


def load_baseline(checkout: pathlib.Path):
    """The baseline's layers.depthwise, layers.matmul, layers.fusion and layers.im2col modules."""
    return other_checkout.load_baseline(checkout, "layers.depthwise", "layers.matmul", "layers.fusion",
                                        "layers.im2col")


def this_checkout():
    from netdef.layers import depthwise, fusion, im2col, matmul

    return depthwise, matmul, fusion, im2col


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="8,1")
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--baseline", type=pathlib.Path, help="another checkout, timed call for call in turn")
    args = parser.parse_args()
    versions = {"this": this_checkout()}
    if args.baseline:
        versions["baseline"] = load_baseline(args.baseline.resolve())
    rng = np.random.default_rng(0)

    def per_channel(channels):
        values = [rng.standard_normal(channels).astype(np.float32) for _ in range(4)]
        values[1] = np.abs(values[1]) + 1
        return values

    def maps(values, dims):
        mean, std, scale, bias = values
        return [v[2].ChannelMap(dims, mean=mean, std=std, scale=scale, bias=bias, negative_slope=0.0)
                for v in versions.values()]

    print("median us per call" + (", this / baseline" if args.baseline else ""))
    for batch in (int(b) for b in args.batches.split(",")):
        for channels, side in DEPTHWISE:
            x = rng.standard_normal((batch, channels, side, side)).astype(np.float32)
            w = rng.standard_normal((channels, 1, 3, 3)).astype(np.float32)
            outs = [np.empty_like(x) for _ in versions]
            cmaps = maps(per_channel(channels), (batch, channels, side * side))
            calls = []
            for (dw, _, _, im2col), out, m in zip(versions.values(), outs, cmaps):
                geom = im2col.Geometry((3, 3), (1, 1), (1, 1), (1, 1))
                if not dw.forward_mapped(x, w, geom, out, m):
                    raise SystemExit("the blocked depthwise kernel does not take these arrays here")
                calls.append(lambda dw=dw, geom=geom, out=out, m=m: dw.forward_mapped(x, w, geom, out, m))
            report(f"batch {batch} depthwise 3x3, {channels} x {side} x {side}", outs, microseconds(calls, args.reps))
        for outputs, inputs, side in POINTWISE:
            a = rng.standard_normal((outputs, inputs)).astype(np.float32)
            b = rng.standard_normal((batch, inputs, side * side)).astype(np.float32)
            outs = [np.empty((batch, outputs, side * side), np.float32) for _ in versions]
            cmaps = maps(per_channel(outputs), (batch, outputs, side * side))
            calls = []
            for (_, mm, _, _), out, m in zip(versions.values(), outs, cmaps):
                if not mm.matmul_row_mapped(a, b, out, m):
                    raise SystemExit("the products run on NumPy here (no pool BLAS)")
                calls.append(lambda mm=mm, out=out, m=m: mm.matmul_row_mapped(a, b, out, m))
            report(f"batch {batch} 1x1 {outputs} x {inputs} on {side} x {side}", outs,
                   microseconds(calls, args.reps))


def microseconds(calls: list, reps: int) -> list[float]:
    return [1e6 * seconds for seconds in other_checkout.timed_in_turn(calls, reps)]


def report(name: str, outs: list, medians: list[float]) -> None:
    if len(outs) == 2 and not np.array_equal(outs[0], outs[1], equal_nan=True):
        raise SystemExit(f"{name}: this checkout and the baseline give different values")
    ratio = f"  {medians[0] / medians[1]:.3f}" if len(medians) == 2 else ""
    print(f"  {name:<40} " + "  ".join(f"{m:9.1f}" for m in medians) + ratio)


if __name__ == "__main__":
    main()
