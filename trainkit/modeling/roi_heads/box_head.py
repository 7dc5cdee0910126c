"""detectron2's box heads of R-CNN detectors: detection-only placeholders."""

from trainkit.modeling.roi_heads import ROI_BOX_HEAD_REGISTRY, FastRCNNConvFCHead, build_box_head

__all__ = ["ROI_BOX_HEAD_REGISTRY", "FastRCNNConvFCHead", "build_box_head"]

_PLACEHOLDER_MODULE = True
