"""detectron2's per-region heads of R-CNN detectors: detection-only placeholders."""

from trainkit.modeling import (
    ROI_BOX_HEAD_REGISTRY,
    ROI_HEADS_REGISTRY,
    ROI_KEYPOINT_HEAD_REGISTRY,
    ROI_MASK_HEAD_REGISTRY,
    BaseKeypointRCNNHead,
    BaseMaskRCNNHead,
    FastRCNNOutputLayers,
    ROIHeads,
    StandardROIHeads,
    build_box_head,
    build_keypoint_head,
    build_mask_head,
    build_roi_heads,
)
from trainkit.utils.detection_only import detection_only

__all__ = [
    "ROI_BOX_HEAD_REGISTRY",
    "ROI_HEADS_REGISTRY",
    "ROI_KEYPOINT_HEAD_REGISTRY",
    "ROI_MASK_HEAD_REGISTRY",
    "BaseKeypointRCNNHead",
    "BaseMaskRCNNHead",
    "CascadeROIHeads",
    "FastRCNNConvFCHead",
    "FastRCNNOutputLayers",
    "KRCNNConvDeconvUpsampleHead",
    "MaskRCNNConvUpsampleHead",
    "RROIHeads",
    "ROIHeads",
    "Res5ROIHeads",
    "StandardROIHeads",
    "build_box_head",
    "build_keypoint_head",
    "build_mask_head",
    "build_roi_heads",
    "select_foreground_proposals",
]

_PLACEHOLDER_MODULE = True

_ROI_HEADS = "the per-region heads of R-CNN detectors"
Res5ROIHeads = detection_only("Res5ROIHeads", __name__, _ROI_HEADS)
select_foreground_proposals = detection_only("select_foreground_proposals", __name__, _ROI_HEADS)
CascadeROIHeads = detection_only("CascadeROIHeads", __name__, "the heads of Cascade R-CNN")
RROIHeads = detection_only("RROIHeads", __name__, "the heads of rotated-box R-CNN detectors")
FastRCNNConvFCHead = detection_only(
    "FastRCNNConvFCHead", __name__, "the box head of R-CNN detectors"
)
MaskRCNNConvUpsampleHead = detection_only(
    "MaskRCNNConvUpsampleHead", __name__, "the mask head of Mask R-CNN"
)
KRCNNConvDeconvUpsampleHead = detection_only(
    "KRCNNConvDeconvUpsampleHead", __name__, "the keypoint head of Keypoint R-CNN"
)
