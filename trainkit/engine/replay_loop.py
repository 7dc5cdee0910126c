"""The steps of a replay: each step dealt to the ranks, trained, or run and diagnosed.

:class:`ReplayLoop` runs the steps that :func:`~trainkit.engine.step_replay.replay_failed_step`
prepared: the loader's micro-batches of each step, checked against the run's records and
handed to the ranks (micro-batch ``q`` of the one process is micro-batch ``q // W`` of rank
``q % W``); each step before the failing one with its update (the ranks' gradients averaged
as DDP does, the ``after_backward`` hooks, the optimizer and the LR scheduler hook's step);
then the failing step, without its update, into a :class:`ReplayReport`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainkit.checkpoint import unwrap_model
from trainkit.data.plans.step_records import RecordIds, StepRecords
from trainkit.engine.hooks import LRScheduler
from trainkit.engine.rank_replay import (
    RankLocalState,
    RankResult,
    ddp_average,
    gradient_norm,
    load_buffers,
    losses_of_batches,
    non_finite_terms,
    run_rank,
)
from trainkit.utils.errors import UsageError
from trainkit.utils.events import EventStorage

__all__ = ["BadRecord", "ReplayError", "ReplayLoop", "ReplayReport"]

# What a report lists of a long list (records, parameters) before "... and N more".
_SHOWN = 5


class ReplayError(UsageError):
    """A failing step's folder (or the run it points to) cannot be replayed as given."""


@dataclass
class BadRecord:
    """A record of a bad micro-batch that fails on its own.

    Attributes:
        rank, micro_batch: where the run had it.
        record_id: its printable id (``DATASET[i] image_id=...``).
        terms: the loss terms that are not finite, or the exception's type and message.
        losses: its loss terms (empty when it raised).
    """

    rank: int
    micro_batch: int
    record_id: str
    terms: list[str]
    losses: dict[str, float] = field(default_factory=dict)


@dataclass
class ReplayReport:
    """What the replay of a failing step found.

    Attributes:
        iteration: the failing step.
        checkpoint: the checkpoint the replay started from (``""``: none, from iteration 0).
        replayed: the steps run before it, with their updates.
        losses: ``{(rank, micro_batch): loss terms}`` of the failing step.
        bad_slots: the ``(rank, micro_batch)`` whose losses are not finite or that raised.
        bad_records: the records of the bad micro-batches that fail alone.
        errors: ``{(rank, micro_batch): "Type: message"}`` of micro-batches that raised.
        grad_norms: each rank's gradient norm, then the averaged one (``"all"``).
        non_finite_grads: parameters whose averaged gradient is not finite.
        weights: the model's state before the failing step (rank 0's buffers).
        non_finite_weights: the entries of ``weights`` that are not finite.
        records_tried: the records of the bad micro-batches that were run alone.
    """

    iteration: int
    checkpoint: str
    replayed: range
    losses: dict[tuple[int, int], dict[str, float]] = field(default_factory=dict)
    bad_slots: list[tuple[int, int]] = field(default_factory=list)
    bad_records: list[BadRecord] = field(default_factory=list)
    errors: dict[tuple[int, int], str] = field(default_factory=dict)
    grad_norms: dict[str, float] = field(default_factory=dict)
    non_finite_grads: list[str] = field(default_factory=list)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    non_finite_weights: list[str] = field(default_factory=list)
    records_tried: int = 0

    @property
    def reproduced(self) -> bool:
        """Whether the failing step failed again (a non-finite loss, or an exception)."""
        return bool(self.bad_slots)

    def lines(self) -> list[str]:
        """Return the report as lines of text (what ``tools/replay_step.py`` prints)."""
        start = f"from {os.path.basename(self.checkpoint)}" if self.checkpoint else "from scratch"
        out = [
            f"Replayed steps {self.replayed.start}..{self.replayed.stop - 1} {start}"
            if self.replayed
            else f"Started {start}",
            f"Step {self.iteration}: "
            + ("the failure is reproduced" if self.reproduced else "did NOT fail in the replay"),
        ]
        for (rank, micro), losses in sorted(self.losses.items()):
            bad = " <- not finite" if (rank, micro) in self.bad_slots else ""
            terms = ", ".join(f"{k}={v:.6g}" for k, v in losses.items())
            out.append(f"  rank {rank} micro-batch {micro}: {terms}{bad}")
        for (rank, micro), error in sorted(self.errors.items()):
            out.append(f"  rank {rank} micro-batch {micro} raised {error}")
        out += self._record_lines()
        if self.non_finite_weights:
            out.append(
                f"  non-finite weights before step {self.iteration} in "
                f"{len(self.non_finite_weights)} tensor(s): {_first(self.non_finite_weights)}"
            )
        norms = ", ".join(f"{k}: {v:.6g}" for k, v in self.grad_norms.items())
        out.append(f"  gradient norms (averaged over ranks as DDP does: 'all'): {norms}")
        if self.non_finite_grads:
            out.append(
                f"  non-finite gradients in {len(self.non_finite_grads)} parameter(s): "
                f"{_first(self.non_finite_grads)}"
            )
        return out

    def _record_lines(self) -> list[str]:
        lines = [
            f"  bad record: {record.record_id} (rank {record.rank} micro-batch "
            f"{record.micro_batch}): {', '.join(record.terms)}"
            for record in self.bad_records
        ]
        if len(self.bad_records) < max(self.records_tried, 2):
            return lines
        # Every record fails: the model does, not the data. Say so rather than list them all.
        where = (
            f"its weights are not finite before step {self.iteration} (below)"
            if self.non_finite_weights
            else "its weights are finite, so look at the learning rate and the steps before"
        )
        summary = (
            f"  every one of the {self.records_tried} records of the bad micro-batch(es) "
            f"fails alone: the model fails, not a record; {where}"
        )
        shown = lines[:_SHOWN]
        if len(lines) > _SHOWN:
            shown.append(f"  ... and {len(lines) - _SHOWN} more bad records")
        return [summary, *shown]


