"""detectron2's helpers of instance tracking: a detection-only placeholder."""

from trainkit.tracking import create_prediction_pairs

__all__ = ["create_prediction_pairs"]

_PLACEHOLDER_MODULE = True
