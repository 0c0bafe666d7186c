"""``import caffe`` inside the Python layer modules that netdef loads, where no Caffe is installed.

netdef's loader (netdef/layers/python.py) puts the folder above this package at the *end* of sys.path
only while it imports a layer's module, so an installed Caffe is found first and wins, and user code
outside a layer module never sees this package. It answers with netdef's pycaffe surface: the layer
base class, the phases, io, NetSpec, Net and the solvers.
"""
from netdef import *  # noqa: F401,F403 - this package is netdef's API under pycaffe's name
