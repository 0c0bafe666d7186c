"""The GPU run's memory line (netdef/device_memory.py), against a stand-in for CuPy's pool and
allocator: the peak of the bytes handed out over the first iterations, the allocator put back after
them, and several solvers of one process sharing one wrapper. tests/test_gpu.py reads the line of a
real GPU run."""
from __future__ import annotations

import logging

import numpy as np

import netdef
from netdef import device_memory
from netdef.device_memory import DeviceMemoryReport, PeakWatch, report_for, watch_for


class StandInPool:
    """CuPy's memory pool: ``malloc`` hands out blocks, which count as used until freed."""

    def __init__(self):
        self.used = 0
        self.held = 0

    def malloc(self, size):
        self.used += size
        self.held = max(self.held, self.used)
        return size

    def free(self, size):
        self.used -= size

    def used_bytes(self):
        return self.used

    def total_bytes(self):
        return self.held


class StandInCupy:
    __name__ = "cupy"

    def __init__(self):
        self.pool = StandInPool()
        stand_in = self

        class Cuda:
            allocator = self.pool.malloc

            @staticmethod
            def get_allocator():
                return Cuda.allocator

            @staticmethod
            def set_allocator(allocator):
                Cuda.allocator = allocator

        self.cuda = Cuda
        self.get_default_memory_pool = lambda: stand_in.pool

    def allocate(self, size):
        return self.cuda.allocator(size)


def test_the_watch_keeps_the_most_bytes_handed_out_at_once_and_puts_the_allocator_back():
    cupy = StandInCupy()
    cupy.allocate(100)
    watch = PeakWatch(cupy)
    assert watch.opened and watch.peak == 100 and cupy.cuda.allocator == watch.malloc
    block = cupy.allocate(400)
    cupy.pool.free(block)
    cupy.allocate(50)
    assert watch.peak == 500
    watch.close()
    assert cupy.cuda.allocator == cupy.pool.malloc
    cupy.allocate(10_000)  # no longer watched
    assert watch.peak == 500
    watch.close()  # once


def test_watches_open_together_share_the_wrapper_and_the_last_takes_it_out():
    cupy = StandInCupy()
    first, second = PeakWatch(cupy), PeakWatch(cupy)
    assert first.opened and second.opened and cupy.cuda.allocator == first.malloc
    cupy.allocate(300)
    first.close()
    third = PeakWatch(cupy)  # the wrapper is still in: the third joins it
    assert third.opened and cupy.cuda.allocator == first.malloc
    cupy.allocate(200)
    assert (first.peak, second.peak, third.peak) == (300, 500, 500)
    second.close()
    third.close()
    assert cupy.cuda.allocator == cupy.pool.malloc


def test_a_users_own_allocator_is_left_alone_and_nothing_is_measured(caplog):
    cupy = StandInCupy()
    mine = lambda size: size  # noqa: E731
    cupy.cuda.set_allocator(mine)
    with caplog.at_level(logging.INFO, logger="netdef"):
        report = DeviceMemoryReport(cupy)
        for iteration in range(1, 4):
            report.iteration_ended(iteration)
        report.close()
    assert cupy.cuda.allocator is mine
    assert "Device memory: not measured (an allocator other than CuPy's pool is set)" in caplog.text
    assert "at most" not in caplog.text


def test_the_report_says_the_peak_of_the_first_iterations_once(caplog):
    cupy = StandInCupy()
    cupy.allocate(3 << 20)  # the weights
    report = DeviceMemoryReport(cupy, graph_pool_bytes=lambda: 1 << 20)
    # Iterations 1 and 2 are watched (peaks 3 + 1, then 3 + 2 MiB); 3 and 4 allocate unseen.
    with caplog.at_level(logging.INFO, logger="netdef"):
        for iteration in range(1, 1 + device_memory.WATCHED_ITERATIONS + 2):
            cupy.pool.free(cupy.allocate(iteration << 20))
            report.iteration_ended(iteration)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Device memory")]
    assert lines == ["Device memory: at most 5.0 MiB in use at once up to iteration 2; CuPy's pool holds 5.0 MiB, "
                     "the CUDA graphs' recordings 1.0 MiB more"]
    assert cupy.cuda.allocator == cupy.pool.malloc
    report.close()


def test_a_cpu_run_has_no_report():
    net = netdef.Net('layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }\n'
                     'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 2 } }',
                     netdef.TRAIN)
    assert {blob.array_module for blob in net.learnable_params} == {np}
    assert report_for(net) is None and watch_for(net) is None
