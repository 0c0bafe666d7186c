"""A net's passes on a GPU recorded once as CUDA graphs and replayed: the host's Python out of the way.

On a GPU every layer's forward and backward is a few kernel launches, and on deep nets the host takes
longer to launch them through Python than the device takes to run them (benchmarks/README.md, "The
first GPU figures"). A CUDA graph is a recording of the launches of a stretch of layers; replaying it
is one launch, whatever the stretch holds.

``PassGraphs`` splits each pass into runs of consecutive steps (a layer, or a chain run as one step)
that may be replayed and runs that may not, and runs each replayable run so:

1. the first ``WARM_UP_PASSES`` times of each key (below) eagerly, as without graphs (convolution
   plans are timed, kernels compiled, the arrays layers keep are made); a solver's first iteration,
   which makes the gradients, is a key of its own, so its runs are recorded at the fourth;
2. then once under stream capture (the launches are recorded, not run) with a memory pool of its own,
   so that what the recording allocates is never handed to anyone else while the graph lives; the
   graph is then launched, and that is the pass;
3. from then on by launching the graph. The arrays each blob held when the recording began (which the
   graph reads) and when it ended (which the graph wrote) are kept: before a launch, an input that
   the eager code around the graph has put in another array is copied into the recorded one; after
   it, the blobs hold the arrays the recording left them with.

A backward stretch replays (and is recorded) only where the forward of each of its layers that runs
backward came from a recording, whose serial is part of its key: layers keep arrays from forward for
backward (a max pooling's mask, LRN's scale), which an eager forward makes anew, and which a backward
graph reads where they were when it was recorded. What the eager passes held and a recording let go
is given back to the device at the start of the next backward pass, not at the recording (see
``_release_cached_memory``).

A run keeps a recording per key: its blobs' shapes, its parameters' arrays and the pending clears of
its gradients (weights loaded into new arrays, the passes of ``iter_size`` after the first, which add
to the gradients the first wrote, each get their own), and backward the forward recordings its layers
ran from. A backward stretch whose recording fails makes the forward of its layers eager too: with
several forward recordings (``iter_size``) the arrays a layer last kept are the last recording's, not
those of the one replayed. New shapes (a reshaped input) forget every
recording of the net, since the eager passes that follow may replace arrays the layers keep and the
recordings read. A recording that fails (a layer that reads the device from the
host, a library call that cannot be captured) leaves that run eager for good, and the log says why,
once.

A step may be replayed when every layer of it says so (``Layer.replayable``: the layers whose GPU
passes launch the same work every pass and read nothing back) and none of its tops is weighted into
the loss (its sum is taken outside the graphs). Graphs apply to a net on a GPU whose hooks may be called at
the edges of a stretch (``net_hooks.py``): a replayed stretch's layers get their "before" hooks before
the launch and their "after" and gradient hooks after it, and the stretches end at the boundaries the
hooks' owners ask for (the distributed exchange: where its buckets close, so that each leaves while
the layers below it run). A hook that must see each layer (``netdef time``, a timeline) keeps the net
eager.
"""
from __future__ import annotations

import logging

import numpy as np

from . import backend
from .cudnn import plans as cudnn_plans
from .net_loss import QueuedLoss

log = logging.getLogger("netdef")

#: Eager passes of a run before it is recorded: the first plans and allocates, the second runs as
#: every later pass will.
WARM_UP_PASSES = 2
#: Recordings kept per run, one per key: passes of iter_size (the first overwrites the gradients, the
#: others add to them) need two; a net whose input shape keeps changing runs eagerly beyond this.
MAX_RECORDINGS = 4


class _Recording:
    """One graph of a run, for one key (see ``_Run.key``), and the arrays it was recorded with.
    ``serial``: which recording this is, process-wide (a backward recording names the forward ones
    whose kept arrays it reads)."""

    _made = 0

    def __init__(self, graph, pool, recorded: list, left: list):
        _Recording._made += 1
        self.serial = _Recording._made
        self.graph = graph
        self.pool = pool          # the recording's own memory pool, alive with the graph
        self.recorded = recorded  # per blob: the arrays when the recording began (the graph reads them)
        self.left = left          # per blob: the arrays when it ended (the graph wrote them)

    def replay(self, blobs, cupy) -> None:
        for blob, recorded in zip(blobs, self.recorded):
            now = blob.bound_arrays()
            for held, wanted in zip(now[:2], recorded[:2]):
                if held is not wanted and held is not None and wanted is not None and backend.address(held) != backend.address(wanted):
                    wanted[...] = held  # an input the eager code around the graph put elsewhere
        self.graph.launch(cupy.cuda.get_current_stream())
        for blob, left in zip(blobs, self.left):
            blob.rebind(left)


