"""``netdef simulate``'s output: a table for people, JSON for scripts."""
from __future__ import annotations

from .network import Network
from .profile import Profile
from .rules import Prediction, RuleOptions


def describe(profile: Profile, network: Network, options: RuleOptions) -> str:
    link = f"{network.bytes_per_s * 8 / 1e9:g} Gbit/s, latency {network.latency_s * 1e6:g} us, {network.topology}"
    if network.topology == "nodes":
        link += (f" ({network.ranks_per_node} ranks per node, intra-node {network.intra_bytes_per_s * 8 / 1e9:g} "
                 f"Gbit/s, {network.intra_latency_s * 1e6:g} us)")
    schedule = options.schedule
    progress = f"progress {schedule.progress}"
    if schedule.progress == "thread":
        progress += f" (poll {schedule.poll_s * 1e3:g} ms"
        progress += f", a tiny collective measured at {schedule.polled_s * 1e3:g} ms)" if schedule.polled_s else ")"
    return (f"# {profile.model or 'profile'}: batch {profile.batch} per worker, {profile.gradient_bytes / 1e6:.1f} MB "
            f"of gradients, compute {1e3 * (profile.forward_s + profile.backward_s):.1f} ms; exchange "
            f"{options.rule}, schedule {schedule.schedule}, {progress}, sync {options.sync_s * 1e3:g} ms per "
            f"iteration; network {link}")


def table(predictions: list[Prediction]) -> str:
    lines = [f"{'workers':>7} {'iteration ms':>12} {'compute ms':>10} {'exposed ms':>10} {'efficiency':>10} "
             f"{'speed-up':>8}"]
    for p in predictions:
        lines.append(f"{p.workers:>7} {p.iteration_s * 1e3:>12.1f} {p.compute_s * 1e3:>10.1f} "
                     f"{p.exposed_s * 1e3:>10.1f} {p.efficiency:>10.3f} {p.speedup:>8.2f}")
    return "\n".join(lines)


def as_json(profile: Profile, network: Network, options: RuleOptions, predictions: list[Prediction]) -> dict:
    return {"model": profile.model, "batch": profile.batch, "gradient_bytes": profile.gradient_bytes,
            "exchange": options.rule, "schedule": options.schedule.schedule, "progress": options.schedule.progress,
            "poll_s": options.schedule.poll_s, "polled_s": options.schedule.polled_s, "sync_s": options.sync_s,
            "network": {"bytes_per_s": network.bytes_per_s, "latency_s": network.latency_s,
                        "topology": network.topology, "ranks_per_node": network.ranks_per_node,
                        "intra_bytes_per_s": network.intra_bytes_per_s, "intra_latency_s": network.intra_latency_s},
            "predictions": [p.to_dict() for p in predictions]}
