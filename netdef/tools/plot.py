"""``netdef plot LOG... OUT.png``: learning curves of one or more training logs, drawn with matplotlib.

Three panels over a shared x axis (iterations, or seconds since the start with ``x="seconds"``): the
train net's outputs (its losses), the test nets' outputs (accuracy, loss...), and the learning rate as
logged ("Iteration N, lr = r"; on a log scale when it spans more than a factor of ten). Each log keeps
one colour in every panel; each output of a log has its own line style. The logs are parsed by ``curves.parse_log``.

matplotlib is optional (``pip install 'netdef-trainer[plot]'``); it draws through its Agg canvas, with
no window and no global pyplot state.
"""
from __future__ import annotations

import io
import math
import os

from .. import files
from .curves import Curves, LogError, parse_log

FORMATS = ("png", "svg", "pdf")
_X_COLUMNS = {"iterations": ("NumIters", "iterations"), "seconds": ("Seconds", "seconds")}
_STYLES = ("-", "--", ":", "-.")


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("netdef plot needs matplotlib: pip install 'netdef-trainer[plot]' "
                          "(or pip install matplotlib)") from None
    return Figure, FigureCanvasAgg


def plot_logs(log_paths, output, x: str = "iterations", overwrite: bool = False) -> list[Curves]:
    """Plot the logs to ``output`` (its extension gives the format); returns what was parsed."""
    output = os.fspath(output)
    fmt = os.path.splitext(output)[1].lstrip(".").lower()
    if fmt not in FORMATS:
        raise LogError(f"{output}: the file name must end in one of .{', .'.join(FORMATS)} (the format to write)")
    if x not in _X_COLUMNS:
        raise LogError(f"--x must be iterations or seconds, got {x!r}")
    if os.path.lexists(output) and not overwrite:
        raise LogError(f"{output} exists; not replacing it (pass --overwrite to replace it)")
    every = [parse_log(path) for path in log_paths]
    figure = draw_curves(every, x)
    buffer = io.BytesIO()
    figure.savefig(buffer, format=fmt, dpi=110)
    files.write_bytes_atomically(output, buffer.getvalue())
    return every


def draw_curves(every: list[Curves], x: str = "iterations"):
    """The matplotlib Figure of the logs' curves."""
    Figure, FigureCanvasAgg = _matplotlib()
    column, x_label = _X_COLUMNS[x]
    figure = Figure(figsize=(9, 9), layout="constrained")
    FigureCanvasAgg(figure)
    train_axes, test_axes, rate_axes = figure.subplots(3, 1, sharex=True)
    colours = [f"C{i % 10}" for i in range(len(every))]
    names = _short_names([c.source for c in every])
    rates = []
    for curves, colour, name in zip(every, colours, names):
        for style, output in zip(_cycle(_STYLES), curves.train.outputs):
            train_axes.plot(curves.train.column(column), curves.train.column(output), style, color=colour,
                            label=f"{name}: {output}")
        for style, output in zip(_cycle(_STYLES), curves.test.outputs):
            test_axes.plot(curves.test.column(column), curves.test.column(output), style, color=colour,
                           marker="o", markersize=3, label=f"{name}: {output}")
        # The rate holds from the iteration that logged it to the next: a step, not a slope.
        values = curves.rates.column("LearningRate")
        rate_axes.plot(curves.rates.column(column), values, color=colour, label=name, drawstyle="steps-post")
        rates.extend(v for v in values if v > 0 and math.isfinite(v))
    train_axes.set_title("train net outputs")
    test_axes.set_title("test net outputs")
    rate_axes.set_title("learning rate")
    if rates and max(rates) > 10 * min(rates):
        rate_axes.set_yscale("log")
    rate_axes.set_xlabel(x_label)
    for axes in (train_axes, test_axes, rate_axes):
        axes.grid(True, alpha=0.3)
        if axes.lines:
            axes.legend(fontsize=8)
    return figure


def _cycle(items):
    while True:
        yield from items


def _short_names(paths: list[str]) -> list[str]:
    """The logs' file names, or their paths where two logs share a name."""
    names = [os.path.basename(p) for p in paths]
    return [p if names.count(n) > 1 else n for p, n in zip(paths, names)]
