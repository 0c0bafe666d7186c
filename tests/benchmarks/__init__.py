"""Tests of the scripts in benchmarks/ (their parsing and tables, not their measurements)."""
import contextlib
import importlib
import pathlib
import sys

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def benchmark_module(name: str):
    """benchmarks/<name>.py imported as the scripts import each other (benchmarks/ on sys.path)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
