"""detectron2's non-maximum suppression of boxes: detection-only placeholders."""

from trainkit.layers import batched_nms, batched_nms_rotated, nms, nms_rotated
from trainkit.utils.detection_only import make_module_callable_as

__all__ = ["batched_nms", "batched_nms_rotated", "nms", "nms_rotated"]

_PLACEHOLDER_MODULE = True

# layers.nms is also a function of detectron2's package: see make_module_callable_as.
make_module_callable_as(__name__, nms)
