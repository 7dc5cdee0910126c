"""detectron2's faster COCO evaluation (``COCOeval_opt``): a detection-only placeholder."""

from trainkit.utils.detection_only import detection_only

__all__ = ["COCOeval_opt"]

_PLACEHOLDER_MODULE = True

COCOeval_opt = detection_only(
    "COCOeval_opt",
    __name__,
    "pycocotools' COCOeval with detectron2's C++ evaluation",
    "port the evaluation to a trainkit DatasetEvaluator",
)
