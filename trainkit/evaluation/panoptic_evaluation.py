"""detectron2's COCO panoptic evaluation: a detection-only placeholder."""

from trainkit.utils.detection_only import detection_only

__all__ = ["COCOPanopticEvaluator"]

COCOPanopticEvaluator = detection_only(
    "COCOPanopticEvaluator",
    __name__,
    "COCO panoptic quality",
    "port it to a trainkit DatasetEvaluator",
)
