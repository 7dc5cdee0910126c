"""detectron2's mask heads of Mask R-CNN: detection-only placeholders."""

from trainkit.modeling.roi_heads import (
    ROI_MASK_HEAD_REGISTRY,
    BaseMaskRCNNHead,
    MaskRCNNConvUpsampleHead,
    build_mask_head,
)
from trainkit.utils.detection_only import detection_only

__all__ = [
    "ROI_MASK_HEAD_REGISTRY",
    "BaseMaskRCNNHead",
    "MaskRCNNConvUpsampleHead",
    "build_mask_head",
    "mask_rcnn_inference",
    "mask_rcnn_loss",
]

_PLACEHOLDER_MODULE = True

mask_rcnn_loss = detection_only("mask_rcnn_loss", __name__, "the mask loss of Mask R-CNN")
mask_rcnn_inference = detection_only(
    "mask_rcnn_inference", __name__, "turning Mask R-CNN predictions into instance masks"
)
