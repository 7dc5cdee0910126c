"""detectron2's table of LVIS v1's images per category: a detection-only placeholder."""

from trainkit.utils.detection_only import detection_only

__all__ = ["LVIS_CATEGORY_IMAGE_COUNT"]

_PLACEHOLDER_MODULE = True

LVIS_CATEGORY_IMAGE_COUNT = detection_only(
    "LVIS_CATEGORY_IMAGE_COUNT", __name__, "the number of images per LVIS v1 category"
)
