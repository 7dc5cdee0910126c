"""detectron2's IoU of rotated boxes: a detection-only placeholder."""

from trainkit.utils.detection_only import detection_only

__all__ = ["pairwise_iou_rotated"]

_PLACEHOLDER_MODULE = True

pairwise_iou_rotated = detection_only(
    "pairwise_iou_rotated", __name__, "IoU between two sets of rotated boxes"
)
