"""detectron2's non-maximum suppression of boxes: detection-only placeholders."""

from trainkit.layers import batched_nms, batched_nms_rotated, nms, nms_rotated

__all__ = ["batched_nms", "batched_nms_rotated", "nms", "nms_rotated"]

_PLACEHOLDER_MODULE = True
