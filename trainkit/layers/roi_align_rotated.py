"""detectron2's ``ROIAlignRotated`` of rotated box regions: detection-only placeholders."""

from trainkit.layers import ROIAlignRotated, roi_align_rotated

__all__ = ["ROIAlignRotated", "roi_align_rotated"]

_PLACEHOLDER_MODULE = True
