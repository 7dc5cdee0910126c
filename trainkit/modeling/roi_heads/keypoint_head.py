"""detectron2's keypoint heads of Keypoint R-CNN: detection-only placeholders."""

from trainkit.modeling.roi_heads import (
    ROI_KEYPOINT_HEAD_REGISTRY,
    BaseKeypointRCNNHead,
    KRCNNConvDeconvUpsampleHead,
    build_keypoint_head,
)
from trainkit.utils.detection_only import detection_only

__all__ = [
    "ROI_KEYPOINT_HEAD_REGISTRY",
    "BaseKeypointRCNNHead",
    "KRCNNConvDeconvUpsampleHead",
    "build_keypoint_head",
    "keypoint_rcnn_inference",
    "keypoint_rcnn_loss",
]

_PLACEHOLDER_MODULE = True

keypoint_rcnn_loss = detection_only(
    "keypoint_rcnn_loss", __name__, "the keypoint loss of Keypoint R-CNN"
)
keypoint_rcnn_inference = detection_only(
    "keypoint_rcnn_inference", __name__, "turning Keypoint R-CNN heatmaps into keypoints"
)
