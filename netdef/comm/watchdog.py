"""The stall watchdog: a rank that waits too long for the others says which ranks have not come, and
in the end stops the job, instead of waiting forever without a word.

A rank that stops (SIGSTOP, a hung file system, a Python layer that never returns) leaves every
other rank inside a collective that cannot complete. As Horovod's stall check and PyTorch's
collective watchdog do, each rank runs a watchdog thread:

- The rank marks its waits: every blocking call that needs the other ranks (the communicator's
  collectives and request waits, the exchange rule's waits for gradients) runs inside
  ``watchdog.waiting(WHAT)``, and the parallel seam says which iteration the rank is in
  (``at_iteration``). A mark is a few stores under a lock, no MPI call.
- When one of its waits has lasted ``warn_after_s`` (and every ``warn_after_s`` after that), the
  rank asks every other rank where it is, over a side channel (a duplicate of the communicator, so
  that no exchange's messages can be taken for these): each rank's watchdog thread answers with its
  iteration, whether it is waiting (in what) and since when. It logs one warning naming the ranks
  that have not reached the exchange: those outside any wait (computing, reading, sleeping in a
  layer) and those whose watchdog does not answer (the process is stopped, or never lets Python's
  threads run), each with how long.
- When the wait has lasted ``abort_after_s``, it asks again, writes one line naming those ranks
  to stderr and ends the job (``MPI_Abort`` through the communicator, which also removes the MPI
  library's shared-memory file). When several ranks wait as long, the lowest of them writes the
  line; the others keep quiet for a few ticks, and speak only if the job has not ended by then.

The waits themselves stay the MPI library's blocking calls, which move an exchange along fastest; the
watchdog only reads the marks, from its own thread. 0 turns either step off. Asking needs MPI calls from the watchdog thread beside the training
thread's, so the watchdog needs MPI_THREAD_MULTIPLE (which netdef asks mpi4py for).

Cost on a run that does not stall: the marks, and one wake-up per tick (at most a second) in which
the thread tests one posted receive. Nothing is sent until a wait has lasted ``warn_after_s``.
"""
from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time

import numpy as np

logger = logging.getLogger("netdef")

DEFAULT_WARN_AFTER_S = 60.0
DEFAULT_ABORT_AFTER_S = 600.0

# What a rank can be waiting in, as the messages name it; an answer carries the index in WAITS.
GRADIENT_EXCHANGE = "the gradient exchange"
REQUESTS = "an exchange"
ALLREDUCE = "an allreduce"
BARRIER = "a barrier"
BROADCAST = "a broadcast"
GATHER = "a gather"
ALLGATHER = "an allgather"
WAITS = (GRADIENT_EXCHANGE, REQUESTS, ALLREDUCE, BARRIER, BROADCAST, GATHER, ALLGATHER)
_BUSY = -1  # an answer's wait code: outside any wait

_QUERY_TAG, _ANSWER_TAG = 1, 2
_QUERY = 1   # int64s in a question: [the asking rank]
_ANSWER = 3  # int64s in an answer: [iteration (-1: before the first), wait code, milliseconds in that state]


@dataclasses.dataclass(frozen=True)
class Answer:
    """Where a rank said it was: ``wait`` is an entry of WAITS, or None when it was outside any
    wait; ``seconds``: how long it had been in that state. ``answered`` is False for a rank whose
    watchdog did not answer in time (the other fields are then meaningless)."""

    rank: int
    answered: bool = True
    iteration: int | None = None
    wait: str | None = None
    seconds: float = 0.0


def _where(iteration: int | None) -> str:
    return "at start-up" if iteration is None else f"of iteration {iteration}"


def _in(iteration: int | None) -> str:
    return "at start-up" if iteration is None else f"in iteration {iteration}"


def _detail(answer: Answer, answer_within_s: float) -> str:
    if not answer.answered:
        return f"no answer within {answer_within_s:.0f} s: stopped, or not running Python"
    if answer.wait is None:
        return f"{_in(answer.iteration)}, outside any exchange for {answer.seconds:.0f} s"
    return f"waiting in {answer.wait} {_where(answer.iteration)} for {answer.seconds:.0f} s"


NAMED = 8  # ranks a message describes; the others are counted


def _listed(answers: list[Answer], answer_within_s: float, separator: str = ", ") -> str:
    text = separator.join(f"rank {a.rank} ({_detail(a, answer_within_s)})" for a in answers[:NAMED])
    return text + (f"{separator}and {len(answers) - NAMED} more" if len(answers) > NAMED else "")


def missing(answers: list[Answer]) -> list[Answer]:
    """The ranks that have not reached the exchange: those outside any wait, and those that did not answer."""
    return [a for a in answers if not a.answered or a.wait is None]


def stall_report(rank: int, what: str, iteration: int | None, waited_s: float, answers: list[Answer],
                 answer_within_s: float) -> str:
    """What ``rank``, waiting ``waited_s`` in ``what``, knows of the others (``answers``: every other rank)."""
    absent = missing(answers)
    head = f"rank {rank} has waited {waited_s:.0f} s in {what} {_where(iteration)}"
    if absent:
        return f"{head} for ranks that have not reached it: {_listed(absent, answer_within_s)}"
    return (f"{head}, and every other rank waits too: {_listed(answers, answer_within_s)}; the ranks may be in "
            f"different collectives")


