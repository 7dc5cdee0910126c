"""detectron2's general-purpose layers: ``Conv2d``, ``ShapeSpec``, ``get_norm``, frozen BN, ..."""

from trainkit.layers.aspp import ASPP
from trainkit.layers.batch_norm import FrozenBatchNorm2d, LayerNorm, get_norm
from trainkit.layers.blocks import CNNBlockBase, DepthwiseSeparableConv2d
from trainkit.layers.nms import batched_nms, batched_nms_rotated, nms, nms_rotated
from trainkit.layers.shape_spec import ShapeSpec
from trainkit.layers.wrappers import (
    BatchNorm2d,
    Conv2d,
    ConvTranspose2d,
    Linear,
    cat,
    interpolate,
    move_device_like,
    nonzero_tuple,
    shapes_to_tensor,
)

__all__ = [
    "ASPP",
    "BatchNorm2d",
    "CNNBlockBase",
    "Conv2d",
    "ConvTranspose2d",
    "DepthwiseSeparableConv2d",
    "FrozenBatchNorm2d",
    "LayerNorm",
    "Linear",
    "ShapeSpec",
    "batched_nms",
    "batched_nms_rotated",
    "cat",
    "get_norm",
    "interpolate",
    "move_device_like",
    "nms",
    "nms_rotated",
    "nonzero_tuple",
    "shapes_to_tensor",
]
