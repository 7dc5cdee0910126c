"""detectron2's heads of rotated-box R-CNN detectors: detection-only placeholders."""

from trainkit.modeling.roi_heads import RROIHeads
from trainkit.utils.detection_only import detection_only

__all__ = [
    "RROIHeads",
    "RotatedFastRCNNOutputLayers",
    "fast_rcnn_inference_rotated",
    "fast_rcnn_inference_single_image_rotated",
]

_PLACEHOLDER_MODULE = True

_FEATURE = "the heads of rotated-box R-CNN detectors"

RotatedFastRCNNOutputLayers = detection_only("RotatedFastRCNNOutputLayers", __name__, _FEATURE)
fast_rcnn_inference_rotated = detection_only("fast_rcnn_inference_rotated", __name__, _FEATURE)
fast_rcnn_inference_single_image_rotated = detection_only(
    "fast_rcnn_inference_single_image_rotated", __name__, _FEATURE
)
