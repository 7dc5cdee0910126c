"""``DefaultTrainer``: detectron2's trainer built entirely from a config."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainkit.checkpoint import Checkpointer, is_sharded
from trainkit.config import CfgNode, ConfigError
from trainkit.config.scaling import auto_scale_config, check_same_recipe
from trainkit.data import build_test_loader, build_train_loader
from trainkit.data.train_config import resolve_random_seed, with_seed
from trainkit.engine import hooks
from trainkit.engine.failed_steps import FailedStepCapture
from trainkit.engine.gradients import create_ddp_model
from trainkit.engine.hook_base import HookBase
from trainkit.engine.hooks.checkpointing import check_saves_on_every_rank
from trainkit.engine.hooks.early_stopping import early_stopping_from_config
from trainkit.engine.hooks.evaluation import BATCH_NORM_TYPES
from trainkit.engine.hooks.preemption import PreemptionHandler
from trainkit.engine.hooks.watchdog import ProgressWatchdog
from trainkit.engine.run_state import RunState, upgrade_run_state
from trainkit.engine.simple_trainer import SimpleTrainer
from trainkit.engine.step_config import adopt_config_wiring, build_step_trainer, prepare_model
from trainkit.engine.step_metrics import NonFiniteLossError
from trainkit.engine.stragglers import StragglerDetector, build_straggler_detector
from trainkit.engine.trainer_base import TrainerBase
from trainkit.engine.writers import build_writers
from trainkit.evaluation import DatasetEvaluator, verify_results
from trainkit.evaluation.testing import evaluate_test_sets, validation_losses_of_test_sets
from trainkit.launcher import connect_job_store, resumes_by_itself
from trainkit.modeling import build_model, gathered_parameters
from trainkit.solver import build_lr_scheduler, build_optimizer
from trainkit.utils import comm
from trainkit.utils.errors import UsageError
from trainkit.utils.events import EventWriter
from trainkit.utils.logger import setup_logger

__all__ = ["DefaultTrainer"]

logger = logging.getLogger(__name__)


def _not_set(trainer: Any, name: str) -> UsageError:
    return UsageError(
        f"{type(trainer).__name__}.{name} is not set: a trainer that does not call "
        f"DefaultTrainer.__init__ must set self.{name} itself (as detectron2's "
        "DefaultTrainer.__init__ does) before building hooks or training."
    )


class _Required:
    """A part ``DefaultTrainer.__init__`` sets; a subclass that skips ``__init__`` sets it."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, trainer: Any, owner: type | None = None) -> Any:
        if trainer is None:
            return self
        raise _not_set(trainer, self._name)


@dataclass
class _Extras:
    """trainkit's parts of a ``DefaultTrainer`` beyond detectron2's (built in one place)."""

    watchdog: ProgressWatchdog
    run_state: RunState
    failed_steps: FailedStepCapture
    model_ema: hooks.ModelEMA | None = None
    stragglers: StragglerDetector | None = None
    val_loaders: dict[str, Iterable[Any]] = field(default_factory=dict)


