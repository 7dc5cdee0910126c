"""detectron2's box structures: detection-only placeholders."""

from trainkit.structures import (
    Boxes,
    BoxMode,
    pairwise_ioa,
    pairwise_iou,
    pairwise_point_box_distance,
)
from trainkit.utils.detection_only import detection_only

__all__ = [
    "BoxMode",
    "Boxes",
    "matched_pairwise_iou",
    "pairwise_intersection",
    "pairwise_ioa",
    "pairwise_iou",
    "pairwise_point_box_distance",
]

_PLACEHOLDER_MODULE = True

pairwise_intersection = detection_only(
    "pairwise_intersection", __name__, "intersection area between two sets of boxes"
)
matched_pairwise_iou = detection_only(
    "matched_pairwise_iou", __name__, "IoU between matched pairs of boxes"
)
