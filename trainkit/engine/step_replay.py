"""Replaying a captured failing step on one process: the model at that step, then the step.

:func:`replay_failed_step` reads a folder that
:class:`~trainkit.engine.failed_steps.FailedStepCapture` wrote and rebuilds the step with the
run's trainer class (its ``build_model``, ``build_optimizer``, ``build_lr_scheduler``,
``build_train_loader``, checkpointer and step trainer):

1. the config of the run, with one process doing the work of all ``W``: its loader deals
   every step to ``W x k`` micro-batches (``SOLVER.ACCUMULATE_STEPS`` set to ``W x k``), so
   micro-batch ``q`` is micro-batch ``q // W`` of rank ``q % W``, mapped through the same
   mapper at the same global positions (the same augmentations); each is checked against
   :func:`~trainkit.data.step_records.steps_records` of the run's ``W x k``;
2. the newest checkpoint before the step (weights, optimizer, LR schedule, loader position,
   every rank's RNG states);
3. every step from there to the failing one: each rank's micro-batches
   (:func:`~trainkit.engine.rank_replay.run_rank`), the gradients averaged as DDP does
   (:func:`~trainkit.engine.rank_replay.ddp_average`), the ``after_backward`` hooks, the
   optimizer step and the LR scheduler hook's step;
4. the failing step itself, without its update: every micro-batch's loss terms, the records
   of a bad micro-batch run alone (which record, which term), the gradient norms.

Hooks other than the LR scheduler's ``after_step`` do not run (PreciseBN, EMA, evaluation).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainkit.checkpoint import unwrap_model
from trainkit.config import CfgNode, get_cfg
from trainkit.data.step_records import RecordIds, StepRecords, build_train_plan, steps_records
from trainkit.engine.failed_steps import STEP_FILE, record_ids
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
from trainkit.engine.run_state import upgrade_run_state
from trainkit.utils.env import seed_all_rng
from trainkit.utils.errors import UsageError
from trainkit.utils.events import EventStorage

__all__ = [
    "BadRecord",
    "ReplayError",
    "ReplayReport",
    "load_trainer_class",
    "replay_config",
    "replay_failed_step",
]

logger = logging.getLogger(__name__)


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
        for record in self.bad_records:
            out.append(
                f"  bad record: {record.record_id} (rank {record.rank} micro-batch "
                f"{record.micro_batch}): {', '.join(record.terms)}"
            )
        norms = ", ".join(f"{k}: {v:.6g}" for k, v in self.grad_norms.items())
        out.append(f"  gradient norms (averaged over ranks as DDP does: 'all'): {norms}")
        if self.non_finite_grads:
            names = ", ".join(self.non_finite_grads[:5])
            more = len(self.non_finite_grads) - 5
            out.append(
                f"  non-finite gradients in {len(self.non_finite_grads)} parameter(s): {names}"
                + (f" and {more} more" if more > 0 else "")
            )
        return out


def load_trainer_class(spec: str) -> type:
    """Import the trainer class ``spec`` names: ``module:Class`` or ``path/to/file.py:Class``.

    A file is imported under another name than ``__main__``, so a training script's
    ``if __name__ == "__main__":`` part does not run.

    Raises:
        ReplayError: If the module, file or class cannot be found.
    """
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ReplayError(f"--trainer {spec!r}: give module:Class or path/to/script.py:Class")
    try:
        if where.endswith(".py"):
            if not os.path.isfile(where):
                raise ReplayError(f"--trainer {spec!r}: no file {where}; give its path")
            module_name = "_trainkit_replay_" + os.path.splitext(os.path.basename(where))[0]
            module_spec = importlib.util.spec_from_file_location(module_name, where)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ImportError as e:
        raise ReplayError(f"--trainer {spec!r}: cannot import {where} ({e})") from e
    found: Any = module
    for part in name.split("."):
        found = getattr(found, part, None)
    if not isinstance(found, type):
        raise ReplayError(f"--trainer {spec!r}: {where} has no class {name}")
    return found


def _read_step(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, STEP_FILE)
    if not os.path.isfile(path):
        raise ReplayError(
            f"{folder} holds no {STEP_FILE}; give a folder OUTPUT_DIR/failed_steps/iter_<N> "
            "that a failed run wrote."
        )
    with open(path) as f:
        return json.load(f)


def replay_config(folder: str, step: dict[str, Any], output_dir: str) -> CfgNode:
    """Return the run's config for a replay on one process (see the module docstring).

    The one process gets the whole step: ``SOLVER.ACCUMULATE_STEPS`` is ``W x k`` and no
    rescaling happens. Loader workers, the watchdog, trackers and ``MODEL.WEIGHTS`` are off;
    a CUDA run replays on the CPU when this machine has no GPU.
    """
    cfg = get_cfg()
    # Keys a project added to the schema (add_*_config in its script) load as they are.
    cfg.set_new_allowed(True)
    cfg.merge_from_file(os.path.join(folder, "config.yaml"))
    cfg.defrost()
    cfg.OUTPUT_DIR = output_dir
    cfg.SOLVER.ACCUMULATE_STEPS = step["world_size"] * step["accumulate_steps"]
    cfg.SOLVER.REFERENCE_WORLD_SIZE = 0
    cfg.DATALOADER.NUM_WORKERS = 0  # the same batches for any number of workers
    cfg.WATCHDOG_TIMEOUT_S = 0.0
    cfg.WRITERS = ("json",)
    cfg.MODEL.WEIGHTS = ""
    if cfg.MODEL.DEVICE.startswith("cuda") and not torch.cuda.is_available():
        logger.warning("The run used %s; this machine has no GPU: replaying on the CPU", "cuda")
        cfg.MODEL.DEVICE = "cpu"
    cfg.freeze()
    return cfg


def replay_failed_step(
    folder: str,
    trainer_class: type | None = None,
    *,
    checkpoint: str | None = None,
    output_dir: str | None = None,
    log: Callable[[str], None] = logger.info,
) -> ReplayReport:
    """Rebuild the failing step of ``folder`` on this process and run it (module docstring).

    Args:
        folder: ``OUTPUT_DIR/failed_steps/iter_<N>`` of a failed run.
        trainer_class: the ``DefaultTrainer`` (sub)class to build the parts with (default:
            the run's, recorded in the folder).
        checkpoint: start from this checkpoint instead of the newest one the run had.
        output_dir: where the replay's trainer may write (default: a temporary folder).
        log: where progress lines go.

    Returns:
        What the step did (:class:`ReplayReport`).

    Raises:
        ReplayError: If the folder, its run's checkpoint or the trainer cannot be used, or
            the replay goes another way than the run (other records, a failure before).
    """
    step = _read_step(folder)
    if trainer_class is None:
        trainer_class = load_trainer_class(step["trainer"])
    threads = torch.get_num_threads()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            return _replay(folder, step, trainer_class, checkpoint, output_dir or scratch, log)
    finally:
        torch.set_num_threads(threads)


def _replay(
    folder: str,
    step: dict[str, Any],
    trainer_class: type,
    checkpoint: str | None,
    output_dir: str,
    log: Callable[[str], None],
) -> ReplayReport:
    iteration, world_size = int(step["iteration"]), int(step["world_size"])
    cfg = replay_config(folder, step, output_dir)
    if not cfg.MODEL.DEVICE.startswith("cuda") and step.get("num_threads"):
        # CPU kernels may sum in another order with another number of threads.
        torch.set_num_threads(int(step["num_threads"]))
    # As default_setup seeds rank 0, whose initial weights DDP gives every rank.
    seed_all_rng(cfg.SEED)
    trainer = trainer_class(cfg)
    run_dir = os.path.dirname(os.path.dirname(os.path.abspath(folder)))
    if checkpoint is None and step["last_checkpoint"]:
        checkpoint = os.path.join(run_dir, step["last_checkpoint"])
    ranks, loader_state = _load_start(trainer, checkpoint or "", world_size)
    start = trainer.iter + 1 if checkpoint else 0
    if start > iteration:
        raise ReplayError(
            f"checkpoint {checkpoint} holds iteration {start - 1}, not before the failing "
            f"step {iteration}; give an older one with --checkpoint."
        )
    run_cfg = _run_config(cfg, step)
    records, plan = build_train_plan(run_cfg, world_size, dataset=trainer.data_loader.records)
    planned = steps_records(plan, iteration - start + 1, state=loader_state, first_step=start)
    report = ReplayReport(iteration, checkpoint or "", range(start, iteration))
    _Replay(trainer, ranks, record_ids(run_cfg, records), report, log).run(planned)
    return report


def _run_config(cfg: CfgNode, step: dict[str, Any]) -> CfgNode:
    """The replay's config with the run's ``SOLVER.ACCUMULATE_STEPS`` (for the run's plan)."""
    run_cfg = cfg.clone()
    run_cfg.defrost()
    run_cfg.SOLVER.ACCUMULATE_STEPS = step["accumulate_steps"]
    run_cfg.freeze()
    return run_cfg


def _load_start(
    trainer: Any, checkpoint: str, world_size: int
) -> tuple[list[RankLocalState], dict[str, Any] | None]:
    """Load ``checkpoint`` into ``trainer``; return each rank's local state and the position."""
    ranks = [RankLocalState() for _ in range(world_size)]
    if not checkpoint:
        logger.warning("No checkpoint: replaying from iteration 0 with the model's initialisation")
        return ranks, trainer.data_loader.state_dict()
    if not os.path.isfile(checkpoint):
        raise ReplayError(f"checkpoint {checkpoint} not found; give one with --checkpoint")
    extra = trainer.checkpointer.load(checkpoint, checkpointables=[])
    state = upgrade_run_state(extra)
    # The loop, the step (optimizer, gradient scaler) and the hooks (the LR schedule).
    trainer.load_state_dict(state)
    saved = state.get("ranks") or [{}]
    data = saved[0].get("data")
    if data is None:
        raise ReplayError(f"checkpoint {checkpoint} holds no loader position; give another")
    trainer.data_loader.load_state_dict(data)
    if state.get("world_size") == world_size and len(saved) == world_size:
        for rank, local in zip(ranks, saved):
            rank.rng = local.get("rng")
    else:
        logger.warning(
            "Checkpoint %s was written by %s processes, the failing job had %d: each rank's "
            "random ops (dropout) are not replayed exactly",
            checkpoint,
            state.get("world_size"),
            world_size,
        )
    return ranks, data


class _Replay:
    """The steps of one replay (see :func:`replay_failed_step`)."""

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
