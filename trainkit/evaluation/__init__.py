"""Evaluators, the distributed inference loop, and result reporting and checking.

detectron2's detection evaluators (COCO, LVIS, Pascal VOC, Cityscapes, panoptic) import from
here and from their module paths as placeholders that explain themselves when used.
"""

from trainkit.evaluation.cityscapes_evaluation import (
    CityscapesEvaluator,
    CityscapesInstanceEvaluator,
    CityscapesSemSegEvaluator,
)
from trainkit.evaluation.classification_evaluation import ClassificationEvaluator
from trainkit.evaluation.coco_evaluation import COCOEvaluator
from trainkit.evaluation.evaluator import (
    DatasetEvaluator,
    DatasetEvaluators,
    inference_context,
    inference_on_dataset,
)
from trainkit.evaluation.lvis_evaluation import LVISEvaluator
from trainkit.evaluation.panoptic_evaluation import COCOPanopticEvaluator
from trainkit.evaluation.pascal_voc_evaluation import PascalVOCDetectionEvaluator
from trainkit.evaluation.rotated_coco_evaluation import RotatedCOCOEvaluator
from trainkit.evaluation.sem_seg_evaluation import SemSegEvaluator
from trainkit.evaluation.testing import print_csv_format, verify_results
from trainkit.evaluation.validation import loss_evaluation_context, validation_losses

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
