"""detectron2's ROI heads of R-CNN detectors: detection-only placeholders."""

from trainkit.modeling.roi_heads import (
    ROI_HEADS_REGISTRY,
    Res5ROIHeads,
    ROIHeads,
    StandardROIHeads,
    build_roi_heads,
    select_foreground_proposals,
)
from trainkit.utils.detection_only import detection_only

__all__ = [
    "ROI_HEADS_REGISTRY",
    "ROIHeads",
    "Res5ROIHeads",
    "StandardROIHeads",
    "build_roi_heads",
    "select_foreground_proposals",
    "select_proposals_with_visible_keypoints",
]

_PLACEHOLDER_MODULE = True

select_proposals_with_visible_keypoints = detection_only(
    "select_proposals_with_visible_keypoints", __name__, "the per-region heads of R-CNN detectors"
)