class _Run:
    """One run of replayable steps: its layers, the blobs they touch, and its recordings by key."""

    def __init__(self, layers, blobs, direction: str, made: list):
        self.layers = layers
        self.blobs = blobs
        self.direction = direction
        self.made = made  # the blobs whose values (forward) or gradients (backward) the run makes
        self.parameters = [blob for layer in layers for blob in layer.blobs]
        self.recordings: dict[tuple, _Recording] = {}
        self.eager_passes: dict[tuple, int] = {}
        self.refused: str | None = None

    def key(self, net_settings: tuple, paired: tuple = ()) -> tuple:
        """What a recording depends on: (the shapes of every blob, the precision and ``net_settings``,
        the net's own: its scratch buffers and cuDNN's workspace, which a recording reads where they
        were, and whether it keeps its blobs' gradients; every blob's pending clear and the
        parameters' arrays, by identity: a recording keeps them alive, so no other array can take
        their id; and, backward, ``paired``: the serials of the forward recordings whose kept arrays
        its layers read)."""
        pending = tuple(blob.bound_arrays()[2] for blob in self.blobs)
        parameters = tuple(id(blob.bound_arrays()[0]) for blob in self.parameters)
        shapes = tuple(blob.shape for blob in self.blobs)
        return (shapes, backend.precision(), net_settings), (pending, parameters, paired)

    def _give_made_values_new_memory(self) -> None:
        """Forward, each blob the run makes gets an array of the recording's own, uninitialized: its
        layer writes every value (a convolution into its top's array), and a blob without an array
        would be given zeros first, a pass over the values that every replay would repeat."""
        if self.direction == "forward":
            for blob in self.made:
                _, diff, pending = blob.bound_arrays()
                blob.rebind((blob.array_module.empty(blob.shape, dtype=blob.dtype), diff, pending))

    def record(self, run_eagerly, cupy) -> _Recording:
        """Record ``run_eagerly()`` and launch the graph; raises where recording fails, every blob
        then holding what it held before, nothing having run.

        The arrays of what the run makes are let go first: the recording allocates its own, and
        keeping the eager passes' ones alive beside them (a recording keeps what it starts from)
        would hold a second copy of every activation the run writes."""
        before = [blob.bound_arrays() for blob in self.blobs]
        for blob in self.made:
            data, diff, pending = blob.bound_arrays()
            if self.direction == "forward":
                blob.rebind((None, diff, pending))
            elif not blob.diff_is_shared:  # a shared diff must stay the array the other blob holds
                blob.rebind((data, None, False))
        recorded = [blob.bound_arrays() for blob in self.blobs]
        pool = cupy.cuda.MemoryPool()
        stream = cupy.cuda.Stream(non_blocking=True)  # the legacy stream cannot be captured
        try:
            with cupy.cuda.using_allocator(pool.malloc), stream:
                stream.begin_capture()
                try:
                    self._give_made_values_new_memory()
                    run_eagerly()
                finally:
                    graph = stream.end_capture()
        except Exception:
            for blob, arrays in zip(self.blobs, before):
                blob.rebind(arrays)
            raise
        recording = _Recording(graph, pool, recorded, [blob.bound_arrays() for blob in self.blobs])
        graph.launch(cupy.cuda.get_current_stream())
        return recording


