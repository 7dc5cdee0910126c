"""detectron2's general-purpose layers: ``Conv2d``, ``ShapeSpec``, ``get_norm``, frozen BN, ...

The detection-only layers detectron2 exports here (NMS, ROIAlign, deformable convolution,
mask pasting, box losses) are placeholders made in this file; their modules (``layers.nms``,
``layers.roi_align``, ...) re-export them and load only when imported by their own path.
"""

from trainkit.layers.aspp import ASPP
from trainkit.layers.batch_norm import FrozenBatchNorm2d, LayerNorm, get_norm
from trainkit.layers.blocks import CNNBlockBase, DepthwiseSeparableConv2d
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
from trainkit.utils.detection_only import detection_only

__all__ = [
    "ASPP",
    "DeformConv",
    "ModulatedDeformConv",
    "ROIAlign",
    "ROIAlignRotated",
    "ciou_loss",
    "diou_loss",
    "paste_masks_in_image",
    "roi_align",
    "roi_align_rotated",
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

nms = detection_only("nms", __name__, "non-maximum suppression of boxes")
batched_nms = detection_only("batched_nms", __name__, "per-class non-maximum suppression of boxes")
nms_rotated = detection_only("nms_rotated", __name__, "non-maximum suppression of rotated boxes")
batched_nms_rotated = detection_only(
    "batched_nms_rotated", __name__, "per-class non-maximum suppression of rotated boxes"
)

_ROI_ADVICE = "use torchvision.ops.roi_align / RoIAlign"
ROIAlign = detection_only("ROIAlign", __name__, "pooling box regions of a feature map", _ROI_ADVICE)
roi_align = detection_only(
    "roi_align", __name__, "pooling box regions of a feature map", _ROI_ADVICE
)
ROIAlignRotated = detection_only(
    "ROIAlignRotated", __name__, "pooling rotated box regions of a feature map"
)
roi_align_rotated = detection_only(
    "roi_align_rotated", __name__, "pooling rotated box regions of a feature map"
)

_DEFORM_REASON = "not in trainkit (it is detectron2's own compiled CUDA operator)"
_DEFORM_ADVICE = "use torchvision.ops.DeformConv2d"
DeformConv = detection_only("DeformConv", __name__, "", _DEFORM_ADVICE, reason=_DEFORM_REASON)
ModulatedDeformConv = detection_only(
    "ModulatedDeformConv", __name__, "", _DEFORM_ADVICE, reason=_DEFORM_REASON
)

paste_masks_in_image = detection_only(
    "paste_masks_in_image", __name__, "pasting instance masks into the image"
)

_LOSS_ADVICE = "use torchvision.ops.distance_box_iou_loss / complete_box_iou_loss"
diou_loss = detection_only("diou_loss", __name__, "a box regression loss", _LOSS_ADVICE)
ciou_loss = detection_only("ciou_loss", __name__, "a box regression loss", _LOSS_ADVICE)
