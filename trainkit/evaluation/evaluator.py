"""Evaluator interface and the distributed inference loop that feeds it."""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from typing_extensions import override

from trainkit.utils import comm
from trainkit.utils.logger import log_every_n_seconds

__all__ = ["DatasetEvaluator", "DatasetEvaluators", "inference_context", "inference_on_dataset"]

logger = logging.getLogger(__name__)

# The first few iterations pay for lazy initialisation (cudnn autotuning, allocator
# growth, worker start-up) and would skew the per-iteration timings.
_NUM_WARMUP_ITERS = 5


class DatasetEvaluator:
    """Accumulate a model's outputs over a dataset and compute metrics at the end.

    ``inference_on_dataset`` calls :meth:`reset` once, :meth:`process` for every batch on
    every rank, then :meth:`evaluate` on every rank. In a distributed job, ``evaluate``
    gathers the per-rank state itself (e.g. with :func:`trainkit.utils.comm.gather`) and
    returns the results on rank 0; other ranks may return ``None`` or ``{}``.
    """

    def reset(self) -> None:
        """Clear the state accumulated by earlier :meth:`process` calls."""

    def process(self, inputs: Any, outputs: Any) -> None:
        """Accumulate one batch.

        Args:
            inputs: the batch given to the model.
            outputs: the model's return value for it.
        """

    def evaluate(self) -> dict[str, Any] | None:
        """Return ``{task: {metric: value}}`` (on rank 0) from the accumulated state.

        Collective:
            Implementations that gather per-rank state are collectives: every rank calls it.
        """
        return None


class DatasetEvaluators(DatasetEvaluator):
    """Run several evaluators as one; their result dicts are merged."""

    def __init__(self, evaluators: Iterable[DatasetEvaluator]) -> None:
        """Wrap ``evaluators`` (order is kept)."""
        super().__init__()
        self._evaluators = list(evaluators)

    @override
    def reset(self) -> None:
        for evaluator in self._evaluators:
            evaluator.reset()

    @override
    def process(self, inputs: Any, outputs: Any) -> None:
        for evaluator in self._evaluators:
            evaluator.process(inputs, outputs)

    def evaluate(self) -> dict[str, Any]:
        """Merge the evaluators' results.

        Raises:
            KeyError: If two evaluators report the same top-level key.
        """
        results: dict[str, Any] = {}
        for evaluator in self._evaluators:
            result = evaluator.evaluate()  # every rank calls it: it may be a collective
            if comm.is_main_process() and result is not None:
                if clashes := sorted(results.keys() & result.keys()):
                    raise KeyError(
                        f"Evaluators {self._evaluators} both report results under "
                        f"{clashes[0]!r}; give them distinct task names."
                    )
                results.update(result)
        return results


@contextlib.contextmanager
def inference_context(model: nn.Module) -> Iterator[None]:
    """Put ``model`` in eval mode inside the block; restore its mode after, also on an error."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def inference_on_dataset(
    model: nn.Module | Any,
    data_loader: Iterable[Any],
    evaluator: DatasetEvaluator | list[DatasetEvaluator] | None,
) -> dict[str, Any]:
    """Run ``model`` on every batch of ``data_loader`` and evaluate the outputs.

    Runs under ``torch.no_grad()`` with the model in eval mode (:func:`inference_context`),
    and logs throughput, excluding the first few warm-up iterations from the timings.

    Args:
        model: an ``nn.Module`` or any callable taking a batch.
        data_loader: this rank's share of the dataset, usually from ``build_test_loader``.
        evaluator: an evaluator, a list of them, or ``None`` to only run the model.

    Returns:
        The evaluator's results on rank 0; ``{}`` where it returned ``None``.

    Collective:
        ``evaluator.evaluate()`` runs on every rank and typically gathers; call this on
        every rank, never from a rank-conditional branch.
    """
    if evaluator is None or isinstance(evaluator, (list, tuple)):
        evaluator = DatasetEvaluators(evaluator or [])
    try:
        num_batches: int | None = len(data_loader)  # type: ignore[arg-type]
    except TypeError:  # an IterableDataset loader without __len__
        num_batches = None
    world_size = comm.get_world_size()
    logger.info(
        "Start inference on %s batches on %d processes",
        num_batches if num_batches is not None else "an unknown number of",
        world_size,
    )
    evaluator.reset()
    with contextlib.ExitStack() as stack:
        if isinstance(model, nn.Module):
            stack.enter_context(inference_context(model))
        stack.enter_context(torch.no_grad())
        timings = _run_batches(model, data_loader, evaluator, num_batches)
    start_s, num_timed, data_s, compute_s, eval_s = timings
    total_s = time.perf_counter() - start_s
    per_iter = max(num_timed, 1)
    logger.info(
        "Total inference time: %s (%.6f s / iter per device, on %d devices); pure compute "
        "%.6f s / iter, data %.6f s / iter, evaluator %.6f s / iter",
        datetime.timedelta(seconds=int(total_s)),
        total_s / per_iter,
        world_size,
        compute_s / per_iter,
        data_s / per_iter,
        eval_s / per_iter,
    )
    # trainkit's test loaders skip (never replace) records that fail to map and count them.
    if skipped := getattr(data_loader, "num_skipped_records", None):
        logger.warning(
            "%d records of this rank's share could not be mapped and are left out of the "
            "evaluation (each is named in a warning above); the results cover the others.",
            skipped,
        )
    results = evaluator.evaluate()
    # Non-main ranks often return None; {} spares every caller a None check.
    return {} if results is None else results


def _run_batches(
    model: Any, data_loader: Iterable[Any], evaluator: DatasetEvaluator, num_batches: int | None
) -> tuple[float, int, float, float, float]:
    """Feed every batch to ``model`` and ``evaluator``.

    Returns:
        When the timings started, how many batches they cover, and the seconds spent
        waiting for data, in the model and in the evaluator.
    """
    num_warmup = min(_NUM_WARMUP_ITERS, num_batches - 1) if num_batches else _NUM_WARMUP_ITERS
    start_s = data_start = time.perf_counter()
    num_timed, data_s, compute_s, eval_s = 0, 0.0, 0.0, 0.0
    for idx, inputs in enumerate(data_loader):
        if idx == num_warmup:  # restart every clock: everything before this was warm-up
            start_s, num_timed, data_s, compute_s, eval_s = time.perf_counter(), 0, 0.0, 0.0, 0.0
        compute_start = time.perf_counter()
        data_s += compute_start - data_start
        outputs = model(inputs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # CUDA is asynchronous; otherwise eval time absorbs it
        eval_start = time.perf_counter()
        compute_s += eval_start - compute_start
        evaluator.process(inputs, outputs)
        now = time.perf_counter()
        eval_s += now - eval_start
        num_timed += 1
        if num_batches is not None and idx >= num_warmup * 2:
            seconds_per_iter = (now - start_s) / num_timed
            eta = datetime.timedelta(seconds=int(seconds_per_iter * (num_batches - idx - 1)))
            log_every_n_seconds(
                logging.INFO,
                f"Inference done {idx + 1}/{num_batches}. {seconds_per_iter:.4f} s/iter. ETA={eta}",
                n=5.0,
                name=__name__,
            )
        data_start = time.perf_counter()
    return start_s, num_timed, data_s, compute_s, eval_s
