"""detectron2's COCO evaluation: a detection-only placeholder."""

from trainkit.utils.detection_only import detection_only

__all__ = ["COCOEvaluator"]

COCOEvaluator = detection_only(
    "COCOEvaluator",
    __name__,
    "COCO box, mask and keypoint AP through pycocotools",
    "port it to a trainkit DatasetEvaluator",
)
