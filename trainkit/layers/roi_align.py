"""detectron2's ``ROIAlign`` of box regions: detection-only placeholders."""

from trainkit.layers import ROIAlign, roi_align

__all__ = ["ROIAlign", "roi_align"]

_PLACEHOLDER_MODULE = True
