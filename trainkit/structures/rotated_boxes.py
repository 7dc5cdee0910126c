"""detectron2's rotated boxes: detection-only placeholders."""

from trainkit.structures import RotatedBoxes
from trainkit.structures import pairwise_iou_rotated as pairwise_iou

__all__ = ["RotatedBoxes", "pairwise_iou"]

_PLACEHOLDER_MODULE = True
