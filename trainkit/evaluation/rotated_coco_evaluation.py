"""detectron2's rotated-box COCO evaluation: a detection-only placeholder."""

from trainkit.evaluation import RotatedCOCOEvaluator

__all__ = ["RotatedCOCOEvaluator"]

_PLACEHOLDER_MODULE = True
