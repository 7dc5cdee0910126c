"""detectron2's ``ROIAlign`` of box regions: detection-only placeholders."""

from trainkit.layers import ROIAlign, roi_align
from trainkit.utils.detection_only import make_module_callable_as

__all__ = ["ROIAlign", "roi_align"]

_PLACEHOLDER_MODULE = True

# layers.roi_align is also a function of detectron2's package: see make_module_callable_as.
make_module_callable_as(__name__, roi_align)
