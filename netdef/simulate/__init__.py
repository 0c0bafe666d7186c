"""The scaling model behind ``netdef simulate``: iteration time and scaling efficiency at 2 to 1,024
workers for a net, an exchange rule and a network.

- ``profile``: the net's per-layer forward/backward times and parameter sizes (``netdef time
  --json`` writes them; a GPU's can be given by hand or a CPU profile rescaled).
- ``network``: latency, bandwidth and topology, and what each collective costs (alpha-beta).
- ``iteration``: the synchronous rules' iterations, simulated as the solver runs them (buckets,
  priorities and chunks, updates as gradients arrive, the next forward overlapping the exchange).
- ``rules``: each exchange rule's model, and ``predict`` over worker counts.
- ``report``: the table and the JSON.

docs/scaling.md has the assumptions and the validation against measured iteration times.
"""
from .iteration import ScheduleOptions
from .network import Network, NetworkError, parse_duration, parse_rate
from .profile import Profile, ProfileError, load_profile, profile_of, write_profile
from .rules import RULES, Prediction, RuleError, RuleOptions, predict

__all__ = ["Network", "NetworkError", "Prediction", "Profile", "ProfileError", "RULES", "RuleError", "RuleOptions",
           "ScheduleOptions", "load_profile", "parse_duration", "parse_rate", "predict", "profile_of",
           "write_profile"]
