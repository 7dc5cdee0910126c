"""The work of ``DefaultTrainer.test`` (detectron2's API), and ``TEST.VAL_LOSS``'s losses."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch import nn

from trainkit.config import CfgNode
from trainkit.evaluation import (
    DatasetEvaluator,
    inference_on_dataset,
    print_csv_format,
    validation_losses,
)
from trainkit.utils import comm

__all__ = ["evaluate_test_sets", "validation_losses_of_test_sets"]

logger = logging.getLogger(__name__)


def evaluate_test_sets(
    cfg: CfgNode,
    model: nn.Module,
    evaluators: DatasetEvaluator | list[DatasetEvaluator] | None,
    build_test_loader: Callable[[CfgNode, str], Any],
    build_evaluator: Callable[[CfgNode, str], DatasetEvaluator],
) -> dict[str, Any]:
    """Evaluate ``model`` on every dataset in ``DATASETS.TEST``: ``DefaultTrainer.test``.

    ``build_test_loader`` and ``build_evaluator`` are the trainer class's classmethods; the
    other arguments, the result and the errors are ``DefaultTrainer.test``'s.
    """
    names = list(cfg.DATASETS.TEST)
    if isinstance(evaluators, DatasetEvaluator):
        evaluators = [evaluators]
    if evaluators is not None and len(evaluators) != len(names):
        raise ValueError(
            f"{len(evaluators)} evaluators given for {len(names)} test datasets {names}"
        )
    results: dict[str, Any] = {}
    for idx, name in enumerate(names):
        data_loader = build_test_loader(cfg, name)
        if evaluators is not None:
            evaluator = evaluators[idx]
        else:
            try:
                evaluator = build_evaluator(cfg, name)
            except NotImplementedError as e:
                logger.warning("%s Skipping evaluation of %s.", e, name)
                results[name] = {}
                continue
        results[name] = inference_on_dataset(model, data_loader, evaluator) or {}
        if comm.is_main_process() and results[name]:
            logger.info("Evaluation results for %s in csv format:", name)
            print_csv_format(results[name])
    return next(iter(results.values())) if len(results) == 1 else results


def validation_losses_of_test_sets(
    cfg: CfgNode,
    build_test_loader: Callable[[CfgNode, str], Any],
    model: nn.Module,
    loaders: dict[str, Any],
) -> dict[str, Any]:
    """``{loss: value}`` for one test set, ``{dataset: {loss: value}}`` for several.

    Args:
        cfg: its ``DATASETS.TEST`` are measured.
        build_test_loader: builds a test loader (the trainer class's classmethod).
        model: the model whose training-mode losses are measured.
        loaders: test loaders by dataset name, filled on first use and reused (each pass
            sees every record once).

    Collective:
        ``validation_losses`` on every rank, for every test set.
    """
    names = list(cfg.DATASETS.TEST)
    losses: dict[str, Any] = {}
    for name in names:
        if name not in loaders:
            loaders[name] = build_test_loader(cfg, name)
        losses[name] = validation_losses(model, loaders[name])
    return losses[names[0]] if len(names) == 1 else losses  # {} without test sets
