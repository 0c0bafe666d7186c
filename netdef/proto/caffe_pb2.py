"""pycaffe's ``caffe.proto.caffe_pb2`` under netdef: ``from netdef.proto import caffe_pb2``.

The same message classes and enum values as ``netdef_pb2`` (netdef's schema is Caffe's, wire-compatible
field for field, with netdef's additions at field numbers from 10000), so that code written against
pycaffe's module name ports by renaming ``caffe`` to ``netdef``::

    net = caffe_pb2.NetParameter()
    text_format.Merge(open("train_val.prototxt").read(), net)
    caffe_pb2.TRAIN, caffe_pb2.SolverParameter.SGD, caffe_pb2.BlobProto ...
"""
from .netdef_pb2 import *  # noqa: F401,F403 - this module is an alias of netdef_pb2's names
