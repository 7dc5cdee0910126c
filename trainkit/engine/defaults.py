"""The pieces a training script needs around the trainer: command line, set-up, DefaultTrainer."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Iterable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainkit.checkpoint import Checkpointer
from trainkit.config import CfgNode
from trainkit.data import build_test_loader, build_train_loader
from trainkit.engine import hooks
from trainkit.engine.launch import get_job_store
from trainkit.engine.preemption import PreemptionHandler
from trainkit.engine.scaling import auto_scale_config
from trainkit.engine.train_loop import AMPTrainer, HookBase, SimpleTrainer, TrainerBase
from trainkit.engine.watchdog import PhaseMarkingLoader, ProgressWatchdog
from trainkit.evaluation import DatasetEvaluator, inference_on_dataset, print_csv_format
from trainkit.modeling import build_model
from trainkit.solver import build_lr_scheduler, build_optimizer
from trainkit.utils import comm
from trainkit.utils.collect_env import format_env_info
from trainkit.utils.env import get_rng_state, seed_all_rng, set_rng_state
from trainkit.utils.events import CommonMetricPrinter, EventWriter, JSONWriter, TensorboardXWriter
from trainkit.utils.file_io import PathManager, atomic_write
from trainkit.utils.logger import setup_logger
from trainkit.utils.periodic import is_last_iter, is_period_end

__all__ = [
    "DefaultTrainer",
    "check_output_dir",
    "create_ddp_model",
    "default_argument_parser",
    "default_setup",
    "default_writers",
]

logger = logging.getLogger(__name__)


def default_argument_parser(epilog: str | None = None) -> argparse.ArgumentParser:
    """Return the argument parser shared by training scripts (detectron2's flags).

    Args:
        epilog: text shown after the flags in ``--help``.

    Returns:
        A parser with ``--config-file``, ``--resume``, ``--eval-only``, ``--num-gpus``,
        ``--num-machines``, ``--machine-rank``, ``--dist-url`` and trailing ``opts``.
    """
    epilog = epilog or (
        "Examples:\n"
        f"  Train on 8 GPUs:      {sys.argv[0]} --num-gpus 8 --config-file cfg.yaml\n"
        f"  Change a setting:     {sys.argv[0]} --config-file cfg.yaml SOLVER.BASE_LR 0.01\n"
        f"  Evaluate weights:     {sys.argv[0]} --config-file cfg.yaml --eval-only "
        "MODEL.WEIGHTS /path/to/model_final.pth\n"
        "  Two machines (run on each, with its own --machine-rank):\n"
        f"    {sys.argv[0]} --config-file cfg.yaml --num-gpus 8 --num-machines 2 "
        "--machine-rank 0 --dist-url tcp://HOST0:29500\n"
    )
    parser = argparse.ArgumentParser(
        epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config-file", default="", metavar="FILE", help="path to a YAML config")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last checkpoint in OUTPUT_DIR (its last_checkpoint file); "
        "without it, training starts at iteration 0 from MODEL.WEIGHTS",
    )
    parser.add_argument("--eval-only", action="store_true", help="only evaluate MODEL.WEIGHTS")
    parser.add_argument("--num-gpus", type=int, default=1, help="processes per machine")
    parser.add_argument("--num-machines", type=int, default=1, help="machines in the job")
    parser.add_argument(
        "--machine-rank", type=int, default=0, help="index of this machine (0 ... num-machines - 1)"
    )
    parser.add_argument(
        "--dist-url",
        default="auto",
        help="rendezvous: 'auto' (one machine, private loopback port) or tcp://HOST:PORT of "
        "machine 0 for several machines",
    )
    parser.add_argument(
        "opts",
        default=None,
        nargs=argparse.REMAINDER,
        help="config overrides as KEY VALUE pairs, e.g. SOLVER.BASE_LR 0.01 SOLVER.MAX_ITER 100",
    )
    return parser


def default_setup(cfg: CfgNode, args: argparse.Namespace | None = None) -> CfgNode:
    """Prepare the run: output directory, logs, environment record, config dump, seeds.

    Rank 0 logs to the console and ``OUTPUT_DIR/log.txt``; rank N to ``log.txt.rankN``.
    Rank 0 writes ``OUTPUT_DIR/config.yaml`` (the resolved config) and ``env.txt``.
    The config is frozen afterwards.

    Args:
        cfg: the full config.
        args: the parsed command line (logged); may be None.

    Returns:
        ``cfg``, frozen.

    Raises:
        PermissionError: If ``OUTPUT_DIR`` cannot be created or written.
    """
    output_dir = cfg.OUTPUT_DIR
    rank = comm.get_rank()
    if output_dir:
        check_output_dir(output_dir)
    setup_logger(output_dir or None, distributed_rank=rank, name="trainkit")
    setup_logger(output_dir or None, distributed_rank=rank, name="fvcore")
    logger.info("Rank %d of %d (local rank %d)", rank, comm.get_world_size(), comm.get_local_rank())
    env_table = format_env_info()
    if rank == 0:
        logger.info("Environment:\n%s", env_table)
    if args is not None:
        logger.info("Command line arguments: %s", args)
        if getattr(args, "config_file", ""):
            with PathManager.open(args.config_file, "r") as f:
                logger.info("Contents of %s:\n%s", args.config_file, f.read())
    if rank == 0 and output_dir:
        with atomic_write(os.path.join(output_dir, "config.yaml"), "w") as f:
            f.write(cfg.dump())
        with atomic_write(os.path.join(output_dir, "env.txt"), "w") as f:
            f.write(env_table + "\n")
        logger.info("Full config saved to %s", os.path.join(output_dir, "config.yaml"))
    # Each rank gets a different seed for its own random ops; the data order uses a
    # separate seed shared by all ranks (see build_train_loader).
    seed = seed_all_rng(None if cfg.SEED < 0 else cfg.SEED + rank)
    logger.info("Seeded torch, numpy and random with %d on rank %d", seed, rank)
    if torch.backends.cudnn.is_available():
        torch.backends.cudnn.benchmark = bool(cfg.CUDNN_BENCHMARK)
    cfg.freeze()
    return cfg


def check_output_dir(output_dir: str) -> None:
    """Create ``output_dir`` if needed and check that this user can write to it.

    Raises:
        PermissionError: With a message naming the directory and the fix.
    """
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise PermissionError(
            f"OUTPUT_DIR {output_dir!r} cannot be created ({e.strerror}); set OUTPUT_DIR to a "
            f"writable directory."
        ) from None
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise PermissionError(
            f"OUTPUT_DIR {output_dir!r} is not writable by this user; set OUTPUT_DIR to a "
            f"writable directory or fix its permissions."
        )


def default_writers(output_dir: str, max_iter: int | None = None) -> list[EventWriter]:
    """Return the standard writers: console (with ETA), ``metrics.json`` and TensorBoard.

    Args:
        output_dir: directory for ``metrics.json`` and the TensorBoard event files.
        max_iter: total iterations, for the ETA.
    """
    PathManager.mkdirs(output_dir)
    return [
        CommonMetricPrinter(max_iter),
        JSONWriter(os.path.join(output_dir, "metrics.json")),
        TensorboardXWriter(output_dir),
    ]


def create_ddp_model(model: nn.Module, *, fp16_compression: bool = False, **kwargs: Any) -> nn.Module:
    """Wrap ``model`` in DistributedDataParallel when the job has several processes.

    Args:
        model: the model, already on its device.
        fp16_compression: compress gradients to fp16 for the all-reduce (NCCL only).
        kwargs: passed to ``DistributedDataParallel`` (e.g. ``broadcast_buffers=False``).

    Returns:
        ``model`` itself with one process, else the DDP wrapper.
    """
    if comm.get_world_size() == 1:
        return model
    if "device_ids" not in kwargs and next(model.parameters()).device.type == "cuda":
        kwargs["device_ids"] = [comm.get_local_rank()]
    ddp = DistributedDataParallel(model, **kwargs)
    if fp16_compression:
        from torch.distributed.algorithms.ddp_comm_hooks import default as comm_hooks

        ddp.register_comm_hook(state=None, hook=comm_hooks.fp16_compress_hook)
    return ddp


class _RankStateSnapshot(HookBase):
    """Gather every rank's RNG and data-stream state just before the checkpointer saves.

    Only rank 0 writes the checkpoint, but exact resume needs each rank's own RNG states and
    loader position (they differ by rank), so they are collected at the save iterations.

    Collective:
        ``all_gather`` over all ranks at every save iteration.
    """

    def __init__(self, period: int) -> None:
        self._period = period

    def after_step(self) -> None:
        trainer = self.trainer
        if is_period_end(trainer.iter, self._period) or is_last_iter(trainer.iter, trainer.max_iter):
            trainer._watchdog.enter("checkpoint")
            trainer.snapshot_rank_states()


class _WatchdogPhases(HookBase):
    """Keep the progress watchdog's phase current, run its thread, and record skipped records."""

    def __init__(self, watchdog: ProgressWatchdog) -> None:
        self._watchdog = watchdog

    def before_train(self) -> None:
        self._watchdog.start()

    def after_train(self) -> None:
        self._watchdog.stop()

    def before_step(self) -> None:
        self._watchdog.enter("data", self.trainer.iter)

    def after_step(self) -> None:
        self._watchdog.enter("hooks")
        trainer = self.trainer
        if is_period_end(trainer.iter, trainer.cfg.WRITER_PERIOD) or is_last_iter(trainer.iter, trainer.max_iter):
            # Cumulative count of records the loader skipped (unreadable, mapper failed),
            # so that a slowly rotting dataset shows up in metrics.json, not only in logs.
            skipped = getattr(trainer.data_loader, "num_skipped_records", None)
            if skipped is not None:
                trainer.storage.put_scalar("data/skipped_records", skipped, smoothing_hint=False)


class DefaultTrainer(TrainerBase):
    """A trainer with detectron2's default behaviour, built entirely from a config.

    It builds the model, optimizer, train loader (rank-sharded, resumable), LR scheduler,
    DDP wrapper, checkpointer, hooks and writers, and runs :class:`SimpleTrainer` (or
    :class:`AMPTrainer` with ``SOLVER.AMP.ENABLED``). Checkpoints hold everything needed to
    continue bit for bit: model, optimizer, scheduler, iteration, hook states, every rank's
    data-stream position and RNG states.

    Override the ``build_*`` classmethods to change a part; for a different step, write a
    hook or use :class:`SimpleTrainer` in your own loop (``tools/plain_train_net.py``). It
    does not do gradient accumulation or multiple optimizers: subclass ``SimpleTrainer`` for
    those.

    Attributes hooks may read: ``cfg``, ``scheduler``, ``checkpointer``, ``model``,
    ``optimizer``, ``data_loader``, plus :class:`TrainerBase`'s.
    """

    def __init__(self, cfg: CfgNode) -> None:
        """Build everything from ``cfg`` (rescaled to the world size if it asks for that).

        Collective:
            ``shared_random_seed`` when ``cfg.SEED < 0``; DDP construction.
        """
        super().__init__()
        if not logging.getLogger("trainkit").handlers:
            setup_logger(distributed_rank=comm.get_rank())
        cfg = self.auto_scale_workers(cfg, comm.get_world_size())
        self._seed_was_random = cfg.SEED < 0
        cfg = _with_resolved_seed(cfg)
        self.cfg = cfg
        model = self.build_model(cfg)
        optimizer = self.build_optimizer(cfg, model)
        self._train_loader = self.build_train_loader(cfg)
        model = create_ddp_model(model, broadcast_buffers=False)
        self._watchdog = ProgressWatchdog(cfg.WATCHDOG_TIMEOUT_S, comm.get_rank(), store=get_job_store())
        trainer_cls = AMPTrainer if cfg.SOLVER.AMP.ENABLED else SimpleTrainer
        # Every step's losses are recorded (as with detectron2's default period of 1) but
        # synchronised only every WRITER_PERIOD steps, when the writers need them.
        self._trainer = trainer_cls(
            model,
            self._watched(self._train_loader),
            optimizer,
            gather_metric_period=cfg.WRITER_PERIOD,
            record_every_step=True,
        )
        # The inner step calls after_backward on itself; the hooks are registered here, so
        # point it at this trainer's dispatch (gradient clipping, accumulation hooks).
        self._trainer.after_backward = self.after_backward  # type: ignore[method-assign]
        self.scheduler = self.build_lr_scheduler(cfg, optimizer)
        self.checkpointer = Checkpointer(
            model,
            cfg.OUTPUT_DIR,
            allow_shape_mismatch=cfg.MODEL.WEIGHTS_ALLOW_SHAPE_MISMATCH,
            trainer=self,
        )
        self.start_iter = 0
        self.max_iter = cfg.SOLVER.MAX_ITER
        self._rank_states: list[dict[str, Any]] | None = None
        self._rank_states_iter = -1
        self.register_hooks(self.build_hooks())

    # ---- the parts (one-line override points) ---------------------------------------
    @classmethod
    def build_model(cls, cfg: CfgNode) -> nn.Module:
        """Build the model; override to change it. Delegates to ``modeling.build_model``."""
        return build_model(cfg)

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

    def build_hooks(self) -> list[HookBase]:
        """Return the default hooks in their canonical order.

        Timer first (it times everything after it), then the LR schedule (so the logged lr
        is the one used for the step), PreciseBN (changes the model before it is saved or
        evaluated), the checkpointer (saves before evaluation so a crash in eval loses
        nothing), evaluation, and the writers last so they see every metric of the step.
        """
        cfg = self.cfg
        hooks_list: list[HookBase | None] = [
            _WatchdogPhases(self._watchdog),
            hooks.IterationTimer(),
            hooks.LRScheduler(),
            hooks.PreciseBN(
                cfg.TEST.EVAL_PERIOD, self.model, self.build_train_loader(cfg), cfg.TEST.PRECISE_BN.NUM_ITER
            )
            if cfg.TEST.PRECISE_BN.ENABLED and _has_batchnorm(self.model)
            else None,
            _RankStateSnapshot(cfg.SOLVER.CHECKPOINT_PERIOD),
            hooks.PeriodicCheckpointer(
                self.checkpointer, cfg.SOLVER.CHECKPOINT_PERIOD,
                max_to_keep=cfg.SOLVER.MAX_TO_KEEP or None,
            ),
            # After the periodic checkpoint, so a stop never pre-empts a regular save, and
            # before evaluation, so a pre-empted job does not spend its grace period on it.
            PreemptionHandler(),
            hooks.EvalHook(cfg.TEST.EVAL_PERIOD, self._evaluate_for_hook),
        ]
        if comm.is_main_process():
            hooks_list.append(hooks.PeriodicWriter(self.build_writers(), period=cfg.WRITER_PERIOD))
        return [h for h in hooks_list if h is not None]

    def build_writers(self) -> list[EventWriter]:
        """Return the writers run by the PeriodicWriter hook (rank 0 only)."""
        return default_writers(self.cfg.OUTPUT_DIR, self.max_iter)

    # ---- running ------------------------------------------------------------------------
    def resume_or_load(self, resume: bool = True) -> None:
        """Continue from the last checkpoint in OUTPUT_DIR, or load MODEL.WEIGHTS.

        With ``resume`` and a checkpoint present, everything is restored and training
        continues with the iteration after the saved one; otherwise only the weights in
        ``MODEL.WEIGHTS`` (if any) are loaded and training starts at 0.
        """
        extra = self.checkpointer.resume_or_load(self.cfg.MODEL.WEIGHTS, resume=resume)
        if resume and self.checkpointer.has_checkpoint():
            # The checkpoint holds the last finished iteration; continue with the next one.
            self.start_iter = self.iter + 1
            saved_iter = extra.get("iteration")
            if saved_iter is not None and saved_iter != self.iter:
                logger.warning(
                    "Checkpoint extra data says iteration %s but the trainer state says %d; "
                    "using the trainer state.", saved_iter, self.iter,
                )

    def train(self) -> dict[str, Any]:  # type: ignore[override]  # detectron2's signature
        """Train from ``start_iter`` to ``SOLVER.MAX_ITER``, then return the last eval results."""
        try:
            super().train(self.start_iter, self.max_iter)
        finally:
            self._trainer.close_data_iterator()
        return getattr(self, "_last_eval_results", {})

    def run_step(self) -> None:
        """Run one step of the inner SimpleTrainer/AMPTrainer at this trainer's iteration."""
        self._trainer.iter = self.iter
        self._trainer.max_iter = self.max_iter
        self._trainer.storage = self.storage
        self._trainer.run_step()

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
        """The train loader; assigning replaces it (the next step starts a new iterator)."""
        return self._train_loader

    @data_loader.setter
    def data_loader(self, data_loader: Iterable[Any]) -> None:
        self._trainer.close_data_iterator()
        self._train_loader = data_loader
        self._trainer.data_loader = self._watched(data_loader)

    def _watched(self, loader: Iterable[Any]) -> Iterable[Any]:
        return PhaseMarkingLoader(loader, self._watchdog) if self._watchdog.enabled else loader

    def _evaluate_for_hook(self) -> dict[str, Any]:
        with self._watchdog.phase("eval"):
            self._last_eval_results = self.test(self.cfg, self.model)
        return self._last_eval_results

    @classmethod
    def test(
        cls,
        cfg: CfgNode,
        model: nn.Module,
        evaluators: DatasetEvaluator | list[DatasetEvaluator] | None = None,
    ) -> dict[str, Any]:
        """Evaluate ``model`` on every dataset in ``DATASETS.TEST``.

        Args:
            cfg: the config.
            model: the model (wrapped or not).
            evaluators: one per test dataset; ``None`` builds them with :meth:`build_evaluator`.

        Returns:
            ``{dataset_name: results}``, or the results themselves for a single dataset
            (rank 0; other ranks may get empty dicts).

        Collective:
            ``inference_on_dataset`` gathers on every rank.
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
            data_loader = cls.build_test_loader(cfg, name)
            if evaluators is not None:
                evaluator = evaluators[idx]
            else:
                try:
                    evaluator = cls.build_evaluator(cfg, name)
                except NotImplementedError as e:
                    logger.warning("%s Skipping evaluation of %s.", e, name)
                    results[name] = {}
                    continue
            results[name] = inference_on_dataset(model, data_loader, evaluator) or {}
            if comm.is_main_process() and results[name]:
                logger.info("Evaluation results for %s in csv format:", name)
                print_csv_format(results[name])
        return next(iter(results.values())) if len(results) == 1 else results

    @staticmethod
    def auto_scale_workers(cfg: CfgNode, num_workers: int) -> CfgNode:
        """Return ``cfg`` rescaled from ``SOLVER.REFERENCE_WORLD_SIZE`` to ``num_workers``.

        See :func:`trainkit.engine.scaling.auto_scale_config` for the rule and its refusals.
        """
        return auto_scale_config(cfg, num_workers)

    # ---- exact resume -------------------------------------------------------------------
    def snapshot_rank_states(self) -> None:
        """Gather every rank's RNG and data-stream state for the next checkpoint.

        Collective:
            ``all_gather`` over all ranks.
        """
        self._rank_states = comm.all_gather(self._local_rank_state())
        self._rank_states_iter = self.iter

    def _local_rank_state(self) -> dict[str, Any]:
        loader = self.data_loader
        data_state = loader.state_dict() if hasattr(loader, "state_dict") else None
        return {"rng": get_rng_state(), "data": data_state}

    def state_dict(self) -> dict[str, Any]:
        """Return the full training state: iteration, hooks, optimizer, and per-rank states."""
        state = super().state_dict()
        state["_trainer"] = self._trainer.state_dict()
        state["data_seed"] = self.cfg.SEED
        state["world_size"] = comm.get_world_size()
        if self._rank_states is not None and self._rank_states_iter == self.iter:
            state["rank_states"] = self._rank_states
        elif comm.get_world_size() == 1:
            state["rank_states"] = [self._local_rank_state()]
        else:
            logger.warning(
                "Saving at iteration %d without the other ranks' data and RNG states (call "
                "snapshot_rank_states() on every rank first); resuming from it is not exact.",
                self.iter,
            )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the full training state saved by :meth:`state_dict`."""
        super().load_state_dict(state)
        self._trainer.load_state_dict(state["_trainer"])
        rank_states = state.get("rank_states")
        world_size = comm.get_world_size()
        if rank_states is None or state.get("world_size") != world_size:
            logger.warning(
                "The checkpoint was written by %s processes, this job has %d: the data order "
                "and random streams start afresh, so this resume is not bit-exact.",
                state.get("world_size"), world_size,
            )
            return
        mine = rank_states[comm.get_rank()]
        if mine["data"] is not None:
            self._restore_data_state(mine["data"], state.get("data_seed"))
        set_rng_state(mine["rng"])

    def _restore_data_state(self, data_state: dict[str, Any], saved_seed: int | None) -> None:
        if saved_seed is not None and saved_seed != self.cfg.SEED:
            if not self._seed_was_random:
                logger.warning(
                    "SEED changed from %d to %d since the checkpoint: the data stream starts "
                    "afresh with the new seed.", saved_seed, self.cfg.SEED,
                )
                return
            # SEED < 0 drew a new seed for this process; continue the saved run's stream.
            logger.info("Continuing the data stream of the checkpoint (seed %d)", saved_seed)
            cfg = self.cfg.clone()
            cfg.defrost()
            cfg.SEED = saved_seed
            cfg.freeze()
            self.cfg = cfg
            self._trainer.close_data_iterator()
            self._train_loader = self.build_train_loader(cfg)
            self._trainer.data_loader = self._watched(self._train_loader)
        self.data_loader.load_state_dict(data_state)


def _with_resolved_seed(cfg: CfgNode) -> CfgNode:
    """Return ``cfg`` with ``SEED < 0`` replaced by a seed drawn once and shared by all ranks.

    Collective:
        ``shared_random_seed`` on every rank when ``cfg.SEED < 0``.
    """
    if cfg.SEED >= 0:
        return cfg
    seed = comm.shared_random_seed()
    logger.info("SEED=%d: the data stream of this run uses the shared seed %d", cfg.SEED, seed)
    cfg = cfg.clone()
    cfg.defrost()
    cfg.SEED = seed
    cfg.freeze()
    return cfg


def _has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
