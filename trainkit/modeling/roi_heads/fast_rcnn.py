"""detectron2's Fast R-CNN box predictions and inference: detection-only placeholders."""

from trainkit.modeling.roi_heads import FastRCNNOutputLayers
from trainkit.utils.detection_only import detection_only

__all__ = ["FastRCNNOutputLayers", "fast_rcnn_inference", "fast_rcnn_inference_single_image"]

_PLACEHOLDER_MODULE = True

_FEATURE = "turning Fast R-CNN box predictions into detections"

fast_rcnn_inference = detection_only("fast_rcnn_inference", __name__, _FEATURE)
fast_rcnn_inference_single_image = detection_only(
    "fast_rcnn_inference_single_image", __name__, _FEATURE
)
