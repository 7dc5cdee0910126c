"""detectron2's COCO panoptic evaluation: a detection-only placeholder."""

from trainkit.evaluation import COCOPanopticEvaluator

__all__ = ["COCOPanopticEvaluator"]

_PLACEHOLDER_MODULE = True
