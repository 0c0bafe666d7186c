"""Learning curves read from a training log, Caffe's or netdef's (the same glog lines), and written as
the two CSV tables of Caffe's tools/extra/parse_log.py (``netdef parse-log LOG OUTDIR``).

The lines read::

    I0612 10:31:02.123456  4242 solver.cpp:...] Solving LeNet                  (time zero)
    ... Iteration 100 ...                                 (every line naming an iteration sets it)
    ... Iteration 100, lr = 0.01                          (the learning rate from then on)
    ...     Train net output #0: loss = 0.2917            (a row of the train table)
    ...     Test net output #0: accuracy = 0.9873         (a row of the test table)

A table has the columns NumIters, Seconds (since the "Solving" line, else since the first line with a
time stamp), LearningRate (the last one logged at that point; the first row, logged before any,
takes the second row's, as parse_log.py does), then one column per output name. Outputs logged at
the same iteration make one row; a second test net's outputs at that iteration start another (parse_log
pushes a row once it has as many columns as the first). glog stamps carry no year: a stamp earlier than
the one before it is taken to be in the next year.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime
import io
import math
import os
import re

from .. import files

_ITERATION = re.compile(r"Iteration (\d+)")
_LEARNING_RATE = re.compile(r"lr = ([-+]?[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?)")
_OUTPUT = {"train": re.compile(r"Train net output #\d+: (\S+) = ([-+.\deE]+|nan|inf|-inf)"),
           "test": re.compile(r"Test net output #\d+: (\S+) = ([-+.\deE]+|nan|inf|-inf)")}
_STAMP = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6})")
LOG_TEXT_LIMIT = 2**31


class LogError(ValueError):
    """A log with nothing to plot or tabulate, or an output that would replace a file."""


@dataclasses.dataclass
class Table:
    """Rows of {column: value}; ``columns`` in order: NumIters, Seconds, LearningRate, then outputs."""

    columns: list = dataclasses.field(default_factory=lambda: ["NumIters", "Seconds", "LearningRate"])
    rows: list = dataclasses.field(default_factory=list)

    def column(self, name: str) -> list[float]:
        return [row.get(name, math.nan) for row in self.rows]

    @property
    def outputs(self) -> list[str]:
        return self.columns[3:]


@dataclasses.dataclass
class Curves:
    """What one log holds: the train and test tables."""

    source: str
    train: Table
    test: Table
    rates: Table   # one row per "Iteration N, lr = r" line, at its own iteration (the plot's rate curve)


class _Clock:
    """Seconds since the start, from glog stamps (month, day and time; the year is not written)."""

    def __init__(self):
        self.start: datetime.datetime | None = None
        self.last: datetime.datetime | None = None
        self.year = 2000  # a leap year, so that a stamp of 29 February parses

    def read(self, line: str) -> float | None:
        match = _STAMP.match(line)
        if match is None:
            return None
        month, day, hour, minute, second, micros = (int(g) for g in match.groups())
        stamp = datetime.datetime(self.year, month, day, hour, minute, second, micros)
        if self.last is not None and stamp < self.last:
            self.year += 1
            stamp = stamp.replace(year=self.year)
        self.last = stamp
        if self.start is None:
            self.start = stamp
        return (stamp - self.start).total_seconds()

    def restart(self) -> None:
        """The "Solving" line: time zero is this line's stamp."""
        self.start = self.last


def parse_log(path) -> Curves:
    """The train and test tables of the log at ``path``."""
    path = os.fspath(path)
    text = files.read_input_file(path, "log", LOG_TEXT_LIMIT).decode("utf-8", errors="replace")
    clock = _Clock()
    tables = {"train": Table(), "test": Table()}
    rates = Table()
    open_rows: dict[str, dict | None] = {"train": None, "test": None}
    iteration = None
    seconds = 0.0
    rate = math.nan
    for line in text.splitlines():
        stamp = clock.read(line)
        if stamp is not None:
            seconds = stamp
        if " Solving " in line or line.rstrip().endswith("] Solving"):
            clock.restart()
            seconds = 0.0
        found = _ITERATION.search(line)
        if found:
            iteration = int(found.group(1))
        if iteration is None:
            continue
        found = _LEARNING_RATE.search(line)
        if found:
            rate = float(found.group(1))
            rates.rows.append({"NumIters": iteration, "Seconds": seconds, "LearningRate": rate})
        for kind, pattern in _OUTPUT.items():
            found = pattern.search(line)
            if not found:
                continue
            table, row = tables[kind], open_rows[kind]
            name, value = found.group(1), float(found.group(2))
            if row is None or row["NumIters"] != iteration or name in row:
                row = {"NumIters": iteration, "Seconds": seconds, "LearningRate": rate}
                table.rows.append(row)
                open_rows[kind] = row
            if name not in table.columns:
                table.columns.append(name)
            row[name] = value
    for table in tables.values():
        if len(table.rows) > 1 and math.isnan(table.rows[0]["LearningRate"]):
            table.rows[0]["LearningRate"] = table.rows[1]["LearningRate"]
    if not tables["train"].rows and not tables["test"].rows:
        raise LogError(f"{path}: no 'Train net output' or 'Test net output' lines after an 'Iteration N' line; "
                       f"is it the log (stderr) of caffe train or netdef train?")
    return Curves(path, tables["train"], tables["test"], rates)


def table_csv(table: Table, delimiter: str = ",") -> str:
    """The table as parse_log.py writes it: a header of the column names, then the rows (Python's float
    text; an output missing from a row is left empty)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=table.columns, delimiter=delimiter, lineterminator="\r\n")
    writer.writeheader()
    for row in table.rows:
        writer.writerow({name: float(value) for name, value in row.items()})
    return out.getvalue()


def write_tables(log_path, output_dir, delimiter: str = ",", overwrite: bool = False) -> list[str]:
    """Write ``OUTDIR/<log name>.train`` and ``.test``; returns their paths. Neither is written when
    one would replace a file and not ``overwrite``."""
    curves = parse_log(log_path)
    base = os.path.join(os.fspath(output_dir), os.path.basename(os.fspath(log_path)))
    targets = [(base + ".train", curves.train), (base + ".test", curves.test)]
    existing = [path for path, _ in targets if os.path.lexists(path)]
    if existing and not overwrite:
        raise LogError(f"{', '.join(existing)} exist(s); not replacing (pass --overwrite to replace)")
    os.makedirs(os.fspath(output_dir), exist_ok=True)
    for path, table in targets:
        files.write_bytes_atomically(path, table_csv(table, delimiter).encode("utf-8"))
    return [path for path, _ in targets]
