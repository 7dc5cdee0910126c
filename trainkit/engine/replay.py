"""Replaying a captured failing step on one process, with the run's own trainer and step.

:func:`replay_failed_step` rebuilds the run of a folder :class:`~trainkit.engine.failed_steps.
FailedStepCapture` wrote with its trainer class: the same ``build_*`` parts, hooks, loop and
``SimpleTrainer.accumulate``, from the newest checkpoint before the failing step (weights,
optimizer, schedule, loader position, every rank's RNG states), and diagnoses that step
(:class:`ReplayReport`). One process does the work of all ``W`` ranks: its loader deals each
step to ``W x k`` micro-batches (micro-batch ``q`` is micro-batch ``q // W`` of rank
``q % W``, at the same global positions), and the step's gradient combiner is
:class:`~trainkit.engine.gradients.EmulatedRanks`. Loader workers, the watchdog, trackers,
evaluation (so PreciseBN at the run's evaluation periods too), early stopping and
``MODEL.WEIGHTS`` are off; checkpoints go to a scratch folder; each step's loss is checked.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from typing_extensions import override

from trainkit.checkpoint import unwrap_model
from trainkit.config import CfgNode, get_cfg
from trainkit.engine.failed_steps import (
    ReplayError,
    failing_iteration,
    load_trainer_class,
    read_step_file,
)
from trainkit.engine.gradients import EmulatedRanks, copy_buffers, gradient_norm, load_buffers
from trainkit.engine.hook_base import HookBase, HookPriority
from trainkit.engine.run_state import continued_position, upgrade_run_state
from trainkit.engine.step_metrics import NonFiniteLossError
from trainkit.engine.trainer_base import TrainerBase
from trainkit.utils.env import seed_all_rng
from trainkit.utils.events import EventStorage

__all__ = ["BadRecord", "ReplayError", "ReplayReport", "replay_config", "replay_failed_step"]

logger = logging.getLogger(__name__)

_SHOWN = 5  # what a report lists of a long list (records, parameters) before "N more"


@dataclass
class BadRecord:
    """A record of a bad micro-batch that fails on its own: where the run had it, its id
    (``DATASET[i] image_id=...``), its loss terms that are not finite (or the exception's
    type and message) and its loss terms (empty when it raised)."""

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
        errors: ``{(rank, micro_batch): "Type: message"}`` of a micro-batch that raised.
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
        first, last = self.replayed.start, self.replayed.stop - 1
        steps = f"Replayed steps {first}..{last}" if self.replayed else "Started"
        verdict = "the failure is reproduced" if self.reproduced else "did NOT fail in the replay"
        out = [f"{steps} {start}", f"Step {self.iteration}: {verdict}"]
        for (rank, micro), losses in sorted(self.losses.items()):
            bad = " <- not finite" if (rank, micro) in self.bad_slots else ""
            terms = ", ".join(f"{k}={v:.6g}" for k, v in losses.items())
            out.append(f"  rank {rank} micro-batch {micro}: {terms}{bad}")
        for (rank, micro), error in sorted(self.errors.items()):
            out.append(f"  rank {rank} micro-batch {micro} raised {error}")
        out += self._record_lines()
        if self.non_finite_weights:
            weights = _listed(self.non_finite_weights, "tensor(s)")
            out.append(f"  non-finite weights before step {self.iteration} in {weights}")
        norms = ", ".join(f"{k}: {v:.6g}" for k, v in self.grad_norms.items())
        out.append(f"  gradient norms (averaged over ranks as DDP does: 'all'): {norms}")
        if self.non_finite_grads:
            grads = _listed(self.non_finite_grads, "parameter(s)")
            out.append(f"  non-finite gradients in {grads}")
        return out

    def _record_lines(self) -> list[str]:
        lines = [
            f"  bad record: {r.record_id} (rank {r.rank} micro-batch {r.micro_batch}): "
            + ", ".join(r.terms)
            for r in self.bad_records
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
        more = [f"  ... and {len(lines) - _SHOWN} more bad records"] if len(lines) > _SHOWN else []
        return [summary, *lines[:_SHOWN], *more]


def _listed(names: list[str], what: str) -> str:
    more = len(names) - _SHOWN
    listed = ", ".join(names[:_SHOWN]) + (f" and {more} more" if more > 0 else "")
    return f"{len(names)} {what}: {listed}"


def _floats(losses: dict[str, torch.Tensor]) -> dict[str, float]:
    return {name: float(value.float()) for name, value in losses.items()}


def _non_finite(values: dict[str, Any]) -> list[str]:
    """The names of the values (floats, or tensors of any shape) that are not all finite."""
    return [name for name, v in values.items() if not torch.isfinite(torch.as_tensor(v)).all()]


class _Probe(HookBase):
    """The replay's hook: checks and snapshots the failing step, stops after it."""

    priority = HookPriority.HIGHEST

    def __init__(self, report: ReplayReport, log: Callable[[str], None]) -> None:
        self._report, self._log = report, log
        self.position: dict[str, Any] | None = None  # the loader's, before the failing step

    @override
    def before_step(self) -> None:
        if self.trainer.iter != self._report.iteration:
            return
        self.position = self.trainer.loader_state_dict()
        model = unwrap_model(self.trainer.model)  # type: ignore[attr-defined]
        self._report.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

    @override
    def after_step(self) -> None:
        iteration = self.trainer.iter
        if iteration < self._report.iteration:
            self._log(f"replayed step {iteration}")
        else:
            self.trainer.request_stop("the replay ran the failing step")


