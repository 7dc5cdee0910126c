"""detectron2's Pascal VOC evaluation: a detection-only placeholder."""

from trainkit.utils.detection_only import detection_only

__all__ = ["PascalVOCDetectionEvaluator"]

PascalVOCDetectionEvaluator = detection_only(
    "PascalVOCDetectionEvaluator",
    __name__,
    "Pascal VOC box AP",
    "port it to a trainkit DatasetEvaluator",
)