class DefaultTrainer(TrainerBase):
    """A trainer with detectron2's default behaviour, built entirely from a config.

    It builds the model, optimizer, train loader (rank-sharded, resumable), LR scheduler, DDP
    wrapper, step trainer (:mod:`~trainkit.engine.step_config`), checkpointer, stall watchdog
    and hooks once, and hands its own collaborators the parts they use. Checkpoints hold
    everything needed to continue bit for bit (:class:`~trainkit.engine.run_state.RunState`).
    Hooks read the attributes :class:`TrainerBase` lists.

    Where to plug in:

    * a part: override a ``build_*`` classmethod (each delegates to one public function);
    * something around steps (logging, EMA, early stopping): a hook, in :meth:`build_hooks`
      or ``register_hooks``, placed by :attr:`HookBase.priority`; or a listener of
      :attr:`events` (:class:`~trainkit.engine.events.StepListener`);
    * the step itself: assign your own ``SimpleTrainer`` subclass (overriding its seams) to
      ``self._trainer`` after ``super().__init__(cfg)``, as in detectron2; it takes on the
      config's wiring, or is refused in one line if it computes another update;
    * a loop of another shape (several optimizers, GANs): ``tools/plain_train_net.py``.

    A subclass may skip ``DefaultTrainer.__init__`` as detectron2 projects do (call
    ``TrainerBase.__init__``, then set ``_trainer``, ``scheduler``, ``checkpointer``,
    ``start_iter``, ``max_iter`` and ``cfg``); trainkit's parts then take their defaults
    (no stall watchdog, no EMA, a run state of those parts) and a missing one is named.
    """

    checkpointer: Checkpointer = _Required()  # type: ignore[assignment]
    scheduler: Any = _Required()
    _cfg: CfgNode | None = None  # set through cfg (a subclass may set the step before it)
    _step: SimpleTrainer | None = None
    _seed_was_random = False
    _last_eval_results: dict[str, Any] = {}  # noqa: RUF012 - replaced, never mutated

    def __init__(self, cfg: CfgNode) -> None:
        """Build everything from ``cfg``, rescaled to the world size if it asks for that.

        Collective:
            ``shared_random_seed`` when ``cfg.SEED < 0``; DDP construction.
        """
        super().__init__()
        if not logging.getLogger("trainkit").handlers:
            setup_logger(distributed_rank=comm.get_rank())
        # A no-op after default_setup, which already scaled the config (and logged it).
        cfg = self.auto_scale_workers(cfg, comm.get_world_size())
        self._seed_was_random = cfg.SEED < 0
        self.cfg = cfg = resolve_random_seed(cfg)
        if cfg.MODEL.FSDP.ENABLED and cfg.MODEL_EMA.ENABLED and cfg.MODEL_EMA.USE_FOR_EVAL:
            raise ConfigError(
                "MODEL_EMA.USE_FOR_EVAL cannot be used with MODEL.FSDP.ENABLED: the average of a "
                "sharded model is kept as shards, with no model to evaluate; set "
                "MODEL_EMA.USE_FOR_EVAL False (the average is still saved)."
            )
        model = prepare_model(cfg, self.build_model(cfg))
        # After sharding: fully_shard replaces the parameters the optimizer must hold.
        optimizer = self.build_optimizer(cfg, model)
        data_loader = self.build_train_loader(cfg)
        if not is_sharded(model):
            model = create_ddp_model(model, broadcast_buffers=False)
        self._trainer = build_step_trainer(cfg, model, data_loader, optimizer)
        self.scheduler = self.build_lr_scheduler(cfg, optimizer)
        self.checkpointer = Checkpointer(
            model,
            cfg.OUTPUT_DIR,
            allow_shape_mismatch=cfg.MODEL.WEIGHTS_ALLOW_SHAPE_MISMATCH,
            async_save=cfg.SOLVER.CHECKPOINT_ASYNC,
            # The 'checkpoint' phase: the part of a save training waits for (async: the host copy).
            blocking_context=functools.partial(self.events.during, "checkpoint"),
        )
        self.start_iter = 0
        self.max_iter = cfg.SOLVER.MAX_ITER
        # Under launch(), torchrun or srun, the watchdog publishes this rank's progress to the
        # job's store, where rank 0 compares every rank's (see trainkit.launcher.job).
        store = connect_job_store() if cfg.WATCHDOG_TIMEOUT_S > 0 else None
        device = next((p.device for p in model.parameters()), None)
        self._parts = self._default_extras(
            watchdog=ProgressWatchdog(cfg.WATCHDOG_TIMEOUT_S, comm.get_rank(), store=store),
            model_ema=hooks.ModelEMA(model, cfg.MODEL_EMA.DECAY) if cfg.MODEL_EMA.ENABLED else None,
            # Slow ranks named (STRAGGLER.*): it times the phases the step announces.
            stragglers=build_straggler_detector(cfg, device),
        )
        self.checkpointer.add_checkpointable("trainer", self.run_state)
        # The watchdog is the job's, not one of the default hooks a subclass rearranges: registered
        # first (it runs before the timer), it leaves build_hooks' list in detectron2's positions.
        self.register_hooks([self.watchdog, *self.build_hooks()])

    def _default_extras(self, **parts: Any) -> _Extras:
        """trainkit's parts, from ``parts`` or their defaults: the one place they are made.

        Without ``parts`` (a subclass that skipped ``__init__``): no stall watchdog, no EMA,
        no slow-rank clock, and a run state and failure capture of the parts the subclass set.

        Raises:
            UsageError: Naming a part the subclass did not set (``cfg``, ``_trainer``,
                ``checkpointer``, ``scheduler``, ``max_iter``).
        """
        cfg, checkpointer, _ = self.cfg, self.checkpointer, self.scheduler
        if self._progress.max_iter is None:
            raise _not_set(self, "max_iter")
        parts.setdefault("watchdog", ProgressWatchdog(0, comm.get_rank()))
        extras = _Extras(
            run_state=RunState(self, output_dir=cfg.OUTPUT_DIR, seed=cfg.SEED),
            failed_steps=FailedStepCapture(cfg, type(self), checkpointer),
            **parts,
        )
        # Only what is used hears the phases: a disabled watchdog would cost each step calls.
        used = (extras.watchdog if extras.watchdog.enabled else None, extras.stragglers)
        self.events.subscribe(*[x for x in used if x is not None])
        return extras

    @functools.cached_property
    def _parts(self) -> _Extras:
        return self._default_extras()

    @property
    def watchdog(self) -> ProgressWatchdog:
        """The stall watchdog (``WATCHDOG_TIMEOUT_S``; a hook and a listener of the events)."""
        return self._parts.watchdog

    @property
    def run_state(self) -> RunState:
        """What the checkpoints hold besides the weights (registered as ``"trainer"``)."""
        return self._parts.run_state

    @property
    def model_ema(self) -> hooks.ModelEMA | None:
        """The :class:`~trainkit.engine.hooks.ModelEMA` hook (``MODEL_EMA.ENABLED``) or ``None``."""
        return self._parts.model_ema

    @property
    def stragglers(self) -> StragglerDetector | None:
        """The slow-rank clock (``STRAGGLER.ENABLED`` with several processes), else ``None``."""
        return self._parts.stragglers

    @property
    def cfg(self) -> CfgNode:
        """The run's config (frozen, scaled to the world size)."""
        if self._cfg is None:
            raise _not_set(self, "cfg")
        return self._cfg

    @cfg.setter
    def cfg(self, cfg: CfgNode) -> None:
        self._cfg = cfg

    @property
    def _trainer(self) -> SimpleTrainer:
        """The step trainer (detectron2's name); one assigned takes on the config's wiring."""
        if self._step is None:
            raise _not_set(self, "_trainer")
        return self._step

    @_trainer.setter
    def _trainer(self, step: SimpleTrainer) -> None:
        # Adopt-or-refuse once the config is known (a subclass that skips __init__ may assign
        # the step before cfg, as detectron2 projects do: it keeps the step as it built it).
        if self._cfg is not None:
            adopt_config_wiring(self._cfg, step)
        step.bind_to(self)
        self._step = step

    def run_step(self) -> None:
        """Run one step of the step trainer (it shares this trainer's iteration and hooks)."""
        self._trainer.run_step()

    def _check_before_train(self) -> None:
        check_saves_on_every_rank(self._hooks, self.model)

    def _end_early(self) -> None:
        self._trainer._end_early()

    def flush_pending_checks(self, *, collective: bool = True) -> None:
        """Raise now if a deferred loss check found a non-finite step (see the step trainer)."""
        self._trainer.flush_pending_checks(collective=collective)

    def loader_state_dict(self) -> dict[str, Any] | None:
        """Return the train loader's position after the batches the steps consumed."""
        return self._trainer.batches.position()

    # ---- the parts (one-line override points) ---------------------------------------
    @classmethod
    def build_model(cls, cfg: CfgNode) -> nn.Module:
        """Build the model; override to change it. Delegates to ``modeling.build_model``.

        With ``MODEL.FSDP.ENABLED`` the model is sharded (also for ``--eval-only``), and
        ``MODEL.ACTIVATION_CHECKPOINTING`` applied
        (:func:`~trainkit.engine.step_config.prepare_model`); a model an override returns
        is prepared when the trainer is built.
        """
        return prepare_model(cfg, build_model(cfg))

    @classmethod
    def build_optimizer(cls, cfg: CfgNode, model: nn.Module) -> torch.optim.Optimizer:
        """Build the optimizer; override to change it. Delegates to ``solver.build_optimizer``."""
        return build_optimizer(cfg, model)

    @classmethod
    def build_lr_scheduler(cls, cfg: CfgNode, optimizer: torch.optim.Optimizer) -> Any:
        """Build the LR scheduler; delegates to ``solver.build_lr_scheduler``."""
        return build_lr_scheduler(cfg, optimizer)

    @classmethod
    def build_train_loader(cls, cfg: CfgNode) -> Iterable[Any]:
        """Build the train loader; delegates to ``data.build_train_loader`` (no mapper)."""
        return build_train_loader(cfg)

    @classmethod
    def build_test_loader(cls, cfg: CfgNode, dataset_name: str) -> Iterable[Any]:
        """Build a test loader for one dataset; delegates to ``data.build_test_loader``."""
        return build_test_loader(cfg, dataset_name)

    @classmethod
    def build_evaluator(cls, cfg: CfgNode, dataset_name: str) -> DatasetEvaluator:
        """Return the evaluator of ``dataset_name``; there is no default, so override it."""
        raise NotImplementedError(
            f"{cls.__name__}.build_evaluator is not implemented, so {dataset_name!r} cannot be "
            "evaluated; override build_evaluator in your trainer (see tools/train_net.py)."
        )

    def build_hooks(self) -> list[HookBase | None]:
        """Return the default hooks in their canonical order (each edge's reason below).

        The list keeps detectron2's positions, which projects index: ``[0]`` the ``IterationTimer``,
        ``[1]`` the ``LRScheduler`` (``hooks[1] = MyLRHook()``), ``[2]`` ``PreciseBN`` or ``None``,
        ``[-1]`` the ``PeriodicWriter`` on the main process (``hooks.insert(-1, hook)`` puts a hook
        before the writer); trainkit's own come between. Registering skips ``None`` entries.
        """
        cfg = self.cfg
        has_bn = any(isinstance(m, BATCH_NORM_TYPES) for m in self.model.modules())
        return [
            # HookPriority.HIGHEST: the timer times everything after it.
            hooks.IterationTimer(),
            # So the logged lr is the one used for the step.
            hooks.LRScheduler(),
            # Changes the model before it is saved or evaluated.
            hooks.PreciseBN(
                cfg.TEST.EVAL_PERIOD,
                self.model,
                self.build_train_loader(cfg),
                cfg.TEST.PRECISE_BN.NUM_ITER,
            )
            if cfg.TEST.PRECISE_BN.ENABLED and has_bn
            else None,
            # HookPriority.HIGH: after the optimizer step, before anything saves or evaluates
            # (PreciseBN included, whatever the list order).
            self.model_ema,
            # Saves before evaluation, so a crash in eval loses nothing.
            hooks.PeriodicCheckpointer(
                self.checkpointer,
                cfg.SOLVER.CHECKPOINT_PERIOD,
                max_to_keep=cfg.SOLVER.MAX_TO_KEEP or None,
                run_state=self.run_state,
            ),
            # After the periodic checkpoint, so a stop never pre-empts a regular save, and
            # before evaluation, so a pre-empted job does not spend its grace period on it.
            PreemptionHandler(run_state=self.run_state),
            # With TEST.VAL_LOSS the validation losses too.
            hooks.EvalHook(cfg.TEST.EVAL_PERIOD, self._evaluate_for_hook),
            # TEST.EARLY_STOP: right after the evaluation it reads (same priority, later).
            early_stopping_from_config(cfg),
            hooks.SkippedRecordsCounter(cfg.WRITER_PERIOD),
            # MODEL.COMPILE: graph counts, at the writer period like the other metrics.
            hooks.CompileMetrics(cfg.WRITER_PERIOD) if cfg.MODEL.COMPILE.ENABLED else None,
            # HookPriority.LOWEST: the writers see every metric of the step.
            # Its slot stays (None) on the other ranks, so a hook inserted at -1 lands at the
            # same place on every rank and collectives in hooks keep one order.
            hooks.PeriodicWriter(self.build_writers(), period=cfg.WRITER_PERIOD)
            if comm.is_main_process()
            else None,
        ]

    def build_writers(self) -> list[EventWriter]:
        """Return the writers ``WRITERS`` names (:func:`~trainkit.engine.writers.build_writers`)."""
        return build_writers(self.cfg, self.max_iter)

    def resume_or_load(self, resume: bool = True) -> None:
        """Continue from the last checkpoint in OUTPUT_DIR, or load MODEL.WEIGHTS.

        With ``resume`` and a checkpoint, everything is restored and training continues after
        the saved iteration; else only ``MODEL.WEIGHTS`` (if any) is loaded and training starts
        at 0. A restart of their job (:mod:`trainkit.launcher.restarts`) always resumes.
        """
        newest = self.checkpointer.get_checkpoint_file()
        resume = resumes_by_itself(self.cfg.OUTPUT_DIR, newest) or resume
        # The weights only: the run state is restored below, once its loader exists.
        checkpoint = self.checkpointer.resume_or_load(
            self.cfg.MODEL.WEIGHTS, resume=resume, checkpointables=[]
        )
        if not (resume and self.checkpointer.has_checkpoint()):
            return
        state = upgrade_run_state(checkpoint)
        check_same_recipe(self.cfg, state["world_size"], comm.get_world_size())
        seed = state["seed"]
        if self._seed_was_random and seed not in (None, self.cfg.SEED):
            # SEED < 0 drew a new seed for this process; the saved run's data stream is keyed
            # by the seed it drew, so continue that one with a loader built for it.
            logger.info("Continuing the data stream of the checkpoint (seed %d)", seed)
            self.cfg = with_seed(self.cfg, seed, "the data seed of the checkpoint")
            self.run_state.seed = seed
            self.data_loader = self.build_train_loader(self.cfg)
        elif seed not in (None, self.cfg.SEED):
            logger.warning(
                "SEED changed from %d to %d since the checkpoint: the data stream starts "
                "afresh with the new seed.", seed, self.cfg.SEED
            )  # fmt: skip
        self.run_state.load_state_dict(state)
        # The checkpoint holds the last finished iteration; continue with the next one.
        self.start_iter = self.iter + 1
        if (saved_iter := checkpoint.get("iteration")) not in (None, self.iter):
            logger.warning(
                "Checkpoint extra data says iteration %s but the trainer state says %d; "
                "using the trainer state.", saved_iter, self.iter
            )  # fmt: skip

    def train(self) -> dict[str, Any]:  # type: ignore[override]  # detectron2's signature
        """Train from ``start_iter`` to ``SOLVER.MAX_ITER``, then return the last eval results.

        The results are :meth:`test`'s (validation losses go to the writers only); rank 0 checks
        them against ``TEST.EXPECTED_RESULTS``, as detectron2 does. A step that fails (an exception,
        a non-finite loss, out of memory) is captured in ``OUTPUT_DIR/failed_steps/iter_<N>/`` first
        (:class:`~trainkit.engine.failed_steps.FailedStepCapture`). After a stop
        (:meth:`TrainerBase.request_stop`) ``model_final.pth`` records it: resuming that run does
        not train (:class:`~trainkit.engine.hooks.PeriodicCheckpointer`).

        Raises:
            RuntimeError: If a result is missing or outside its expected range.
        """
        capture = self._parts.failed_steps
        capture.before_train(self.cfg, self.start_iter, self.loader_state_dict())
        try:
            super().train(self.start_iter, self.max_iter)
        except BaseException as e:
            # Captured: the step's error (or a non-finite loss a hook's check found), by the rank
            # that finds it, before the launcher hears of it; not a hook's (its note names it).
            if e is self.step_error or isinstance(e, NonFiniteLossError):
                capture.capture(e, self.iter, self._trainer.last_result.batches, self.data_loader)
            raise
        finally:
            capture.after_train()
            self._trainer.batches.close()
            # With SOLVER.CHECKPOINT_ASYNC the last checkpoint may still be being written
            # (also one saved by a hook after the checkpoint hook's after_train).
            if isinstance(self.checkpointer, Checkpointer):
                self.checkpointer.wait()
        if comm.is_main_process() and self._last_eval_results:
            verify_results(self.cfg, self._last_eval_results)
        return self._last_eval_results

    def _evaluate_for_hook(self) -> dict[str, Any]:
        use_ema = self.model_ema is not None and self.cfg.MODEL_EMA.USE_FOR_EVAL
        model = self.model_ema.ema_model if use_ema else self.model  # type: ignore[union-attr]
        # Sharded: gathered once for the evaluation and the validation losses together.
        gathered = gathered_parameters(
            model, reshard_after_forward=self.cfg.MODEL.FSDP.RESHARD_AFTER_FORWARD
        )
        with self.events.during("eval"), gathered:
            self._last_eval_results = self.test(self.cfg, model)
            if not self.cfg.TEST.VAL_LOSS:
                return self._last_eval_results
            results = dict(self._last_eval_results)
            if "validation" in results:
                raise ValueError(
                    "the evaluation results already have a 'validation' entry, where "
                    "TEST.VAL_LOSS puts the validation losses; rename that task or set "
                    "TEST.VAL_LOSS False."
                )
            results["validation"] = validation_losses_of_test_sets(
                self.cfg, self.build_test_loader, model, self._parts.val_loaders
            )
        return results

    # ---- what hooks may read ------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The (possibly DDP-wrapped) model being trained; assigning replaces the step's."""
        return self._trainer.model

    @model.setter
    def model(self, model: nn.Module) -> None:
        self._trainer.model = model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer; assigning replaces the step's."""
        return self._trainer.optimizer

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self._trainer.optimizer = optimizer

    @property
    def data_loader(self) -> Iterable[Any]:
        """The step trainer's train loader; assigning replaces it (the next step starts anew)."""
        return self._trainer.data_loader

    @data_loader.setter
    def data_loader(self, data_loader: Iterable[Any]) -> None:
        self._trainer.data_loader = data_loader

    # ---- evaluation and scaling (detectron2's classmethod/staticmethod API) ---------------
    @classmethod
    def test(
        cls,
        cfg: CfgNode,
        model: nn.Module,
        evaluators: DatasetEvaluator | list[DatasetEvaluator] | None = None,
    ) -> dict[str, Any]:
        """Evaluate ``model`` on every dataset in ``DATASETS.TEST``.

        Args:
            model: the model (wrapped or not).
            evaluators: one per test dataset; ``None`` builds them with :meth:`build_evaluator`.

        Returns:
            ``{dataset_name: results}`` (one dataset: its results) on rank 0; others may get ``{}``.

        Raises:
            ValueError: If the number of evaluators differs from the number of test sets.

        Collective:
            ``inference_on_dataset`` gathers on every rank.
        """
        # A sharded model's parameters are gathered once, so ranks may run different numbers
        # of batches (no collective in the forward passes).
        with gathered_parameters(model, reshard_after_forward=cfg.MODEL.FSDP.RESHARD_AFTER_FORWARD):
            return evaluate_test_sets(
                cfg, model, evaluators, cls.build_test_loader, cls.build_evaluator
            )

    @staticmethod
    def auto_scale_workers(cfg: CfgNode, num_workers: int) -> CfgNode:
        """Return ``cfg`` rescaled from ``SOLVER.REFERENCE_WORLD_SIZE`` to ``num_workers``.

        See :func:`trainkit.config.scaling.auto_scale_config` for the rule and its refusals.
        """
        return auto_scale_config(cfg, num_workers)

    def state_dict(self) -> dict[str, Any]:
        """Return the loop's state and, under ``_trainer``, the step's (``RunState`` adds more)."""
        state = super().state_dict()
        state["_trainer"] = self._trainer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (other keys are ignored)."""
        super().load_state_dict(state)
        self._trainer.load_state_dict(state["_trainer"])