def replay_config(folder: str, step: dict[str, Any], output_dir: str) -> CfgNode:
    """Return the run's config for a replay on one process (see the module docstring)."""
    cfg = get_cfg()
    # Keys a project added to the schema (add_*_config in its script) load as they are.
    cfg.set_new_allowed(True)
    cfg.merge_from_file(os.path.join(folder, "config.yaml"))
    cfg.defrost()
    cfg.OUTPUT_DIR = output_dir
    cfg.SOLVER.ACCUMULATE_STEPS = step["world_size"] * step["accumulate_steps"]
    cfg.SOLVER.REFERENCE_WORLD_SIZE = 0
    cfg.SOLVER.DEFERRED_CHECKS = False  # each step checked before its update
    cfg.SOLVER.CHECKPOINT_PERIOD = cfg.SOLVER.MAX_ITER + 1
    cfg.DATALOADER.NUM_WORKERS = 0  # the same batches for any number of workers
    cfg.DATASETS.TEST, cfg.TEST.EVAL_PERIOD, cfg.TEST.EARLY_STOP.METRIC = (), 0, ""
    cfg.WATCHDOG_TIMEOUT_S, cfg.WRITERS, cfg.MODEL.WEIGHTS = 0.0, ("json",), ""
    # The whole model on one process: a sharded run's checkpoint directory is read whole, and
    # the emulated ranks' gradients are summed as DDP's would be (up to summation order).
    cfg.MODEL.FSDP.ENABLED = False
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
        trainer_class: the ``DefaultTrainer`` (sub)class to build the run with (default:
            the run's, recorded in the folder).
        checkpoint: start from this checkpoint instead of the newest one the run had.
        output_dir: where the replay's trainer may write (default: a temporary folder); not
            the run's own ``OUTPUT_DIR``.
        log: where progress lines go.

    Returns:
        What the step did (:class:`ReplayReport`).

    Raises:
        ReplayError: If the folder, its run's checkpoint or the trainer cannot be used, or
            the replay goes another way than the run (other records, a failure before).
    """
    step = read_step_file(folder)
    if trainer_class is None:
        trainer_class = load_trainer_class(step["trainer"])
    run_dir = os.path.dirname(os.path.dirname(os.path.abspath(folder)))
    if output_dir and os.path.realpath(output_dir) == os.path.realpath(run_dir):
        raise ReplayError(
            f"{output_dir} is the failed run's OUTPUT_DIR: the replay's trainer would write over "
            "its checkpoints; give another folder (or none: a temporary one)."
        )
    if checkpoint is None and step["last_checkpoint"]:
        checkpoint = os.path.join(run_dir, step["last_checkpoint"])
    threads = torch.get_num_threads()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            cfg = replay_config(folder, step, output_dir or scratch)
            if not cfg.MODEL.DEVICE.startswith("cuda") and step.get("num_threads"):
                # CPU kernels may sum in another order with another number of threads.
                torch.set_num_threads(int(step["num_threads"]))
            return _replay(cfg, step, trainer_class, checkpoint or "", log)
    finally:
        torch.set_num_threads(threads)


def _replay(
    cfg: CfgNode,
    step: dict[str, Any],
    trainer_class: type,
    checkpoint: str,
    log: Callable[[str], None],
) -> ReplayReport:
    iteration, world_size = int(step["iteration"]), int(step["world_size"])
    seed_all_rng(cfg.SEED)  # as default_setup seeds rank 0, whose weights DDP gives every rank
    trainer = trainer_class(cfg)
    start, rngs = _load_start(trainer, checkpoint, world_size)
    if start > iteration:
        raise ReplayError(
            f"checkpoint {checkpoint} holds iteration {start - 1}, not before the failing "
            f"step {iteration}; give an older one with --checkpoint."
        )
    ranks = trainer._trainer.gradient_combiner = EmulatedRanks(trainer.model, rngs)
    report = ReplayReport(iteration, checkpoint, range(start, iteration))
    probe = _Probe(report, log)
    trainer.register_hooks([probe])
    loop_log = logging.getLogger(TrainerBase.__module__)
    # The failure is what the replay expects: its report says it, not the loop's traceback.
    loop_log.addFilter(quiet := lambda record: record.levelno < logging.ERROR)
    try:
        # The loop itself, not DefaultTrainer.train: nothing is captured or evaluated.
        TrainerBase.train(trainer, start, cfg.SOLVER.MAX_ITER)
    except Exception as e:
        failed_at = failing_iteration(e, trainer.iter)
        if failed_at < iteration:
            raise ReplayError(
                f"the replay's step {failed_at} (before the failing step {iteration}) failed "
                f"({type(e).__name__}: {e}); the run did not. The model is not deterministic "
                "here (see docs/troubleshooting.md)."
            ) from e
        if trainer.iter != iteration or not (
            isinstance(e, NonFiniteLossError) or e is trainer.step_error
        ):
            raise  # a hook's error, not the step's
    finally:
        loop_log.removeFilter(quiet)
    _check_records(trainer, step, iteration, probe.position)
    with EventStorage(iteration):  # the model may read it, as in the step
        _diagnose(trainer, ranks, step, report)
    return report


def _load_start(
    trainer: Any, checkpoint: str, world_size: int
) -> tuple[int, list[dict[str, Any] | None]]:
    """Load ``checkpoint`` into ``trainer``; return the first step and each rank's RNG states."""
    if not checkpoint:
        logger.warning("No checkpoint: replaying from iteration 0 with the model's initialisation")
        return 0, [None] * world_size
    if not os.path.exists(checkpoint):  # a file, or a sharded checkpoint's directory
        raise ReplayError(f"checkpoint {checkpoint} not found; give one with --checkpoint")
    state = upgrade_run_state(trainer.checkpointer.load(checkpoint, checkpointables=[]))
    # The loop, the step (optimizer, gradient scaler) and the hooks (the LR schedule).
    trainer.load_state_dict(state)
    data = continued_position(state, world_size)
    if data is None:
        raise ReplayError(f"checkpoint {checkpoint} holds no loader position; give another")
    trainer.data_loader.load_state_dict(data)
    saved = state.get("ranks") or []
    if state.get("world_size") != world_size or len(saved) != world_size:
        logger.warning("%s was written by %s processes, the job had %d: each rank's random ops "
                       "(dropout) are not replayed exactly", checkpoint, state.get("world_size"),
                       world_size)  # fmt: skip
        saved = [{}] * world_size
    return trainer.iter + 1, [local.get("rng") for local in saved]


def _diagnose(
    trainer: Any, ranks: EmulatedRanks, step: dict[str, Any], report: ReplayReport
) -> None:
    """Fill ``report`` from the failing step the trainer just ran (or went through)."""
    world_size, result = len(ranks.ranks), trainer._trainer.last_result
    for q, losses in enumerate(result.losses):
        report.losses[(q % world_size, q // world_size)] = values = _floats(losses)
        if _non_finite(values):
            report.bad_slots.append((q % world_size, q // world_size))
    if result.error is not None:
        q = len(result.losses)
        slot = (q % world_size, q // world_size)
        report.errors[slot] = f"{type(result.error).__name__}: {result.error}"
        report.bad_slots.append(slot)
    names = [n for n, p in ranks.model.named_parameters() if p.requires_grad]
    for rank, local in enumerate(ranks.ranks):
        report.grad_norms[f"rank {rank}"] = gradient_norm(local.grads)
    averaged = ranks.averaged()
    report.grad_norms["all"] = gradient_norm(averaged)
    report.non_finite_grads = _non_finite({n: g for n, g in zip(names, averaged) if g is not None})
    weights = {n: v for n, v in report.weights.items() if v.is_floating_point()}
    report.non_finite_weights = _non_finite(weights)
    ids = trainer.data_loader.spec.record_ids()
    indices = {(s["rank"], s["micro_batch"]): s["indices"] for s in step.get("records") or []}
    for slot in report.bad_slots:
        batch = result.batches[slot[1] * world_size + slot[0]] if result.batches else None
        if isinstance(batch, list):  # a list of records can be split
            names = [ids(i) for i in indices.get(slot, [])]
            _find_bad_records(trainer._trainer, ranks, report, slot, batch, names)


def _check_records(
    trainer: Any, step: dict[str, Any], iteration: int, position: dict[str, Any] | None
) -> None:
    """Refuse a replay whose failing step read other records than the run's."""
    run = {(s["rank"], s["micro_batch"]): s["positions"] for s in step.get("records") or []}
    if not run or position is None:
        return  # the run could not list them (a stream, a loader of its own)
    world_size = int(step["world_size"])
    (planned,) = trainer.data_loader.spec.steps_records(1, state=position, first_step=iteration)
    for _, q, pairs in planned.slots():
        slot, positions = (q % world_size, q // world_size), [p for _, p in pairs]
        if run.get(slot) != positions:
            raise ReplayError(
                f"step {iteration}: the replay's loader gave other records to rank {slot[0]} "
                f"micro-batch {slot[1]} than the run's; the trainer class or the datasets "
                "differ from the run's (see --trainer)."
            )


def _find_bad_records(
    step: Any,
    ranks: EmulatedRanks,
    report: ReplayReport,
    slot: tuple[int, int],
    batch: list[Any],
    record_names: list[str],
) -> None:
    """Run each record of a bad micro-batch alone; name those that fail alone.

    If every record fails alone in the same way (a model that cannot run one record, such
    as BatchNorm1d in training mode), the micro-batch is run without each record instead: a
    record is bad if the batch without it does not fail.
    """
    (rank, micro), report.records_tried = slot, report.records_tried + len(batch)
    with ranks.active(ranks.ranks[rank]):
        found = _losses_of(step, [[record] for record in batch])
        leave_one_out = len(batch) > 1 and all(isinstance(f, Exception) for f in found)
        if leave_one_out:
            found = _losses_of(step, [batch[:i] + batch[i + 1 :] for i in range(len(batch))])
    if ranks.ranks[0].buffers is not None:
        load_buffers(ranks.model, ranks.ranks[0].buffers)
    whole = report.losses.get(slot, {})
    for name, result in zip(record_names, found):
        if leave_one_out:  # bad if the batch is fine without it: the whole batch's failure
            fine = not isinstance(result, Exception) and not _non_finite(result)
            error = report.errors.get(slot)
            terms, losses = (([error] if error else _non_finite(whole)) if fine else []), {}
        elif isinstance(result, Exception):
            terms, losses = [f"{type(result).__name__}: {result}"], {}
        else:
            terms, losses = _non_finite(result), result
        if terms:
            report.bad_records.append(BadRecord(rank, micro, name, terms, losses))


def _losses_of(step: Any, batches: list[list[Any]]) -> list[dict[str, float] | Exception]:
    """Each batch's loss terms without gradients (or its error); buffers and RNG kept."""
    model, found = step.model, []
    buffers = copy_buffers(model)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for batch in batches:
            try:
                with step.forward_context():
                    found.append(_floats(step.compute_losses(batch)))
            except Exception as e:
                found.append(e)
            finally:
                load_buffers(model, buffers)
    return found
