"""Evaluators, the distributed inference loop, and result reporting and checking.

detectron2's detection evaluators (COCO, LVIS, Pascal VOC, Cityscapes, panoptic) import from
here and from their module paths as placeholders that explain themselves when used. They are
made here; their modules (``evaluation.coco_evaluation``, ...) re-export them and load only
when imported by their own path.
"""

from trainkit.evaluation.classification_evaluation import ClassificationEvaluator
from trainkit.evaluation.evaluator import (
    DatasetEvaluator,
    DatasetEvaluators,
    inference_context,
    inference_on_dataset,
)
from trainkit.evaluation.sem_seg_evaluation import SemSegEvaluator
from trainkit.evaluation.testing import print_csv_format, verify_results
from trainkit.evaluation.validation import loss_evaluation_context, validation_losses
from trainkit.utils.detection_only import detection_only

__all__ = [
    "COCOEvaluator",
    "COCOPanopticEvaluator",
    "CityscapesEvaluator",
    "CityscapesInstanceEvaluator",
    "CityscapesSemSegEvaluator",
    "ClassificationEvaluator",
    "DatasetEvaluator",
    "DatasetEvaluators",
    "LVISEvaluator",
    "PascalVOCDetectionEvaluator",
    "RotatedCOCOEvaluator",
    "SemSegEvaluator",
    "inference_context",
    "inference_on_dataset",
    "loss_evaluation_context",
    "print_csv_format",
    "validation_losses",
    "verify_results",
]

_ADVICE = "port it to a trainkit DatasetEvaluator"

COCOEvaluator = detection_only(
    "COCOEvaluator", __name__, "COCO box, mask and keypoint AP through pycocotools", _ADVICE
)
LVISEvaluator = detection_only("LVISEvaluator", __name__, "LVIS box and mask AP", _ADVICE)
PascalVOCDetectionEvaluator = detection_only(
    "PascalVOCDetectionEvaluator", __name__, "Pascal VOC box AP", _ADVICE
)
COCOPanopticEvaluator = detection_only(
    "COCOPanopticEvaluator", __name__, "COCO panoptic quality", _ADVICE
)
RotatedCOCOEvaluator = detection_only(
    "RotatedCOCOEvaluator", __name__, "COCO AP of rotated boxes", _ADVICE
)
CityscapesEvaluator = detection_only(
    "CityscapesEvaluator", __name__, "the base of the Cityscapes evaluators", _ADVICE
)
CityscapesInstanceEvaluator = detection_only(
    "CityscapesInstanceEvaluator", __name__, "Cityscapes instance-segmentation AP", _ADVICE
)
CityscapesSemSegEvaluator = detection_only(
    "CityscapesSemSegEvaluator",
    __name__,
    "",
    "use trainkit.evaluation.SemSegEvaluator (mIoU, fwIoU, mACC, pACC) instead",
    reason="not in trainkit (it runs Cityscapes' official scripts, which trainkit does not wrap)",
)
