"""``netdef simulate``: iteration time and scaling efficiency predicted from a per-layer profile
(``netdef.simulate``)."""
from __future__ import annotations

import logging

from .common import CommandLineError, caffe_flag

log = logging.getLogger("netdef")


def add_parser(verbs, common) -> None:
    from netdef.comm.options import on_off
    from netdef.comm.scheduler import ScheduleThread
    from netdef.simulate.rules import CPU_UPDATE_S_PER_BYTE, RULES

    sim = verbs.add_parser(
        "simulate", parents=[common], help="predict iteration time and scaling efficiency at 1 to 1,024 workers",
        description="Predict the iteration time, exposed exchange, efficiency and speed-up of data-parallel "
                    "training from a per-layer profile (netdef time --json=FILE, or a GPU's in the same format), "
                    "an exchange rule and a network. docs/scaling.md describes the model.")
    sim.add_argument("profile", metavar="PROFILE", help="per-layer times: the JSON of netdef time --json")
    caffe_flag(sim, "workers", default="1,2,4,8,16,32,64,128,256,512,1024",
               help="worker counts (comma separated)")
    caffe_flag(sim, "compute_scale", type=float, help="multiply every layer's time by this (another device)")
    caffe_flag(sim, "compute_ms", type=float, help="rescale the profile to this forward+backward time (ms)")
    caffe_flag(sim, "update_rate", type=float, default=round(1e-9 / CPU_UPDATE_S_PER_BYTE, 2),
               metavar="GB_PER_S",
               help="GB of parameters the update rule processes per second (default: this CPU's fused SGD)")
    caffe_flag(sim, "exchange_cpu_ns", type=float, default=0.0, metavar="NS",
               help="CPU ns per gradient byte the exchange takes from compute (cores all busy; default 0)")
    caffe_flag(sim, "sync_ms", type=float, default=0.0, metavar="MS",
               help="per iteration, the wait for the slowest rank at the agreement beyond its latency (ranks "
                    "sharing cores, stragglers; measured by benchmarks/scaling_model.py; default 0)")
    net = sim.add_argument_group("network")
    caffe_flag(net, "bandwidth", default="10gbit", help="per link (1gbit, 100gbit, 12.5GB/s; default 10gbit)")
    caffe_flag(net, "latency", default="5us", help="per message (5us, 1.5ms; default 5us)")
    caffe_flag(net, "topology", default="flat", choices=["flat", "nodes", "shared"],
               help="flat: a link per rank; nodes: --ranks_per_node share a node's link and talk inside over "
                    "--intra_bandwidth; shared: one medium for all traffic (the emulated loopback)")
    caffe_flag(net, "ranks_per_node", type=int, default=1, help="ranks per node (topology nodes)")
    caffe_flag(net, "intra_bandwidth", help="intra-node link (topology nodes), e.g. 100GB/s")
    caffe_flag(net, "intra_latency", default="2us", help="intra-node latency (default 2us)")
    caffe_flag(net, "allreduce_algorithm", default="auto",
               choices=["auto", "ring", "recursive_doubling", "rabenseifner"],
               help="the allreduce's algorithm (default auto: the cheapest for each size, as MPI libraries choose)")
    rule = sim.add_argument_group("exchange")
    caffe_flag(rule, "exchange", default="allreduce", choices=list(RULES), help="the exchange rule (default allreduce)")
    caffe_flag(rule, "schedule", type=str.lower, default="priority", choices=["fifo", "priority"],
               help="synchronous rules: the solver's schedule (default priority)")
    caffe_flag(rule, "overlap", type=on_off, default=True, metavar="on|off",
               help="exchange during backward (default on)")
    caffe_flag(rule, "bucket_bytes", type=int, default=4 << 20, metavar="BYTES",
               help="bucket size bound (default 4194304)")
    caffe_flag(rule, "chunk_bytes", type=int, default=0, metavar="BYTES", help="priority: chunk (default: as measured)")
    caffe_flag(rule, "credit_bytes", type=int, default=0, metavar="BYTES",
               help="priority: in flight (default: as measured)")
    caffe_flag(rule, "progress", type=str.lower, default="thread", choices=["thread", "deferred"],
               help="synchronous rules: thread (the communication thread tests the exchange every --poll_ms) or "
                    "deferred (it moves only while the training thread waits: the solver's choice over shared "
                    "memory); default thread")
    caffe_flag(rule, "poll_ms", type=float, default=ScheduleThread.poll_interval * 1e3, metavar="MS",
               help=f"the communication thread's poll interval (default {ScheduleThread.poll_interval * 1e3:g}, the "
                    f"solver's; 0 where nothing polls: NCCL, MPI's own progress thread)")
    caffe_flag(rule, "polled_ms", type=float, default=0.0, metavar="MS",
               help="measured: how long a tiny non-blocking allreduce takes when tested every --poll_ms "
                    "(benchmarks/scaling_model.py measures it; default 0: one poll per round plus one)")
    caffe_flag(rule, "colors", type=int, default=0, help="multicolor: trees (default: min(workers, 4))")
    caffe_flag(rule, "tau", type=int, default=10, help="easgd, hybrid: iterations between elastic steps (default 10)")
    caffe_flag(rule, "gossip_probability", type=float, default=0.1, help="gossip: per iteration (default 0.1)")
    caffe_flag(rule, "group_size", type=int, default=2, help="hybrid: ranks per synchronous group (default 2)")
    caffe_flag(sim, "json", action="store_true", help="print JSON instead of the table")
    sim.set_defaults(func=cmd_simulate)


