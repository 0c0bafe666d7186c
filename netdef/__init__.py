"""netdef: a Caffe-compatible declarative network trainer.

pycaffe users port by renaming ``caffe`` to ``netdef``::

    import netdef
    net = netdef.Net("deploy.prototxt", netdef.TEST, weights="model.caffemodel")
    probs = net.forward(data=images)["prob"]
"""
from . import threads as _threads

_threads.let_idle_blas_threads_sleep()  # before anything below loads NumPy and its BLAS

from .backend import (
    get_array_module,
    set_device,
    set_device_id,
    set_mode_cpu,
    set_mode_gpu,
    set_precision,
    set_random_seed,
)
from . import io
from .blob import Blob
from .classifier import Classifier
from .detector import Detector
from .layers.base import TEST, TRAIN, DataSource, Layer, LayerError, layer_class, register_layer, registered_types
from .net import Net, NetError
from .netspec import NetSpec, NetSpecError, layers, params, to_proto
from .solver import (
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    NesterovSolver,
    RMSPropSolver,
    SGDSolver,
    Solver,
    SolverCallback,
    get_solver,
)
from .proto import netdef_pb2 as proto_pb2
from .pycaffe import (
    NCCL,
    Timer,
    has_nccl,
    init_log,
    layer_type_list,
    log_message as log,
    set_multiprocess,
    set_solver_count,
    set_solver_rank,
    solver_count,
    solver_rank,
)
from .weights import WeightsError

# pycaffe's caffe.proto.caffe_pb2 is netdef.proto.caffe_pb2; netdef.proto_pb2 is the same messages.
__all__ = [
    "AdaDeltaSolver", "AdaGradSolver", "AdamSolver", "NesterovSolver", "RMSPropSolver", "SGDSolver", "Solver",
    "SolverCallback", "get_solver", "Blob", "Classifier", "DataSource", "Layer", "LayerError", "Net", "NetError",
    "NetSpec",
    "NetSpecError", "TEST", "TRAIN", "WeightsError", "get_array_module", "io", "layers", "params", "to_proto",
    "layer_class", "proto_pb2", "register_layer", "registered_types", "set_device", "set_device_id",
    "set_mode_cpu", "set_mode_gpu", "set_precision", "set_random_seed",
    "Detector", "NCCL", "Timer", "has_nccl", "init_log", "layer_type_list", "log", "set_multiprocess",
    "set_solver_count", "set_solver_rank", "solver_count", "solver_rank",
]
__version__ = "0.1.0"
