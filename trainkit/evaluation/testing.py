"""Evaluating a config's test sets, logging the results for people and checking them."""

from __future__ import annotations

import logging
import math
import pprint
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from trainkit.config import CfgNode, ConfigError
from trainkit.evaluation.evaluator import DatasetEvaluator, inference_on_dataset
from trainkit.evaluation.validation import validation_losses
from trainkit.utils import comm

__all__ = [
    "evaluate_test_sets",
    "print_csv_format",
    "validation_losses_of_test_sets",
    "verify_results",
]

logger = logging.getLogger(__name__)


def print_csv_format(results: Mapping[str, Any]) -> None:
    """Log ``{task: {metric: value}}`` results as comma-separated lines easy to paste into a sheet.

    Metrics whose name contains ``"-"`` (per-category breakdowns, by detectron2's convention)
    are left out. Lines start with ``copypaste:``. Despite the name nothing is printed; the
    lines go to this module's logger.

    Args:
        results: the dict returned by ``inference_on_dataset``.

    Raises:
        TypeError: If ``results`` is not a mapping.
    """
    if not isinstance(results, Mapping):
        raise TypeError(f"results must be a dict of {{task: {{metric: value}}}}, got {results!r}")
    for task, res in results.items():
        if isinstance(res, Mapping):
            important = [(k, v) for k, v in res.items() if "-" not in k]
            logger.info("copypaste: Task: %s", task)
            logger.info("copypaste: %s", ",".join(str(k) for k, _ in important))
            logger.info("copypaste: %s", ",".join(_format_value(v) for _, v in important))
        else:
            logger.info("copypaste: %s=%s", task, res)


def _format_value(value: Any) -> str:
    try:
        return f"{float(value):.4f}"
    except (TypeError, ValueError):
        return str(value)


def _results_table(results: Mapping[str, Any]) -> str:
    """``{task: {metric: value}}`` as aligned lines ``task  metric  value`` under a header.

    Each column is as wide as its longest entry and columns are two spaces apart, so a long
    metric name never runs into its value. Empty when there is no metric.
    """
    rows = [
        (str(task), str(metric), _format_value(value))
        for task, metrics in results.items()
        if isinstance(metrics, Mapping)
        for metric, value in metrics.items()
    ]
    if not rows:
        return ""
    rows.insert(0, ("task", "metric", "value"))
    task_width = max(len(task) for task, _, _ in rows)
    metric_width = max(len(metric) for _, metric, _ in rows)
    return "\n".join(
        f"  {task:<{task_width}}  {metric:<{metric_width}}  {value}" for task, metric, value in rows
    )


def verify_results(cfg: CfgNode, results: Mapping[str, Any]) -> bool:
    """Log ``results`` as a table, then check them against ``cfg.TEST.EXPECTED_RESULTS``.

    Each entry is ``[task, metric, expected, tolerance]``; a result passes when it exists,
    is finite, and ``abs(actual - expected) <= tolerance``. Call it on rank 0 only (other
    ranks have no results).

    Args:
        cfg: the config.
        results: ``{task: {metric: value}}`` from evaluation.

    Returns:
        True (also when nothing is expected).

    Raises:
        ConfigError: A ``ValueError``: if an entry of TEST.EXPECTED_RESULTS is not
            ``[task, metric, value, tolerance]``.
        RuntimeError: If any expected result is missing or out of tolerance; the message
            lists each failure (detectron2 exits the process here instead).
    """
    if table := _results_table(results):
        logger.info("Final results:\n%s", table)
    failures = []
    for entry in cfg.TEST.EXPECTED_RESULTS:
        if not isinstance(entry, (list, tuple)) or len(entry) != 4:
            raise ConfigError(
                f"TEST.EXPECTED_RESULTS entry {entry!r} must be [task, metric, value, tolerance],"
                ' e.g. ["classification", "top1", 90.0, 0.5]; fix the entry.'
            )
        task, metric, expected, tolerance = entry
        if not all(isinstance(v, (int, float)) for v in (expected, tolerance)):
            raise ConfigError(
                f"TEST.EXPECTED_RESULTS entry {entry!r}: the value and tolerance must be "
                "numbers; fix the entry."
            )
        task_results = results.get(task)
        actual = task_results.get(metric) if isinstance(task_results, Mapping) else None
        if actual is None:
            failures.append(f"{task}/{metric}: missing from the results")
        elif not math.isfinite(float(actual)):
            failures.append(f"{task}/{metric}: {actual} is not finite")
        elif abs(float(actual) - float(expected)) > float(tolerance):
            failures.append(f"{task}/{metric}: got {actual}, expected {expected} +- {tolerance}")
        else:
            logger.info(
                "Verified %s/%s: %s (expected %s +- %s)", task, metric, actual, expected, tolerance
            )
    if failures:
        logger.error("Result verification failed; actual results:\n%s", pprint.pformat(results))
        raise RuntimeError(
            "Results do not match TEST.EXPECTED_RESULTS:\n  " + "\n  ".join(failures)
        )
    return True


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