def cmd_simulate(args) -> int:
    """Predict iteration time and scaling efficiency from a per-layer profile (netdef.simulate)."""
    import json

    from netdef import simulate
    from netdef.simulate import report

    profile = simulate.load_profile(args.profile)
    if not profile.backward_s > 0:
        # Without backward the model has no gradients to exchange in training's way: it would predict
        # a perfect efficiency at any number of workers.
        log.warning("%s has no backward pass (netdef time of a deploy net, or of a net with no loss): training "
                    "needs one, so these predictions are not of training; profile the train_val net "
                    "(netdef time --model=TRAIN_VAL --json=FILE)",
                    args.profile)
    if args.compute_scale is not None:
        profile = profile.scaled(args.compute_scale)
    if args.compute_ms is not None:
        total = profile.forward_s + profile.backward_s
        if not args.compute_ms > 0 or not total > 0:
            raise CommandLineError(f"simulate: --compute_ms must be positive and the profile's times non-zero "
                                   f"(got {args.compute_ms} and {total * 1e3:g} ms)")
        profile = profile.scaled(args.compute_ms / 1e3 / total)
    network = simulate.Network(
        simulate.parse_rate(args.bandwidth), simulate.parse_duration(args.latency), args.topology,
        args.ranks_per_node,
        simulate.parse_rate(args.intra_bandwidth, "--intra_bandwidth") if args.intra_bandwidth else 0.0,
        simulate.parse_duration(args.intra_latency, "--intra_latency"), args.allreduce_algorithm)
    schedule = simulate.ScheduleOptions(args.schedule, args.overlap, args.bucket_bytes, args.chunk_bytes,
                                        args.credit_bytes, args.progress, args.poll_ms * 1e-3,
                                        args.polled_ms * 1e-3)
    if not args.update_rate > 0:
        raise CommandLineError(f"simulate: --update_rate must be positive, got {args.update_rate}")
    options = simulate.RuleOptions(args.exchange, args.colors, args.tau, args.gossip_probability, args.group_size,
                                   schedule, 1.0 / (args.update_rate * 1e9), args.exchange_cpu_ns * 1e-9,
                                   args.sync_ms * 1e-3)
    try:
        workers = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        raise CommandLineError(f"simulate: --workers must be comma-separated integers, got {args.workers!r}") from None
    predictions = simulate.predict(profile, network, workers, options)
    if args.json:
        print(json.dumps(report.as_json(profile, network, options, predictions), indent=1))
    else:
        print(report.describe(profile, network, options))
        print(report.table(predictions))
    return 0
