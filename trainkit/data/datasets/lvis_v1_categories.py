"""detectron2's table of the LVIS v1 categories: a detection-only placeholder."""

from trainkit.utils.detection_only import detection_only

__all__ = ["CATEGORIES"]

_PLACEHOLDER_MODULE = True

CATEGORIES = detection_only("CATEGORIES", __name__, "the categories of LVIS v1")
