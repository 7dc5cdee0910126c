"""detectron2's LVIS evaluation: a detection-only placeholder."""

from trainkit.evaluation import LVISEvaluator

__all__ = ["LVISEvaluator"]

_PLACEHOLDER_MODULE = True
