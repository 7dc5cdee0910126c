"""Evaluators, the distributed inference loop, and result reporting and checking."""

from trainkit.evaluation.classification_evaluation import ClassificationEvaluator
from trainkit.evaluation.evaluator import (
    DatasetEvaluator,
    DatasetEvaluators,
    inference_context,
    inference_on_dataset,
)
from trainkit.evaluation.testing import print_csv_format, verify_results
from trainkit.evaluation.validation import loss_evaluation_context, validation_losses

__all__ = [
    "ClassificationEvaluator",
    "DatasetEvaluator",
    "DatasetEvaluators",
    "inference_context",
    "inference_on_dataset",
    "loss_evaluation_context",
    "print_csv_format",
    "validation_losses",
    "verify_results",
]
