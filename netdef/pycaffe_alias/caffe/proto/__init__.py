"""``caffe.proto`` for a Python layer module that netdef loads (see ``caffe/__init__.py``)."""
