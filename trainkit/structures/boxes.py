"""detectron2's box structures: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = [
    "BoxMode",
    "Boxes",
    "matched_pairwise_iou",
    "pairwise_intersection",
    "pairwise_ioa",
    "pairwise_iou",
]

BoxMode = detection_only("BoxMode", __name__, "box coordinate modes such as XYXY_ABS")
Boxes = detection_only("Boxes", __name__, "a tensor of axis-aligned boxes")
pairwise_iou = detection_only("pairwise_iou", __name__, "IoU between two sets of boxes")
pairwise_ioa = detection_only(
    "pairwise_ioa", __name__, "intersection over area between two sets of boxes"
)
pairwise_intersection = detection_only(
    "pairwise_intersection", __name__, "intersection area between two sets of boxes"
)
matched_pairwise_iou = detection_only(
    "matched_pairwise_iou", __name__, "IoU between matched pairs of boxes"
)
