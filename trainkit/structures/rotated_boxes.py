"""detectron2's rotated boxes: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = ["RotatedBoxes", "pairwise_iou"]

RotatedBoxes = detection_only("RotatedBoxes", __name__, "a tensor of rotated boxes")
pairwise_iou = detection_only("pairwise_iou", __name__, "IoU between two sets of rotated boxes")
