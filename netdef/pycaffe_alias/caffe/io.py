"""``caffe.io`` for a Python layer module that netdef loads: netdef.io's names (see ``caffe/__init__.py``)."""
from netdef.io import *  # noqa: F401,F403