def abort_line(rank: int, size: int, what: str, iteration: int | None, waited_s: float, answers: list[Answer],
               answer_within_s: float) -> str:
    """The one line that ends a stalled job, naming the ranks that have not come."""
    absent = missing(answers)
    if len(absent) == 1:
        return (f"netdef: error: rank {absent[0].rank} has not reached {what} {_where(iteration)} in {waited_s:.0f} s "
                f"({_detail(absent[0], answer_within_s)}); aborting all {size} ranks")
    if absent:
        names = ", ".join(str(a.rank) for a in absent[:NAMED]) + (" and more" if len(absent) > NAMED else "")
        return (f"netdef: error: ranks {names} have not reached {what} {_where(iteration)} in {waited_s:.0f} s "
                f"({_listed(absent, answer_within_s, '; ')}); aborting all {size} ranks")
    return (f"netdef: error: rank {rank} has waited {waited_s:.0f} s in {what} {_where(iteration)} and every other rank "
            f"waits too ({_listed(answers, answer_within_s, '; ')}); aborting all {size} ranks")


def speaks_first(rank: int, waited_s: float, answers: list[Answer], tick_s: float) -> bool:
    """Whether ``rank`` writes the ending line now: no lower rank has waited about as long (within a
    tick), which would reach its own deadline at the same moment and write it."""
    return not any(a.answered and a.wait is not None and a.rank < rank and a.seconds >= waited_s - tick_s
                   for a in answers)


def tick_for(warn_after_s: float, abort_after_s: float) -> float:
    """How often the watchdog thread looks: an eighth of the shorter time that is on, between 0.05 and 1 s."""
    times = [t for t in (warn_after_s, abort_after_s) if t > 0]
    return min(1.0, max(0.05, min(times) / 8)) if times else 1.0