class PassGraphs:
    """The CUDA graphs of ``net``'s passes (see the module docstring). ``net`` provides its steps and
    runs a range of them eagerly; this class decides which ranges are replayed. ``cupy``: the module
    recordings go through, CuPy (imported at the first recording) unless a test gives a stand-in."""

    def __init__(self, net, cupy=None):
        self.net = net
        self._cupy = cupy  # the CuPy module, imported at the first recording (tests give a stand-in)
        self._runs: dict[tuple, _Run] = {}
        self._planned: dict[tuple, list] = {}  # forward_runs' and backward_runs' answers
        self._planned_with: frozenset = frozenset()  # the hooks' run boundaries those answers respect
        self._said_why_not = False
        # Per layer: the serial of the recording its last forward ran from (None: it ran eagerly).
        self._made_by: list[int | None] = [None] * len(net.layers)
        self._release_pending = False  # a recording let go of arrays the default pool still caches
        self._dropped: list[_Recording] = []  # recordings gone, whose pools go at the next release
        blobs, loss_weights = net._blobs, net._blob_loss_weights  # pycaffe's numbering of the blobs
        layers = range(len(net.layers))
        # Per layer: whether a top is weighted into the loss (summed outside the graphs: never replayed), and
        # every blob it reads or writes.
        self._weighted = [any(loss_weights[i] for i in net._top_ids(li)) for li in layers]
        self._bottoms = [[blobs[i] for i in net._bottom_ids(li)] for li in layers]
        self._tops = [[blobs[i] for i in net._top_ids(li)] for li in layers]
        self._blobs = [self._bottoms[li] + self._tops[li] + list(net.layers[li].blobs) for li in layers]
        # Where the net was built; a stand-in for CuPy (a test of the bookkeeping) records on any device.
        self._on_cpu = cupy is None and (not blobs or blobs[0].array_module is np)

    def apply(self) -> bool:
        """Whether the net's passes run through graphs now (a GPU, no hooks); the log says once why
        not where the net asked for them."""
        why_not = None
        if self._on_cpu:
            why_not = "they need a GPU (the net runs on the CPU)"
        elif self.net.hooks.need_every_layer():
            why_not = ("hooks run host code between every two layers (netdef time, a timeline), which a replay "
                       "would skip")
        if why_not is not None and not self._said_why_not:
            log.info("Net %s: CUDA graphs not used: %s", self.net.name, why_not)
            self._said_why_not = True
        return why_not is None

    def forward_runs(self, start: int, end: int) -> list[tuple[int, int, bool]]:
        """(first layer, last layer, replayable) of each run of ``forward_range(start, end)``."""
        # The steps follow from the net's structure and fuse_layers alone; a run starts at each boundary.
        boundaries = self._boundaries()
        key = ("forward", start, end, self.net.fuse_layers)
        if key not in self._planned:
            self._planned[key] = _runs(self.net.forward_steps(start, end), self._forward_step_replayable,
                                       lambda first: first in boundaries)
        return self._planned[key]

    def backward_runs(self, start: int, end: int) -> list[tuple[int, int, bool]]:
        """(highest layer, lowest layer, replayable) of each run of ``backward_range(start, end)``."""
        # The steps depend on which chains ran forward as one step: planned once per set of steps. A
        # run ends at each boundary b (the step whose highest layer is b - 1 starts another).
        boundaries = self._boundaries()
        key = ("backward", tuple(self.net.backward_steps(start, end)))
        if key not in self._planned:
            self._planned[key] = _runs(key[1], self._backward_step_replayable, lambda high: high + 1 in boundaries)
        return self._planned[key]

    def _boundaries(self) -> frozenset:
        """The hooks' run boundaries (``NetHooks.split_runs_at``); where they changed, every run planned
        and recorded with the old ones is forgotten."""
        boundaries = self.net.hooks.run_boundaries
        if boundaries != self._planned_with:
            self._planned.clear()
            self._runs.clear()
            self._planned_with = boundaries
        return boundaries

    def _forward_step_replayable(self, first: int, last: int) -> bool:
        layers = self.net.layers
        return all(layers[li].replayable() and not self._weighted[li] for li in range(first, last + 1))

    def _backward_step_replayable(self, high: int, low: int) -> bool:
        layers, runs_backward = self.net.layers, self.net.layer_need_backward
        return all(layers[li].replayable() or not runs_backward[li] for li in range(low, high + 1))

    def forward(self, start: int, end: int) -> QueuedLoss:
        loss = QueuedLoss()
        recorded = self._recorded_count()
        hooks = self.net.hooks
        for first, last, replayable in self.forward_runs(start, end):
            recording = None
            if replayable:
                # The run's hooks at its edges, never inside a recording (they are host work).
                hooks.call(hooks.before_forward, first, last)
                recording = self._run(("forward", first, last), range(first, last + 1),
                                      lambda first=first, last=last: self.net.forward_eagerly(first, last,
                                                                                              call_hooks=False))
                hooks.call(hooks.after_forward, first, last)
            else:
                loss.extend(self.net.forward_eagerly(first, last))
            self._made_by[first:last + 1] = [recording.serial if recording is not None else None] * (last - first + 1)
        self._say_what_was_recorded("forward", recorded)
        if self._release_pending and not any(self.net.layer_need_backward):
            self._release_cached_memory()  # a net without backward runs once the exchange has finished
        return loss

    def backward(self, start: int, end: int) -> None:
        if self._release_pending:
            self._release_cached_memory()
        recorded = self._recorded_count()
        hooks = self.net.hooks
        for high, low, replayable in self.backward_runs(start, end):
            if replayable:
                paired = self._forward_recordings(high, low)
                hooks.before_backward_of(high, low)
                self._run(("backward", high, low), range(low, high + 1),
                          lambda high=high, low=low: self.net.backward_eagerly(high, low, call_hooks=False), paired)
                for li in range(high, low - 1, -1):
                    hooks.after_backward_of(li, self.net.gradients_final_at(li))
            else:
                self.net.backward_eagerly(high, low)
        self._say_what_was_recorded("backward", recorded)

    def _forward_recordings(self, high: int, low: int) -> tuple | None:
        """The serials of the forward recordings that the layers ``low..high`` that run backward last
        ran from; None where one of them ran eagerly. A layer keeps arrays from its forward for its
        backward (a max pooling's mask, LRN's scale): a backward graph reads them where they were when
        it was recorded, which only a replay of the same forward recording writes again; an eager
        forward puts them in fresh arrays, and its backward must run eagerly too."""
        needs = self.net.layer_need_backward
        paired = tuple(self._made_by[li] for li in range(low, high + 1) if needs[li])
        return None if None in paired else paired

    def _release_cached_memory(self) -> None:
        """Give back to the device what the eager passes held and the recordings let go, rather than
        leave it cached in the default pool, which the graphs never draw from, and the pools of the
        recordings dropped since the last release. Not when recording or dropping them:
        freeing device memory waits for the whole device, NCCL's collectives included, and one started
        ahead of a peer whose host waits on this rank's MPI would never end. At the start of a
        backward pass a distributed run has nothing in flight (every gradient of the last iteration
        arrived before its layer's forward; none of this one's is made yet)."""
        self._release_pending = False
        self._dropped.clear()  # their pools free their memory as they go
        self._cupy.get_default_memory_pool().free_all_blocks()

    def _recorded_count(self) -> int:
        return sum(len(run.recordings) for run in self._runs.values())

    def _say_what_was_recorded(self, direction: str, before: int) -> None:
        """One log line for a pass that recorded graphs: how much of the net replays from now on."""
        recorded = self._recorded_count() - before
        if recorded:
            replayed = sum(1 for which in self.replayed() if which[0] == direction)
            eager = sum(1 for which, run in self._runs.items() if which[0] == direction and not run.recordings)
            log.info("Net %s: %d stretch(es) of layers recorded as CUDA graphs (%s); %d replay from now on, %d "
                     "replayable stretch(es) run eagerly", self.net.name, recorded, direction, replayed, eager)

    def _written_first(self, direction: str, layer_indices) -> list:
        """The blobs whose values (forward) or gradients (backward) the layers ``layer_indices``, in the
        pass's order, write before any of them reads them: what the run makes, not what it is given."""
        read, written = set(), {}
        order = layer_indices if direction == "forward" else reversed(layer_indices)
        for li in order:
            if direction == "forward":
                reads, writes = self._bottoms[li], self._tops[li]
            elif self.net.layer_need_backward[li]:
                reads = self._tops[li]
                writes = [b for b, wanted in zip(self._bottoms[li], self.net.bottom_need_backward[li]) if wanted]
            else:
                continue
            read.update(id(blob) for blob in reads if id(blob) not in written)
            written.update((id(blob), blob) for blob in writes)
        return [blob for key, blob in written.items() if key not in read]

    def _run(self, which: tuple, layer_indices, run_eagerly, paired: tuple | None = ()) -> "_Recording | None":
        """Run ``run_eagerly``'s layers: from a recording (replayed, or made now and launched), which is
        returned, or eagerly (None). ``paired``: as for ``_Run.key``; None: eagerly, whatever was
        recorded (``_forward_recordings``)."""
        run = self._runs.get(which)
        if run is None:
            touched = {id(blob): blob for li in layer_indices for blob in self._blobs[li]}
            run = self._runs[which] = _Run([self.net.layers[li] for li in layer_indices], list(touched.values()),
                                           which[0], self._written_first(which[0], layer_indices))
        if run.refused is not None:
            run_eagerly()
            return None
        if self._cupy is None:
            import cupy

            self._cupy = cupy
        cupy = self._cupy
        # The buffers a recording reads where they were: the net's scratch and cuDNN's shared workspace.
        key = run.key((self.net._scratch.generation, cudnn_plans.workspace_generation(), self.net.keep_blob_diffs),
                      paired)
        recording = run.recordings.get(key) if paired is not None else None
        if recording is not None:
            recording.replay(run.blobs, cupy)
            return recording
        if any(recorded[0] != key[0] for recorded in run.recordings):
            # New shapes or settings, or a scratch buffer or cuDNN's workspace replaced: the eager
            # passes ahead may replace arrays that layers keep and every recording reads (scratch,
            # kept outputs), and a replaced buffer is freed, so none of them can be replayed again.
            self._forget_recordings()
        # Recordings of parameters since replaced (weights loaded into new arrays), or paired with
        # forward recordings since gone, will not be replayed again: they go, and what they kept.
        live = self._forward_serials()
        kept = {recorded: recording for recorded, recording in run.recordings.items()
                if recorded[1][1] == key[1][1] and live.issuperset(recorded[1][2])}
        self._drop([recording for recorded, recording in run.recordings.items() if recorded not in kept])
        run.recordings = kept
        # The warm-up is the layers' (plans timed, arrays made): the forward recordings paired with
        # do not change it. A backward stretch after replayed forwards is recorded whatever the count:
        # run eagerly, it would read what the last forward recorded kept, not the one replayed.
        warming = (key[0], key[1][:2])
        warmed = run.eager_passes.get(warming, 0)
        full = len(run.recordings) >= MAX_RECORDINGS and not paired
        if warmed < WARM_UP_PASSES or full or paired is None:
            run.eager_passes[warming] = warmed + 1
            run_eagerly()
            return None
        try:
            recording = run.recordings[key] = run.record(run_eagerly, cupy)
            self._release_pending = True
            return recording
        except Exception as exc:  # noqa: BLE001 - any failure to record leaves the run eager
            run.refused = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            first, last = (self.net.layers[li].name for li in which[1:])  # in the pass's order
            log.warning("Net %s: layers %s..%s run %s without a CUDA graph: recording them failed (%s)",
                        self.net.name, first, last, which[0], run.refused)
            if which[0] == "backward":
                self._keep_forward_eager(layer_indices, f"{first}..{last}")
            run_eagerly()
            return None

    def _forward_serials(self) -> set:
        """The serials of every forward recording kept now."""
        return {recording.serial for (direction, _, _), run in self._runs.items() if direction == "forward"
                for recording in run.recordings.values()}

    def _keep_forward_eager(self, layer_indices, backward_stretch: str) -> None:
        """The forward of layers whose backward runs eagerly for good runs eagerly too: their backward
        reads what their forward kept, which a replay writes into the arrays of the recording it
        replays, not into those the layers last held (where a run has several recordings)."""
        layers = set(layer_indices)
        for (direction, first, last), run in self._runs.items():
            if direction == "forward" and run.refused is None and layers & set(range(first, last + 1)):
                run.refused = f"the backward stretch {backward_stretch} runs eagerly"
                self._drop(run.recordings.values())
                run.recordings.clear()
                names = self.net.layers[first].name, self.net.layers[last].name
                log.warning("Net %s: layers %s..%s run forward without a CUDA graph from now on: %s", self.net.name,
                            *names, run.refused)

    def _forget_recordings(self) -> None:
        for run in self._runs.values():
            self._drop(run.recordings.values())
            run.recordings.clear()
            run.eager_passes.clear()

    def _drop(self, recordings) -> None:
        """Let go of ``recordings`` at the next release point, not now: freeing their pools' memory
        would wait for the whole device (see ``_release_cached_memory``)."""
        self._dropped.extend(recordings)
        self._release_pending = self._release_pending or bool(self._dropped)

    def pool_bytes(self) -> int:
        """The device memory the recordings' own pools hold (their graphs' temporaries)."""
        return sum(recording.pool.total_bytes() for run in self._runs.values() for recording in run.recordings.values())

    def refused(self) -> list[tuple[str, str, str, str]]:
        """("forward" or "backward", its first layer's name, its last layer's name, why) of every stretch
        whose recording failed, and which runs eagerly for good."""
        names = [layer.name for layer in self.net.layers]
        return sorted((direction, names[first], names[last], run.refused)
                      for (direction, first, last), run in self._runs.items() if run.refused is not None)

    def replayed(self) -> list[tuple[str, str, str]]:
        """("forward" or "backward", its first layer's name, its last layer's name) of every stretch of
        layers replayed from a CUDA graph now (none before the warm-up passes)."""
        names = [layer.name for layer in self.net.layers]
        return sorted((direction, names[first], names[last])
                      for (direction, first, last), run in self._runs.items() if run.recordings)


def _runs(steps, replayable, starts_a_run=lambda a: False) -> list[tuple[int, int, bool]]:
    """Consecutive ``steps`` ((a, b) layer ranges in the pass's order) merged while ``replayable``
    (of a step) stays the same, and not into a step where ``starts_a_run(a)``: (the first step's a,
    the last step's b, replayable)."""
    runs: list[list] = []
    for a, b in steps:
        can = replayable(a, b)
        if runs and runs[-1][2] == can and not (can and starts_a_run(a)):
            runs[-1][1] = b
        else:
            runs.append([a, b, can])
    return [tuple(run) for run in runs]
