"""Top-k accuracy of a classifier over a dataset, gathered across ranks."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from trainkit.evaluation.evaluator import DatasetEvaluator
from trainkit.utils import comm

__all__ = ["ClassificationEvaluator"]

logger = logging.getLogger(__name__)


class ClassificationEvaluator(DatasetEvaluator):
    """Count top-1/top-k hits of logits against each input's ``"label"``.

    ``process`` takes the batch of mapped inputs (dicts with ``"label"``) and the model's
    eval-mode output (logits ``[N, C]``). ``evaluate`` sums the counts of every rank and
    returns ``{"classification": {"top1": %, "top5": %}}`` on rank 0 (``{}`` elsewhere).
    A k larger than the number of classes counts every sample as a hit, as the definition
    says.
    """

    def __init__(
        self,
        dataset_name: str | None = None,
        distributed: bool = True,
        topk: Sequence[int] = (1, 5),
    ) -> None:
        """Create the evaluator.

        Args:
            dataset_name: for log messages.
            distributed: sum counts over all ranks; False evaluates this rank's share only.
            topk: the k of each reported top-k accuracy.
        """
        if not topk or min(topk) < 1:
            raise ValueError(f"topk must be positive integers, got {list(topk)}")
        self._dataset_name = dataset_name
        self._distributed = distributed
        self._topk = tuple(int(k) for k in topk)
        self.reset()

    def reset(self) -> None:
        self._hits = {k: 0 for k in self._topk}
        self._count = 0

    def process(self, inputs: list[dict[str, Any]], outputs: torch.Tensor) -> None:
        logits = outputs.detach().float().cpu()
        labels = torch.tensor([int(x["label"]) for x in inputs])
        if logits.ndim != 2 or logits.shape[0] != labels.shape[0]:
            raise ValueError(
                f"ClassificationEvaluator expects logits of shape [{len(labels)}, num_classes], "
                f"got {tuple(logits.shape)}"
            )
        max_k = min(max(self._topk), logits.shape[1])
        correct = logits.topk(max_k, dim=1).indices == labels[:, None]
        for k in self._topk:
            self._hits[k] += int(correct[:, : min(k, max_k)].any(dim=1).sum())
        self._count += len(labels)

    def evaluate(self) -> dict[str, Any]:
        """Return the accuracies in percent (rank 0), gathering every rank's counts.

        Collective:
            ``gather`` over all ranks when ``distributed``.
        """
        parts = [(self._hits, self._count)]
        if self._distributed:
            parts = comm.gather(parts[0])
            if not comm.is_main_process():
                return {}
        total = sum(count for _, count in parts)
        if total == 0:
            logger.warning("ClassificationEvaluator on %s saw no samples", self._dataset_name)
            return {}
        top = {f"top{k}": 100.0 * sum(h[k] for h, _ in parts) / total for k in self._topk}
        return {"classification": top}
