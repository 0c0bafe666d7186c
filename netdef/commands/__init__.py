"""The verbs of ``netdef <verb>`` that live outside ``netdef/cli.py``, one module per family: ``train``,
``simulate``, ``data`` (the data tools), and ``common``, the helpers every verb shares. Each module
adds its verbs' parsers (``add_parser``/``add_parsers``) and holds their ``cmd_*`` functions."""
