"""Evaluators, the distributed inference loop, and result reporting and checking."""

from trainkit.evaluation.classification_evaluation import ClassificationEvaluator
from trainkit.evaluation.evaluator import (
    DatasetEvaluator,
    DatasetEvaluators,
    inference_context,
    inference_on_dataset,
)
from trainkit.evaluation.testing import print_csv_format, verify_results

__all__ = [
    "ClassificationEvaluator",
    "DatasetEvaluator",
    "DatasetEvaluators",
    "inference_context",
    "inference_on_dataset",
    "print_csv_format",
    "verify_results",
]