class _NoWait:
    """The context of a wait that nobody watches."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_WAIT = _NoWait()


class NoWatchdog:
    """Nothing is watched: one process, or both times off."""

    warn_after_s = 0.0
    abort_after_s = 0.0

    def waiting(self, what: str):
        """The context of one blocking call that needs the other ranks (``what``: an entry of WAITS)."""
        return _NO_WAIT

    def at_iteration(self, iteration: int) -> None:
        """This rank has begun ``iteration``."""

    def close(self) -> None:
        pass


NO_WATCHDOG = NoWatchdog()


class _Wait:
    """The context of a watched wait (made once per entry of WAITS)."""

    __slots__ = ("_watchdog", "_code")

    def __init__(self, watchdog: "Watchdog", code: int):
        self._watchdog = watchdog
        self._code = code

    def __enter__(self):
        self._watchdog._enter(self._code)
        return self

    def __exit__(self, *exc):
        self._watchdog._leave()
        return False


class Watchdog(NoWatchdog):
    """Watches this rank's waits and answers the other ranks' questions (see the module docstring).

    ``side``: a Communicator of the same ranks that nothing else uses (its ``isend``/``irecv``/
    ``test_some``/``cancel``); ``ender``: the communicator whose ``abort`` ends the job.
    """

    def __init__(self, side, ender, warn_after_s: float = DEFAULT_WARN_AFTER_S,
                 abort_after_s: float = DEFAULT_ABORT_AFTER_S, clock=time.monotonic, stream=None):
        self.rank, self.size = side.rank, side.size
        self._side = side
        self._ender = ender
        self._clock = clock
        self._stream = stream
        self._lock = threading.Lock()
        self._depth = 0
        self._code = _BUSY
        self._since = clock()
        self._iteration: int | None = None
        self._waits = {what: _Wait(self, code) for code, what in enumerate(WAITS)}
        self.set_times(warn_after_s, abort_after_s)
        # Used by the watchdog thread only.
        self._query = np.zeros(_QUERY, dtype=np.int64)
        self._query_request = [None]
        self._answers = np.zeros((self.size, _ANSWER), dtype=np.int64)
        self._asking: dict[int, list] = {}   # rank -> [its answer's receive request], while unanswered
        self._sends: list[tuple] = []        # (request, buffer) until sent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="netdef-watchdog", daemon=True)
        self._thread.start()

    def set_times(self, warn_after_s: float, abort_after_s: float) -> None:
        """Warn after ``warn_after_s`` of one wait, end the job after ``abort_after_s`` (0: never)."""
        self.warn_after_s = float(warn_after_s)
        self.abort_after_s = float(abort_after_s)
        self.tick_s = tick_for(self.warn_after_s, self.abort_after_s)
        # A rank's watchdog answers at its next tick; allow for a loaded machine.
        self.answer_within_s = 1.0 + 2 * self.tick_s

    # ------------------------------------------------------------------------------ marks (any thread)
    def waiting(self, what: str):
        return self._waits[what]

    def at_iteration(self, iteration: int) -> None:
        self._iteration = int(iteration)

    def _enter(self, code: int) -> None:
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self._code = code
                self._since = self._clock()

    def _leave(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self._code = _BUSY
                self._since = self._clock()

    def _state(self) -> tuple[int, float, int | None]:
        """(wait code, since, iteration): what this rank is doing now."""
        with self._lock:
            return self._code, self._since, self._iteration

    # ------------------------------------------------------------------------------ the thread
    def close(self) -> None:
        """Stop the thread and withdraw its receives (local; before MPI is finalized)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=self.answer_within_s + 2 * self.tick_s + 1)
        if self._thread.is_alive():
            return  # stuck inside MPI: leave its requests alone
        self._side.cancel(self._query_request)
        for request in self._asking.values():
            self._side.cancel(request)
        self._asking.clear()

    def _run(self) -> None:
        try:
            self._query_request[0] = self._side.irecv(self._query, None, _QUERY_TAG)
            watched_since = None  # the start of the wait being watched
            next_warning = deferred = 0.0
            while not self._stop.wait(self.tick_s):
                self._answer_queries()
                code, since, iteration = self._state()
                if code == _BUSY:
                    watched_since = None
                    continue
                if since != watched_since:
                    watched_since, next_warning, deferred = since, self.warn_after_s, 0.0
                waited = self._clock() - since
                if self.abort_after_s > 0 and waited >= self.abort_after_s + deferred:
                    answers = self._survey()
                    if self._stop.is_set():
                        return
                    if deferred or speaks_first(self.rank, waited, answers, self.tick_s):
                        self._end(WAITS[code], iteration, self._clock() - since, answers)
                        return
                    deferred = 4 * self.tick_s + self.answer_within_s
                elif self.warn_after_s > 0 and waited >= next_warning and not self._ends_within_survey(waited):
                    answers = self._survey()
                    waited = self._clock() - since
                    logger.warning("Stalled: %s; %s", stall_report(
                        self.rank, WAITS[code], iteration, waited, answers, self.answer_within_s),
                        f"the job ends after {self.abort_after_s:g} s of waiting (stall_abort_seconds)"
                        if self.abort_after_s > 0 else "the job is not ended (stall_abort_seconds is 0)")
                    next_warning = waited + self.warn_after_s
        except Exception as exc:  # noqa: BLE001 - the watchdog must never end training itself
            logger.warning("The stall watchdog of rank %d stopped: %s: %s", self.rank, type(exc).__name__, exc)

    def _ends_within_survey(self, waited: float) -> bool:
        """Whether the job would be ended before a warning's survey is over (the ending line says it all)."""
        return self.abort_after_s > 0 and waited + self.answer_within_s >= self.abort_after_s

    def _answer_queries(self) -> None:
        """Answer every question that has come, then keep one receive posted for the next."""
        while self._side.test_some(self._query_request):
            asker = int(self._query[0])
            code, since, iteration = self._state()
            answer = np.array([-1 if iteration is None else iteration, code, int((self._clock() - since) * 1000)],
                              dtype=np.int64)
            self._sends.append((self._side.isend(answer, asker, _ANSWER_TAG), answer))
            self._query_request[0] = self._side.irecv(self._query, None, _QUERY_TAG)
        if self._sends:
            requests = [request for request, _ in self._sends]
            done = set(self._side.test_some(requests))
            self._sends = [pair for k, pair in enumerate(self._sends) if k not in done]

    def _survey(self) -> list[Answer]:
        """Ask every other rank where it is and wait up to ``answer_within_s`` for the answers. A rank
        that has not answered an earlier question is not asked again: its answer is still awaited."""
        query = np.array([self.rank], dtype=np.int64)
        self._collect()  # late answers to earlier questions: ask again, for a fresh one
        for rank in range(self.size):
            if rank != self.rank and rank not in self._asking:
                self._asking[rank] = [self._side.irecv(self._answers[rank], rank, _ANSWER_TAG)]
                self._sends.append((self._side.isend(query, rank, _QUERY_TAG), query))
        deadline = self._clock() + self.answer_within_s
        answered = self._collect()
        while self._asking and self._clock() < deadline and not self._stop.is_set():
            self._answer_queries()  # the others survey too, and wait for this rank's answer
            time.sleep(0.01)
            answered |= self._collect()
        return [self._read(rank) if rank in answered else Answer(rank, answered=False)
                for rank in range(self.size) if rank != self.rank]

    def _collect(self) -> set[int]:
        """The ranks whose answers have arrived since the last call."""
        arrived = {rank for rank, request in self._asking.items() if self._side.test_some(request)}
        for rank in arrived:
            del self._asking[rank]
        return arrived

    def _read(self, rank: int) -> Answer:
        iteration, code, milliseconds = (int(v) for v in self._answers[rank])
        return Answer(rank, True, None if iteration < 0 else iteration, None if code == _BUSY else WAITS[code],
                      milliseconds / 1000)

    def _end(self, what: str, iteration: int | None, waited: float, answers: list[Answer]) -> None:
        stream = self._stream or sys.stderr
        stream.write(abort_line(self.rank, self.size, what, iteration, waited, answers, self.answer_within_s) + "\n")
        stream.flush()
        self._ender.abort(1)
