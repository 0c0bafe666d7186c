"""How much GPU memory training takes, said once in the log: the most bytes CuPy's memory pool had
handed out at once over a GPU run's first iterations (``netdef train``; ``netdef time``: its first
forward and backward), and what the pool holds.

CuPy keeps no peak counter. For the first ``WATCHED_ITERATIONS`` iterations (the first allocates what
later ones reuse: cuDNN's plans and workspace, the layers' scratch, the solver's history; the second
is one in the steady state) every allocation goes through ``PeakWatch.malloc``, which asks the pool
how many bytes it has handed out and keeps the largest; then the allocator before it is back, so the
iterations after pay nothing. The figure is what a user sizes a batch by (PyTorch's
``max_memory_allocated``); the pool's total also counts freed blocks it keeps for reuse, and the CUDA
graphs' recordings (``net_graphs.py``) hold pools of their own, said beside it. Memory that libraries
allocate outside CuPy's pool (cuDNN's handle, NCCL's buffers) is not in it.
"""
from __future__ import annotations

import logging

logger = logging.getLogger("netdef")

MIB = 1 << 20
WATCHED_ITERATIONS = 2


class PeakWatch:
    """While open, the most bytes ``cupy``'s default memory pool has handed out at once (``peak``),
    from the allocations of every thread. The watches open at once (two solvers of one process) share
    one wrapper of the pool's allocator, put in by the first and taken out by the last. A watch opens
    only over the pool's own allocator: where a user set another (``cupy.cuda.set_allocator``), the
    pool's counts do not describe the run (``opened`` is False)."""

    _open: list["PeakWatch"] = []  # the open watches of this process, which the wrapper serves
    _wrapper = None                # the allocator put in while any is open (the first one's ``malloc``)

    def __init__(self, cupy):
        self._cupy = cupy
        self._pool = cupy.get_default_memory_pool()
        self.peak = self._pool.used_bytes()
        current = cupy.cuda.get_allocator()
        self.opened = current == (PeakWatch._wrapper if self._open else self._pool.malloc)
        if self.opened:
            if not self._open:
                PeakWatch._wrapper = self.malloc
                cupy.cuda.set_allocator(self.malloc)
            self._open.append(self)

    def malloc(self, size: int):
        """The wrapper: the pool's allocation, every open watch's peak raised to what is now handed out.
        (Threads racing here may lose a step up, never the last one's.)"""
        memory = self._pool.malloc(size)
        used = self._pool.used_bytes()
        for watch in self._open:
            if used > watch.peak:
                watch.peak = used
        return memory

    def pool_bytes(self) -> int:
        """What the pool holds: the bytes handed out and the freed blocks it keeps for reuse."""
        return self._pool.total_bytes()

    def close(self) -> None:
        """Stop watching (once); the last watch to close puts the pool's own allocator back."""
        if not self.opened:
            return
        self.opened = False
        self._open.remove(self)
        if not self._open:
            PeakWatch._wrapper = None
            self._cupy.cuda.set_allocator(self._pool.malloc)


def peak_line(watch: PeakWatch, when: str, graph_pool_bytes: int = 0) -> str:
    """The log's line for a closed ``watch`` that measured ``when``."""
    graphs = f", the CUDA graphs' recordings {graph_pool_bytes / MIB:.1f} MiB more" if graph_pool_bytes else ""
    return (f"Device memory: at most {watch.peak / MIB:.1f} MiB in use at once {when}; CuPy's pool holds "
            f"{watch.pool_bytes() / MIB:.1f} MiB{graphs}")


NOT_MEASURED = "Device memory: not measured (an allocator other than CuPy's pool is set)"


class DeviceMemoryReport:
    """Says, once ``WATCHED_ITERATIONS`` iterations have ended, the most device memory they had in use
    at once (module docstring). ``graph_pool_bytes``: what the net's CUDA graphs' own pools hold now."""

    def __init__(self, cupy, graph_pool_bytes=lambda: 0):
        self._watch = PeakWatch(cupy)
        self._graph_pool_bytes = graph_pool_bytes
        self._left = WATCHED_ITERATIONS
        if not self._watch.opened:
            logger.info(NOT_MEASURED)

    def iteration_ended(self, iteration: int) -> None:
        watch = self._watch
        if not watch.opened:
            return
        self._left -= 1
        if self._left:
            return
        watch.close()
        logger.info(peak_line(watch, f"up to iteration {iteration}", self._graph_pool_bytes()))

    def close(self) -> None:
        """A run that ends (or fails) before the watch has: its allocator back, nothing said."""
        self._watch.close()


def device_module(net):
    """CuPy where ``net``'s parameters live on a GPU, else None."""
    module = net.learnable_params[0].array_module if net.learnable_params else None
    return module if module is not None and module.__name__.startswith("cupy") else None


def report_for(net) -> DeviceMemoryReport | None:
    """The report for a solver training ``net``: None where it runs on the CPU."""
    cupy = device_module(net)
    if cupy is None:
        return None
    return DeviceMemoryReport(cupy, lambda: net.cuda_graphs.pool_bytes() if net.cuda_graphs else 0)


def watch_for(net) -> PeakWatch | None:
    """An open watch over what ``net``'s passes allocate next: None on the CPU, and where it cannot be
    measured (which the log then says)."""
    cupy = device_module(net)
    if cupy is None:
        return None
    watch = PeakWatch(cupy)
    if not watch.opened:
        logger.info(NOT_MEASURED)
        return None
    return watch
