"""detectron2's rotated-box COCO evaluation: a detection-only placeholder."""

from trainkit.utils.detection_only import detection_only

__all__ = ["RotatedCOCOEvaluator"]

RotatedCOCOEvaluator = detection_only(
    "RotatedCOCOEvaluator",
    __name__,
    "COCO AP of rotated boxes",
    "port it to a trainkit DatasetEvaluator",
)
