"""detectron2's non-maximum suppression of boxes: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = ["batched_nms", "batched_nms_rotated", "nms", "nms_rotated"]

nms = detection_only("nms", __name__, "non-maximum suppression of boxes")
batched_nms = detection_only("batched_nms", __name__, "per-class non-maximum suppression of boxes")
nms_rotated = detection_only("nms_rotated", __name__, "non-maximum suppression of rotated boxes")
batched_nms_rotated = detection_only(
    "batched_nms_rotated", __name__, "per-class non-maximum suppression of rotated boxes"
)
