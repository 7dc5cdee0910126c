"""detectron2's ``ROIAlignRotated`` of rotated box regions: detection-only placeholders."""

from trainkit.layers import ROIAlignRotated, roi_align_rotated
from trainkit.utils.detection_only import make_module_callable_as

__all__ = ["ROIAlignRotated", "roi_align_rotated"]

_PLACEHOLDER_MODULE = True

# layers.roi_align_rotated is also a function of detectron2's package: see make_module_callable_as.
make_module_callable_as(__name__, roi_align_rotated)
