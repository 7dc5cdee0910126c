"""Replaying a captured failing step on one process, with the run's own trainer and step.

:func:`replay_failed_step` reads a folder :class:`~trainkit.engine.failed_steps.
FailedStepCapture` wrote and rebuilds the run with its trainer class (``tools/train_net.py``'s
``Trainer``, or the script's): the same ``build_*`` parts, hooks, loop and
``SimpleTrainer.accumulate``. What differs:

* one process does the work of all ``W`` ranks: its loader deals each step to ``W x k``
  micro-batches (``SOLVER.ACCUMULATE_STEPS`` set to ``W x k``), micro-batch ``q`` being
  micro-batch ``q // W`` of rank ``q % W``, at the same global positions (the same
  augmentations); the failing step's are checked against the folder's records;
* the step's gradient combiner is :class:`EmulatedRanks`: each rank's RNG states (dropout),
  buffers (BatchNorm statistics) and gradients are its own, and the gradients are averaged
  as DDP averages them;
* it starts from the newest checkpoint before the step (weights, optimizer, schedule, loader
  position, every rank's RNG states) and stops after the failing step, which it diagnoses
  (:class:`ReplayReport`): every micro-batch's loss terms, the records of a bad micro-batch
  run alone, the gradient norms;
* loader workers, the watchdog, trackers, evaluation, early stopping and ``MODEL.WEIGHTS`` are
  off, checkpoints go to a scratch folder, and losses are checked every step. PreciseBN
  therefore does not run at the run's evaluation periods.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from typing_extensions import override

from trainkit.checkpoint import unwrap_model
from trainkit.config import CfgNode, get_cfg
from trainkit.data.step_records import build_train_plan, steps_records
from trainkit.engine.failed_steps import STEP_FILE, record_ids
from trainkit.engine.gradients import GradientCombiner, micro_batch_weights
from trainkit.engine.hook_base import HookBase, HookPriority
from trainkit.engine.run_state import continued_position, upgrade_run_state
from trainkit.engine.step_metrics import NonFiniteLossError
from trainkit.engine.trainer_base import TrainerBase
from trainkit.utils.env import get_rng_state, seed_all_rng, set_rng_state
from trainkit.utils.errors import UsageError
from trainkit.utils.events import EventStorage

__all__ = [
    "BadRecord",
    "EmulatedRanks",
    "ReplayError",
    "ReplayReport",
    "load_trainer_class",
    "replay_config",
    "replay_failed_step",
]

logger = logging.getLogger(__name__)

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


def _first(names: list[str]) -> str:
    more = len(names) - _SHOWN
    return ", ".join(names[:_SHOWN]) + (f" and {more} more" if more > 0 else "")


class _Rank:
    """What one emulated rank keeps to itself: RNG states, buffers, its gradients."""

    def __init__(self, rng: dict[str, Any] | None) -> None:
        self.rng = rng  # None: the process's own generators
        self.buffers: dict[str, torch.Tensor] | None = None  # None: the model's current
        self.grads: list[torch.Tensor | None] = []


def _copy_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: buffer.detach().clone() for name, buffer in model.named_buffers()}


def _load_buffers(model: nn.Module, buffers: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])


class EmulatedRanks(GradientCombiner):
    """The step's micro-batches as ``W`` ranks' in one process, combined as DDP does.

    Micro-batch ``q`` belongs to rank ``q % W``; it runs with that rank's RNG states and
    buffers, and its gradient adds to that rank's own. After the last, the ranks'
    gradients are averaged as DDP averages them (each times ``1/W``, summed in rank order:
    bit-exact for two ranks, whose sum is the same in either order; with more, Gloo's and
    NCCL's summation order may differ in the last bit) and the model keeps rank 0's
    buffers, the ones a checkpoint saves.

    Args:
        model: the model (wrapped or not).
        rngs: each rank's RNG states (from the checkpoint), or ``None`` per unknown rank.
    """

    def __init__(self, model: nn.Module, rngs: Sequence[dict[str, Any] | None]) -> None:
        self.model = unwrap_model(model)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.ranks = [_Rank(rng) for rng in rngs]

    @override
    def weights(self, batches: Sequence[Any]) -> list[float] | None:
        w = len(self.ranks)
        per_rank = [micro_batch_weights(batches[rank::w]) for rank in range(w)]
        return [
            1.0 if per_rank[q % w] is None else per_rank[q % w][q // w] for q in range(len(batches))
        ]  # type: ignore[index]

    @override
    def micro_batch(
        self, model: nn.Module, index: int, count: int
    ) -> contextlib.AbstractContextManager[Any]:
        if index == 0:
            for rank in self.ranks:
                rank.grads = [None] * len(self.params)
        return self.active(self.ranks[index % len(self.ranks)], grads=True)

    @contextlib.contextmanager
    def active(self, rank: _Rank, *, grads: bool = False) -> Iterator[None]:
        """Run the body as ``rank``: its RNG, buffers (and gradients) in place, kept after."""
        if rank.rng is not None:
            set_rng_state(rank.rng)
        if rank.buffers is not None:
            _load_buffers(self.model, rank.buffers)
        if grads:
            for param, grad in zip(self.params, rank.grads):
                param.grad = grad
        try:
            yield
        finally:
            rank.rng, rank.buffers = get_rng_state(), _copy_buffers(self.model)
            if grads:
                rank.grads = [param.grad for param in self.params]

    @override
    def finish(self) -> None:
        for param, grad in zip(self.params, self.averaged()):
            param.grad = grad
        if self.ranks[0].buffers is not None:
            _load_buffers(self.model, self.ranks[0].buffers)

    def averaged(self) -> list[torch.Tensor | None]:
        """Each parameter's gradient averaged over the ranks, as DDP averages it."""
        if len(self.ranks) == 1:
            return list(self.ranks[0].grads)
        scale, out = 1.0 / len(self.ranks), []
        for grads in zip(*(rank.grads for rank in self.ranks)):
            present = [g for g in grads if g is not None]
            if not present:
                out.append(None)
                continue
            # A rank without a gradient for it contributes zeros (as DDP's bucket would).
            total = (grads[0] if grads[0] is not None else torch.zeros_like(present[0])) * scale
            for g in grads[1:]:
                total = total + (g if g is not None else torch.zeros_like(present[0])) * scale
            out.append(total)
        return out


def gradient_norm(gradients: Sequence[torch.Tensor | None]) -> float:
    """Return the L2 norm of all gradients together (as ``clip_grad_norm_`` computes it)."""
    norms = [g.detach().float().norm(2) for g in gradients if g is not None]
    return float(torch.stack(norms).norm(2)) if norms else 0.0


def _floats(losses: dict[str, torch.Tensor]) -> dict[str, float]:
    return {name: float(value.float()) for name, value in losses.items()}


def _non_finite(losses: dict[str, float]) -> list[str]:
    return [name for name, value in losses.items() if not math.isfinite(value)]


class _Quiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


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
            cfg = replay_config(folder, step, output_dir or scratch)
            if not cfg.MODEL.DEVICE.startswith("cuda") and step.get("num_threads"):
                # CPU kernels may sum in another order with another number of threads.
                torch.set_num_threads(int(step["num_threads"]))
            run_dir = os.path.dirname(os.path.dirname(os.path.abspath(folder)))
            if checkpoint is None and step["last_checkpoint"]:
                checkpoint = os.path.join(run_dir, step["last_checkpoint"])
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
    quiet = _Quiet()  # the failure is what the replay expects: its report says it
    loop_log.addFilter(quiet)
    try:
        # The loop itself, not DefaultTrainer.train: nothing is captured or evaluated.
        TrainerBase.train(trainer, start, cfg.SOLVER.MAX_ITER)
    except Exception as e:
        failed_at = e.iteration if isinstance(e, NonFiniteLossError) else trainer.iter
        if failed_at < iteration:
            raise ReplayError(
                f"the replay's step {failed_at} (before the failing step {iteration}) failed "
                f"({type(e).__name__}: {e}); the run did not. The model is not deterministic "
                "here (see docs/troubleshooting.md)."
            ) from e
        if (
            trainer.iter != iteration
            or e is not trainer._progress.step_error
            and not isinstance(e, NonFiniteLossError)
        ):
            raise
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
    if not os.path.isfile(checkpoint):
        raise ReplayError(f"checkpoint {checkpoint} not found; give one with --checkpoint")
    state = upgrade_run_state(trainer.checkpointer.load(checkpoint, checkpointables=[]))
    # The loop, the step (optimizer, gradient scaler) and the hooks (the LR schedule).
    trainer.load_state_dict(state)
    data = continued_position(state, world_size)
    if data is None:
        raise ReplayError(f"checkpoint {checkpoint} holds no loader position; give another")
    trainer.data_loader.load_state_dict(data)
    saved = state.get("ranks") or []
    if state.get("world_size") == world_size and len(saved) == world_size:
        return trainer.iter + 1, [local.get("rng") for local in saved]
    logger.warning(
        "Checkpoint %s was written by %s processes, the failing job had %d: each rank's "
        "random ops (dropout) are not replayed exactly",
        checkpoint,
        state.get("world_size"),
        world_size,
    )
    return trainer.iter + 1, [None] * world_size


def _diagnose(
    trainer: Any, ranks: EmulatedRanks, step: dict[str, Any], report: ReplayReport
) -> None:
    """Fill ``report`` from the failing step the trainer just ran (or went through)."""
    world_size, result = len(ranks.ranks), trainer._trainer.last_result
    batches = trainer._trainer.current_batches
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
    report.non_finite_grads = [
        n for n, g in zip(names, averaged) if g is not None and not bool(torch.isfinite(g).all())
    ]
    report.non_finite_weights = [
        n
        for n, v in report.weights.items()
        if v.is_floating_point() and not torch.isfinite(v).all()
    ]
    ids = record_ids(trainer.cfg, trainer.data_loader.records)
    for rank, micro in report.bad_slots:
        batch = batches[micro * world_size + rank] if batches else None
        if isinstance(batch, list):  # a list of records can be split
            _find_bad_records(trainer._trainer, ranks, report, ids, step, rank, micro, batch)


def _check_records(
    trainer: Any, step: dict[str, Any], iteration: int, position: dict[str, Any] | None
) -> None:
    """Refuse a replay whose failing step read other records than the run's."""
    run = {(s["rank"], s["micro_batch"]): s["positions"] for s in step.get("records") or []}
    if not run or position is None:
        return  # the run could not list them (a stream, a loader of its own)
    world_size = int(step["world_size"])
    _, plan = build_train_plan(trainer.cfg, 1, dataset=trainer.data_loader.records)
    (planned,) = steps_records(plan, 1, state=position, first_step=iteration)
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
    ids: Callable[[int], str],
    run_step: dict[str, Any],
    rank: int,
    micro: int,
    batch: list[Any],
) -> None:
    """Run each record of a bad micro-batch alone; name those that fail alone.

    If every record fails alone in the same way (a model that cannot run one record, such
    as BatchNorm1d in training mode), the micro-batch is run without each record instead: a
    record is bad if the batch without it does not fail.
    """
    report.records_tried += len(batch)
    with ranks.active(ranks.ranks[rank]):
        found = _losses_of(step, [[record] for record in batch])
        leave_one_out = len(batch) > 1 and all(isinstance(f, Exception) for f in found)
        if leave_one_out:
            found = _losses_of(step, [batch[:i] + batch[i + 1 :] for i in range(len(batch))])
    if ranks.ranks[0].buffers is not None:
        _load_buffers(ranks.model, ranks.ranks[0].buffers)
    slots = {(s["rank"], s["micro_batch"]): s["indices"] for s in run_step.get("records") or []}
    whole = report.losses.get((rank, micro), {})
    for index, result in zip(slots.get((rank, micro), []), found):
        if leave_one_out:  # bad if the batch is fine without it: the whole batch's failure
            fine = not isinstance(result, Exception) and not _non_finite(result)
            error = report.errors.get((rank, micro))
            terms, losses = (([error] if error else _non_finite(whole)) if fine else []), {}
        elif isinstance(result, Exception):
            terms, losses = [f"{type(result).__name__}: {result}"], {}
        else:
            terms, losses = _non_finite(result), result
        if terms:
            report.bad_records.append(BadRecord(rank, micro, ids(index), terms, losses))


def _losses_of(step: Any, batches: list[list[Any]]) -> list[dict[str, float] | Exception]:
    """Each batch's loss terms without gradients (or its error); buffers and RNG kept."""
    model, found = step.model, []
    buffers = _copy_buffers(model)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for batch in batches:
            try:
                with step.forward_context():
                    found.append(_floats(step.compute_losses(batch)))
            except Exception as e:
                found.append(e)
            finally:
                _load_buffers(model, buffers)
    return found
