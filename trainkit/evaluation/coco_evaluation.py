"""detectron2's COCO evaluation: a detection-only placeholder."""

from trainkit.evaluation import COCOEvaluator

__all__ = ["COCOEvaluator"]

_PLACEHOLDER_MODULE = True
