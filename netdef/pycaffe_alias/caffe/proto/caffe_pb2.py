"""``caffe.proto.caffe_pb2`` for a Python layer module that netdef loads: netdef.proto.caffe_pb2's messages."""
from netdef.proto.caffe_pb2 import *  # noqa: F401,F403
