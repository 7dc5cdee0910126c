"""detectron2's shared helpers of Caffe2 export: placeholders."""

from trainkit.export import _not_shipped

__all__ = ["ScopedWS", "get_pb_arg_vali", "get_pb_arg_vals", "mock_torch_nn_functional_interpolate"]

_PLACEHOLDER_MODULE = True

ScopedWS = _not_shipped("ScopedWS", __name__)
get_pb_arg_vali = _not_shipped("get_pb_arg_vali", __name__)
get_pb_arg_vals = _not_shipped("get_pb_arg_vals", __name__)
mock_torch_nn_functional_interpolate = _not_shipped(
    "mock_torch_nn_functional_interpolate", __name__
)
