"""detectron2's Cascade R-CNN heads: a detection-only placeholder."""

from trainkit.modeling.roi_heads import CascadeROIHeads

__all__ = ["CascadeROIHeads"]

_PLACEHOLDER_MODULE = True