def _first(names: list[str]) -> str:
    more = len(names) - _SHOWN
    return ", ".join(names[:_SHOWN]) + (f" and {more} more" if more > 0 else "")


class ReplayLoop:
    """Run a replay's steps on a trainer built and loaded for it (see the module docstring).

    Args:
        trainer: the ``DefaultTrainer`` (subclass) of one process, its checkpoint loaded.
        ranks: each rank's RNG states and buffers.
        ids: printable record ids.
        report: filled by :meth:`run`.
        log: where progress lines go.
    """

    def __init__(
        self,
        trainer: Any,
        ranks: list[RankLocalState],
        ids: RecordIds,
        report: ReplayReport,
        log: Callable[[str], None],
    ) -> None:
        self.trainer, self.ranks, self.ids, self.report, self.log = trainer, ranks, ids, report, log
        self.step = trainer._trainer
        self.model = unwrap_model(self.step.model)
        self.named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named]
        self.loader = trainer.data_loader
        self.lr_hook = next((h for h in trainer.hooks if isinstance(h, LRScheduler)), None)

    def run(self, planned: list[StepRecords]) -> None:
        """Run the steps of ``planned`` (the run's records from the start to the failing step)."""
        trainer = self.trainer
        iteration = self.report.iteration
        batches_iter = iter(self.loader)
        with EventStorage(planned[0].step) as trainer.storage:
            trainer.iter = trainer.start_iter = planned[0].step
            trainer.max_iter = trainer.cfg.SOLVER.MAX_ITER
            if self.lr_hook is not None:
                self.lr_hook.before_train()
            for records in planned:
                trainer.iter = trainer.storage.iter = records.step
                slots = self._next_slots(batches_iter, records)
                if records.step < iteration:
                    self._train_step(records.step, slots)
                    continue
                self.report.weights = {
                    k: v.detach().clone() for k, v in self.model.state_dict().items()
                }
                self._failing_step(records, slots)

    def _next_slots(self, batches_iter: Any, records: StepRecords) -> list[list[Any]]:
        """Each rank's micro-batches of the step, checked against the run's records."""
        w, k = records.world_size, records.accumulate_steps
        slots: list[list[Any]] = [[None] * k for _ in range(w)]
        for q in range(w * k):
            batch = next(batches_iter)
            rank, micro = q % w, q // w
            expected = [position for _, position in records.records(rank, micro)]
            if list(self.loader.last_batch_positions) != expected:
                raise ReplayError(
                    f"step {records.step}: the replay's loader gave other records to rank "
                    f"{rank} micro-batch {micro} than the run's plan; the trainer class or "
                    "the datasets differ from the run's (see --trainer)."
                )
            slots[rank][micro] = batch
        return slots

    def _run_ranks(self, slots: list[list[Any]], *, catch: bool) -> list[RankResult]:
        results = []
        for rank, local in enumerate(self.ranks):
            with local.active(self.model):
                results.append(run_rank(self.step, slots[rank], self.params, catch=catch))
        # The model holds rank 0's buffers, the ones its checkpoint saves.
        if self.ranks[0].buffers is not None:
            load_buffers(self.model, self.ranks[0].buffers)
        return results

    def _train_step(self, iteration: int, slots: list[list[Any]]) -> None:
        results = self._run_ranks(slots, catch=False)
        for rank, result in enumerate(results):
            for micro, losses in enumerate(result.losses):
                if non_finite_terms(losses):
                    raise ReplayError(
                        f"the replay's step {iteration} (before the failing step "
                        f"{self.report.iteration}) has a non-finite loss on rank {rank} "
                        f"micro-batch {micro}: {losses}; the run did not. The model is not "
                        "deterministic here (see docs/troubleshooting.md)."
                    )
        for param, grad in zip(self.params, ddp_average([r.gradients for r in results])):
            param.grad = grad
        self.step.after_backward()
        self.step.optimizer_step()
        if self.lr_hook is not None:
            self.lr_hook.after_step()
        self.log(f"replayed step {iteration}")

    def _failing_step(self, records: StepRecords, slots: list[list[Any]]) -> None:
        report = self.report
        results = self._run_ranks(slots, catch=True)
        for rank, result in enumerate(results):
            for micro, losses in enumerate(result.losses):
                report.losses[(rank, micro)] = losses
                if non_finite_terms(losses):
                    report.bad_slots.append((rank, micro))
            if result.error is not None:
                micro, error = result.error
                report.errors[(rank, micro)] = f"{type(error).__name__}: {error}"
                report.bad_slots.append((rank, micro))
            report.grad_norms[f"rank {rank}"] = gradient_norm(result.gradients)
        averaged = ddp_average([r.gradients for r in results])
        report.grad_norms["all"] = gradient_norm(averaged)
        report.non_finite_grads = [
            name
            for (name, _), g in zip(self.named, averaged)
            if g is not None and not bool(torch.isfinite(g).all())
        ]
        report.non_finite_weights = [
            name
            for name, value in report.weights.items()
            if value.is_floating_point() and not bool(torch.isfinite(value).all())
        ]
        for rank, micro in report.bad_slots:
            self._find_bad_records(records, rank, micro, slots[rank][micro])

    def _find_bad_records(self, records: StepRecords, rank: int, micro: int, batch: Any) -> None:
        """Run each record of a bad micro-batch alone; name those that fail alone.

        If every record fails alone in the same way (a model that cannot run one record,
        such as BatchNorm1d in training mode), the micro-batch is run without each record
        instead: a record is bad if the batch without it does not fail.
        """
        if not isinstance(batch, list):
            return  # not a list of records: it cannot be split
        self.report.records_tried += len(batch)
        with self.ranks[rank].active(self.model):
            found = losses_of_batches(self.step, [[record] for record in batch])
            kinds = {type(result) for result in found}
            leave_one_out = (
                len(batch) > 1 and len(kinds) == 1 and isinstance(found[0], BaseException)
            )
            if leave_one_out:
                without = [batch[:i] + batch[i + 1 :] for i in range(len(batch))]
                found = losses_of_batches(self.step, without)
        if self.ranks[0].buffers is not None:
            load_buffers(self.model, self.ranks[0].buffers)
        whole = self.report.losses.get((rank, micro), {})
        for (index, _), result in zip(records.records(rank, micro), found):
            if leave_one_out:
                # Bad if the batch is fine without it: the whole batch's failure is its.
                fine = not isinstance(result, BaseException) and not non_finite_terms(result)
                error = self.report.errors.get((rank, micro))
                terms = ([error] if error else non_finite_terms(whole)) if fine else []
                losses = {}
            elif isinstance(result, BaseException):
                terms, losses = [f"{type(result).__name__}: {result}"], {}
            else:
                terms, losses = non_finite_terms(result), result
            if terms:
                self.report.bad_records.append(
                    BadRecord(rank, micro, self.ids(index), terms, losses)
                )
