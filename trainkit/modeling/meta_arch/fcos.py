"""detectron2's FCOS detector: detection-only placeholders."""

from trainkit.modeling.meta_arch import FCOS
from trainkit.utils.detection_only import detection_only

__all__ = ["FCOS", "FCOSHead"]

_PLACEHOLDER_MODULE = True

FCOSHead = detection_only("FCOSHead", __name__, "the head of the FCOS detector")
