"""detectron2's Pascal VOC evaluation: a detection-only placeholder."""

from trainkit.evaluation import PascalVOCDetectionEvaluator

__all__ = ["PascalVOCDetectionEvaluator"]

_PLACEHOLDER_MODULE = True
