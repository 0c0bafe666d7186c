"""Imports every built-in exchange rule's module so that its rule is registered (``allreduce`` is
registered by ``exchange.py`` itself). The one place they are imported for that: the registry
(``exchange.EXCHANGE_RULES``) calls ``exchange._load_builtin_rules`` on its first lookup."""
from . import elastic, fp16, gossip, multicolor  # noqa: F401  (easgd and hybrid; fp16; gossip; multicolor)
