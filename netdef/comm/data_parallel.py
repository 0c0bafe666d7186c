"""Data parallelism over MPI: the solver's ``Parallel`` seam for N ranks.

Every rank runs the same program (``mpiexec -n 4 netdef train solver.prototxt``). At the solver's
fixed points (``netdef/solver/parallel.py``, which also lists the calls of an iteration in order)
this class:

- ``prepare`` and ``attach`` first make sure the ranks train the same thing (``agreement.py``):
  solver settings, nets and parameter shapes, exchange options and netdef version, compared in one
  small collective; where they differ every rank raises ``RanksDisagreeError`` naming the field and
  both values. After a restore the ranks check that they resume from the same iteration.
- ``prepare``: every rank builds its nets with the same random seed (the file's ``random_seed``, or
  one drawn by rank 0), so that data layers shuffle alike and shard consistently; ``attach`` then
  re-seeds training randomness (dropout...) with ``seed + rank`` (Caffe's multi-GPU convention).
- ``attach``: ``set_shard(rank, size)`` on every data source of the train and test nets (record i
  is read by rank i % size); ``batch_size`` stays per rank, the effective batch is
  ``size * batch_size * iter_size`` (logged). It builds the exchange rule (``exchange.py``).
- ``begin_step``: rank 0's parameters are broadcast before the first iteration (fresh,
  ``--weights`` or restored).
- Tests run on every rank over its shard; the summed outputs and loss are averaged over the ranks,
  which equals one process testing all those records with an N times larger batch for outputs that
  are means over the batch (accuracy, normalized losses). Under the asynchronous rules (easgd,
  gossip, hybrid) each rank trains weights of its own: tests and the snapshot's model file use the
  rule's model (the centre variable, rank 0's weights), swapped in on every rank for the test and
  out after it (the log says which, once).
- Signals: stop/snapshot requests are agreed (a logical or over the ranks) at each iteration
  boundary, so every rank stops or snapshots at the same iteration.
- Snapshots: written by rank 0, with every rank's own random state and data positions gathered
  into the state file (``NetdefSolverState.rank_state``), so a snapshot is one model file and one
  state file, each replaced atomically. Resuming with the same number of ranks restores every rank
  exactly; with another number the weights, history and iteration are restored and each rank's
  data sources start their new shard from the beginning (a warning says so). Under the
  asynchronous rules the ranks first settle (nothing in flight), and every rank's own weights and
  update history and the rule's state (gossip's mixing weight and peer-choice generator) go into
  its rank state; the model file holds the model, from which the centre is rebuilt at resume.
- Measurements: ``measurements`` (``timeline.Measurements``), taken by an ``IterationClock`` that
  observes the net's layer hooks and the solver's updates, and with ``timeline`` a Chrome trace of
  every rank written by ``end_training``.

Data sources that do not shard (Input, MemoryData, DummyData, Python layers that are not
``DataSource``s with a ``set_shard``) give every rank the same batches. BatchNorm's running
statistics are not exchanged (as in Caffe's multi-GPU training): each rank keeps its own and rank
0's are saved.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time

import numpy as np

from .. import __version__, backend
from ..proto import netdef_pb2 as pb
from ..solver.parallel import Parallel
from ..solver.snapshot import SnapshotError, set_blobs
from .agreement import agree, startup_facts
from .communicator import Communicator, create_communicator
from .watchdog import REQUESTS
from .exchange import ExchangeOptions, exchange_class
from .nccl import nccl_choice, over_nccl
from .timeline import IterationClock, Measurements, Timeline, instrument_net, write_chrome_trace

logger = logging.getLogger("netdef")


def _batch_size(net) -> int | None:
    """The per-rank batch: the first top of the first data source, else of the first layer without
    bottoms."""
    sources = net.data_sources()
    first = sources[0] if sources else next((layer for layer in net.layers if not layer.layer_param.bottom
                                             and layer.layer_param.top), None)
    if first is None:
        return None
    shape = net.blobs[first.layer_param.top[0]].shape
    return int(shape[0]) if shape else None


class DataParallel(Parallel):
    """Synchronous data parallelism over ``comm`` with the exchange rule named in ``options``.
    With one rank it trains exactly as a single process does."""

    def __init__(self, comm: Communicator | None = None, options: ExchangeOptions | None = None):
        self.options = options or ExchangeOptions()
        self.comm = comm if comm is not None else create_communicator(
            async_progress=self.options.progress == "MPI_ASYNC")
        self.rank, self.size = self.comm.rank, self.comm.size
        self.writes_snapshots = self.rank == 0
        self.measurements = Measurements()
        self.exchange = None
        self.timeline: Timeline | None = None
        self._clock: IterationClock | None = None
        self._net = None
        self._seed: int | None = None
        self._param_as_given: pb.SolverParameter | None = None
        self._layer_hooks = None  # the exchange rule's, on the net
        self._synchronized = False
        self._reported_up_to = 0  # the first iteration scalars() has not reported yet
        self._model_depth = 0     # nested model() contexts (a snapshot requested during a test)
        self._requests_comm: Communicator | None = None  # agree_requests' own (attach makes it)
        self._requests_in_flight = None  # (flags, request): the requests of the last agree_requests

    # ------------------------------------------------------------------------------ set-up
    def prepare(self, param) -> None:
        self._param_as_given = pb.SolverParameter()
        self._param_as_given.CopyFrom(param)
        if self.size > 1:
            # Every rank takes part in the broadcast, whatever its own file says: ranks whose random_seed
            # differ must reach the agreement check in attach, not wait here for each other.
            drawn = int(np.random.SeedSequence().entropy % (2**31)) if self.rank == 0 else 0
            drawn = self.comm.broadcast_int(drawn)
            self._seed = int(param.random_seed) if param.random_seed >= 0 else drawn
            param.random_seed = self._seed

    def attach(self, net, test_nets, updates) -> None:
        self._net = net
        if self.size > 1:
            nets = [("train net", net)] + [(f"test net {i}", test_net) for i, test_net in enumerate(test_nets)]
            agree(self.comm, startup_facts(self._param_as_given, nets, self.options, __version__))
        if self._seed is not None:
            backend.set_random_seed(self._seed + self.rank)
        sharded = set()
        seen = set()
        for one in [net] + list(test_nets):
            for layer in one.data_sources():
                if id(layer) not in seen:
                    seen.add(id(layer))
                    if layer.set_shard(self.rank, self.size):
                        sharded.add(id(layer))
        rule, options = exchange_class(self.options.exchange), self.options
        via_nccl, route = nccl_choice(self.comm, net.learnable_params, self.options)
        if route != "MPI":  # a GPU run: say how its gradients travel
            logger.info("Gradients on the GPU are summed through %s", route)
        if via_nccl:
            rule, options = over_nccl(rule, options)
        self.exchange = rule(self.comm, net, options, self.measurements, seed=self._seed or 0)
        if self.size > 1:
            self._requests_comm = self.comm.duplicate()
        self.exchange.leave_division_to_update()  # the updates divide (GradientExchange.take_divisor)
        # The exchange's hooks, the updates' and the clock's may run at the edges of stretches replayed
        # from CUDA graphs (net_hooks.py), which end where the exchange needs them to.
        hooks = self.exchange.layer_hooks()
        if hooks:
            self._layer_hooks = net.register_layer_hooks(**hooks, at_run_edges=True)
        net.hooks.split_runs_at(self.exchange.run_boundaries())
        if self.options.timeline:
            self.comm.barrier()
            self.timeline = Timeline(self.rank, time.perf_counter())
            self.timeline.on_device(net.learnable_params[0].array_module if net.learnable_params else np)
            instrument_net(net, self.timeline)
            self.exchange.trace_to(self.timeline)
        self._clock = IterationClock(net, self.measurements, self.timeline)
        updates.connect(self.exchange)
        updates.observe(self._clock)
        if self.size > 1:
            self._log_setup(net, any(id(layer) in sharded for layer in net.data_sources()))

    def _log_setup(self, net, train_net_sharded: bool) -> None:
        batch = _batch_size(net)
        iter_size = self._param_as_given.iter_size
        if batch is None:
            batch_text = "batch size per rank unknown"
        else:
            batch_text = (f"batch_size {batch} per rank x {self.size} ranks x iter_size {iter_size} = effective "
                          f"batch {batch * self.size * iter_size}")
        logger.info("Distributed training on %d ranks (%s): %s", self.size, self.comm.description, batch_text)
        logger.info("Gradient exchange: %s", self.exchange.describe())
        if self.exchange.trains_own_weights:
            logger.info("Each rank trains its own weights; tests and the snapshots' model files use %s",
                        self.exchange.model_description)
        if self._param_as_given.clip_gradients >= 0:
            logger.info("clip_gradients uses the norm of all gradients: every update waits for the whole "
                        "exchange")
        if self.rank == 0 and not train_net_sharded:
            logger.warning("The train net has no data source that shards (Data, ImageData, HDF5Data): each rank "
                           "trains on what its own layers produce, which is the same data on every rank unless "
                           "they shard it themselves")

    # ------------------------------------------------------------------------------ the iteration
    def begin_step(self, iteration: int, current_step: int) -> None:
        if not self._synchronized:
            if self.size > 1:
                # Ranks resuming from different state files would stop at different iterations.
                agree(self.comm, {"resumed solver state": {"iteration": str(iteration),
                                                           "current_step": str(current_step)}})
            self.exchange.broadcast_initial()
            self._synchronized = True

    def begin_iteration(self, iteration: int) -> None:
        self._clock.begin(iteration)
        self.comm.watchdog.at_iteration(iteration)  # for the stall watchdog's messages
        self.exchange.begin_iteration(iteration)

    def agree_requests(self, snapshot: bool, stop: bool) -> tuple[bool, bool]:
        """The requests every rank acts on now: those made before the previous call, on any rank. The
        ones made before this call are combined (a non-blocking MAX) while the next iteration runs,
        and acted on at the next call, on every rank alike: one iteration later than one process
        would, without a second point per iteration, beside the exchange, where every rank waits for
        the slowest. The reductions go over a communicator of their own: the exchange may still start
        the last iteration's collectives on ``self.comm`` during the next forward, at a moment that
        differs between the ranks, and collectives on one communicator must start in one order."""
        if self.size == 1:
            return snapshot, stop
        agreed = self._finish_agreement()
        flags = np.array([snapshot, stop], dtype=np.int32)
        self._requests_in_flight = (flags, self._requests_comm.iallreduce(flags, op="max"))
        return agreed

    def _finish_agreement(self) -> tuple[bool, bool]:
        if self._requests_in_flight is None:
            return False, False
        flags, request = self._requests_in_flight
        self._requests_in_flight = None
        with self.comm.watchdog.waiting(REQUESTS):
            self._requests_comm.wait_all([request])
        return bool(flags[0]), bool(flags[1])

    def scalars(self) -> dict:
        """Over the iterations finished since the last call: ``exchange/wait_s``, the mean time per
        iteration the training thread blocked on exchanges still in flight, and
        ``exchange/hidden_fraction``, the share of the exchanges' time (first bucket started to last
        completion seen) that it did not wait for: 1 - total wait / total exchange time (none when
        nothing was exchanged). A wait is counted in the iteration during which it happened, which
        with the priority schedule is often the next one's forward."""
        if self.size == 1:
            return {}
        records = []
        for record in reversed(self.measurements.records):  # newest first: only the unreported tail is read
            if record.iteration < self._reported_up_to:
                break
            if not math.isnan(record.end_at):
                records.append(record)
        if not records:
            return {}
        records.reverse()
        self._reported_up_to = records[-1].iteration + 1
        wait = sum(r.wait_s for r in records)
        out = {"exchange/wait_s": wait / len(records)}
        exchange = sum(r.exchange_s for r in records)
        if exchange > 0:
            out["exchange/hidden_fraction"] = min(1.0, max(0.0, 1.0 - wait / exchange))
        return out

    # ------------------------------------------------------------------------------ testing
    def reduce_test_outputs(self, scores, loss):
        if self.size == 1:
            return scores, loss
        values = np.zeros(0 if scores is None else scores.size, dtype=np.float64)
        if scores is not None:
            values[:] = scores
        values = np.append(values, np.float64(loss))
        self.comm.allreduce(values)
        values /= self.size
        scores = None if scores is None else values[:-1].astype(np.float32)
        return scores, np.float32(values[-1])

    @contextlib.contextmanager
    def model(self):
        self._model_depth += 1
        try:
            # Before the first step there is no model yet (no centre, rank 0's weights not broadcast):
            # a test then sees each rank's own weights, as under allreduce.
            if self._model_depth == 1 and self._synchronized:
                self.exchange.swap_in_model()
            yield
        finally:
            self._model_depth -= 1
            if self._model_depth == 0:
                self.exchange.swap_out_model()

    # ------------------------------------------------------------------------------ snapshots
    def snapshot(self, own, history, write) -> None:
        self.exchange.settle()
        with self.model():
            self._add_rank_state(own, history)
            serialized = own.SerializeToString()
            rank_states = [serialized] if self.size == 1 else self.comm.gather_bytes(serialized, root=0)
            if self.writes_snapshots:
                write(rank_states)
        if self.size > 1:
            self.comm.barrier()

    def _add_rank_state(self, state, history) -> None:
        """This rank's own weights and update history (under the rules that train their own) and
        the rule's state, in its NetdefRankState."""
        if self.exchange.trains_own_weights:
            for values in self.exchange.own_weights():
                proto = state.param.add()
                proto.shape.dim.extend(values.shape)
                proto.data.extend(np.asarray(values, dtype=np.float32).ravel())
            for blob in history:
                proto = state.history.add()
                proto.shape.dim.extend(blob.shape)
                proto.data.extend(backend.to_host(blob.data).astype(np.float32).ravel())
        self.exchange.save_state(state)

    def restore_rank_state(self, state, where: str, history) -> None:
        try:
            self.exchange.restore_state(state)
        except ValueError as exc:
            raise SnapshotError(f"{where}: rank {self.rank}: {exc}") from None
        if state is None or not self.exchange.trains_own_weights or not len(state.param):
            return
        set_blobs(self._net.learnable_params, state.param, f"{where}: rank {self.rank}'s own weights", "net's")
        set_blobs(history, state.history, f"{where}: rank {self.rank}'s update history", "solver's")

    def restored(self) -> None:
        self._synchronized = False

    # ------------------------------------------------------------------------------ the end
    def end_training(self) -> None:
        """Settle the exchange, free what the ranks share, and write the Chrome trace (every rank
        must call it: it gathers the ranks' events). A request still being agreed on comes too late: the run has ended."""
        self.exchange.settle()
        self.exchange.release()
        self._finish_agreement()
        if self.timeline is None:
            return
        for record in self.measurements.records:
            self.timeline.record_iteration(record)
        gathered = self.comm.gather_bytes(self.timeline.to_json(), root=0)
        if self.rank == 0:
            write_chrome_trace(self.options.timeline, gathered)
            logger.info("Wrote the timeline of %d rank(s) to %s", len(gathered), self.options.timeline)

    def close(self) -> None:
        # Local only: close() also runs when this rank fails, when the others are not listening.
        if self._requests_in_flight is not None:
            # Every rank started it when they stopped together on a request; after a failure the
            # others may never start it, so it is only tested here, never waited for.
            self._requests_comm.test_some([self._requests_in_flight[1]])
            self._requests_in_flight = None
        if self.exchange is not None:
            if self._layer_hooks is not None:
                self._net.remove_layer_hooks(self._layer_hooks)
                self._layer_hooks = None
            self.exchange.close()
