"""detectron2's LVIS evaluation: a detection-only placeholder."""

from trainkit.utils.detection_only import detection_only

__all__ = ["LVISEvaluator"]

LVISEvaluator = detection_only(
    "LVISEvaluator", __name__, "LVIS box and mask AP", "port it to a trainkit DatasetEvaluator"
)
