#!/usr/bin/env python
"""Train (or evaluate) an image classifier from a config: trainkit's main job.

    python tools/train_net.py --config-file configs/shapes/cnn_small.yaml
    python tools/train_net.py --config-file configs/shapes/cnn_small.yaml --num-gpus 2
    python tools/train_net.py --config-file configs/shapes/cnn_small.yaml --resume
    python tools/train_net.py --config-file configs/shapes/cnn_small.yaml --eval-only \
        MODEL.WEIGHTS output/shapes_cnn_small/model_final.pth

This file is also the template for a new task: subclass DefaultTrainer and override the
``build_*`` methods that differ (here the evaluator and the mappers).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

# Before torch loads OpenMP: by default its idle threads spin for a while after every
# parallel region, which on a small machine steals the cores the loader workers need
# (measured here: 8x slower training with 2 workers on 2 cores). Set it yourself to override.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from trainkit.checkpoint import (
    CheckpointError,
    Checkpointer,
    find_shape_mismatches,
    shape_changing_state_keys,
    shape_mismatch_message,
)
from trainkit.config import CfgNode, ConfigError, get_cfg
from trainkit.data import DatasetCatalog, MetadataCatalog, build_test_loader, build_train_loader
from trainkit.data.build import check_train_loader_config
from trainkit.data.mappers import ClassificationDatasetMapper
from trainkit.engine import DefaultTrainer, LaunchError, default_argument_parser, default_setup, launch
from trainkit.engine.defaults import check_output_dir
from trainkit.engine.launch import check_launch_arguments
from trainkit.engine.preemption import PREEMPTED_EXIT_CODE, TrainingPreempted
from trainkit.evaluation import ClassificationEvaluator, verify_results
from trainkit.modeling import META_ARCH_REGISTRY, model_device
from trainkit.utils import comm

logger = logging.getLogger("trainkit.train_net")


class Trainer(DefaultTrainer):
    """DefaultTrainer for classification: image mappers and a top-1/top-5 evaluator."""

    @classmethod
    def build_train_loader(cls, cfg: CfgNode) -> Any:
        return build_train_loader(cfg, mapper=ClassificationDatasetMapper(cfg, is_train=True))

    @classmethod
    def build_test_loader(cls, cfg: CfgNode, dataset_name: str) -> Any:
        return build_test_loader(cfg, dataset_name, mapper=ClassificationDatasetMapper(cfg, is_train=False))

    @classmethod
    def build_evaluator(cls, cfg: CfgNode, dataset_name: str) -> ClassificationEvaluator:
        return ClassificationEvaluator(dataset_name)


def setup(args: Any) -> CfgNode:
    """Build the config from the file and the command-line overrides, then set up the run."""
    cfg = load_config(args)
    default_setup(cfg, args)
    return cfg


def load_config(args: Any) -> CfgNode:
    """Return the merged (not yet set-up) config for ``args``."""
    cfg = get_cfg()
    if args.config_file:
        cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts or [])
    return cfg


def main(args: Any) -> dict[str, Any]:
    """Train, or evaluate with ``--eval-only``; runs in every process of the job."""
    cfg = setup(args)
    if args.eval_only:
        model = Trainer.build_model(cfg)
        checkpointer = Checkpointer(
            model, save_dir=cfg.OUTPUT_DIR, allow_shape_mismatch=cfg.MODEL.WEIGHTS_ALLOW_SHAPE_MISMATCH
        )
        checkpointer.resume_or_load(cfg.MODEL.WEIGHTS, resume=args.resume)
        results = Trainer.test(cfg, model)
    else:
        trainer = Trainer(cfg)
        trainer.resume_or_load(resume=args.resume)
        results = trainer.train()
    if comm.is_main_process() and results:
        _log_results_table(results)
        verify_results(cfg, results)
    return results


def _log_results_table(results: dict[str, Any]) -> None:
    rows = [(task, metric, value) for task, metrics in results.items() for metric, value in metrics.items()]
    lines = ["Final results:", f"  {'task':<16}{'metric':<10}value"]
    lines += [f"  {task:<16}{metric:<10}{value:.2f}" for task, metric, value in rows]
    logger.info("\n".join(lines))


class UsageError(Exception):
    """A problem with the command line or config that the user must fix (exit status 2)."""


def preflight(args: Any) -> None:
    """Check, before any process starts, everything a user can get wrong on the command line.

    Raises:
        UsageError: With a one-line message naming the problem and the fix.
    """
    try:
        check_launch_arguments(args.num_gpus, args.num_machines, args.machine_rank, args.dist_url)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.config_file and not os.path.isfile(args.config_file):
        raise UsageError(f"config file not found: {args.config_file}. Check --config-file.")
    world_size = args.num_gpus * args.num_machines
    try:
        cfg = load_config(args)
        if not args.eval_only:
            cfg = DefaultTrainer.auto_scale_workers(cfg, world_size)
    except (ConfigError, ValueError) as e:
        raise UsageError(str(e)) from None
    _check_registered_names(cfg, args)
    _check_values(cfg, args, world_size)
    try:
        check_output_dir(cfg.OUTPUT_DIR)
    except PermissionError as e:
        raise UsageError(str(e)) from None
    weights = cfg.MODEL.WEIGHTS
    if weights and "://" not in weights and not os.path.isfile(weights):
        raise UsageError(f"MODEL.WEIGHTS file not found: {weights}. Check the path.")
    if args.eval_only and not weights and not args.resume:
        raise UsageError("--eval-only needs MODEL.WEIGHTS (or --resume to use OUTPUT_DIR's last checkpoint).")
    _check_on_meta_model(cfg, args)


def _check_registered_names(cfg: CfgNode, args: Any) -> None:
    """Datasets and architecture must be registered; NUM_CLASSES must cover the datasets'."""
    names = list(cfg.DATASETS.TEST) + ([] if args.eval_only else list(cfg.DATASETS.TRAIN))
    for name in names:
        if name not in DatasetCatalog.list():
            raise UsageError(
                f"dataset {name!r} is not registered; registered: "
                f"{', '.join(sorted(DatasetCatalog.list()))}. Register it in DatasetCatalog."
            )
        classes = MetadataCatalog.get(name).get("thing_classes", None)
        if classes is not None and cfg.MODEL.NUM_CLASSES < len(classes):
            raise UsageError(
                f"MODEL.NUM_CLASSES={cfg.MODEL.NUM_CLASSES} but dataset {name!r} has "
                f"{len(classes)} classes; set MODEL.NUM_CLASSES {len(classes)}."
            )
    arch = cfg.MODEL.META_ARCHITECTURE
    if arch not in META_ARCH_REGISTRY:
        raise UsageError(
            f"MODEL.META_ARCHITECTURE {arch!r} is not registered; registered: "
            f"{', '.join(sorted(name for name, _ in META_ARCH_REGISTRY))}."
        )


def _check_values(cfg: CfgNode, args: Any, world_size: int) -> None:
    """Values the run would trip over later: schedule, device, loader and mapper settings."""
    if not args.eval_only and cfg.SOLVER.MAX_ITER < 1:
        raise UsageError(
            f"SOLVER.MAX_ITER={cfg.SOLVER.MAX_ITER}: training needs at least 1 iteration "
            "(use --eval-only to only evaluate)."
        )
    try:
        model_device(cfg)
        if not args.eval_only:
            check_train_loader_config(cfg, world_size)
            ClassificationDatasetMapper(cfg, is_train=True)
        ClassificationDatasetMapper(cfg, is_train=False)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _check_on_meta_model(cfg: CfgNode, args: Any) -> None:
    """Build the model on the meta device, then its optimizer and scheduler, and check weights.

    The meta device gives the model's structure without memory or initialisation. A model
    that cannot be built there is not checked here; the same checks happen at run time.
    """
    meta_cfg = cfg.clone()
    meta_cfg.defrost()
    meta_cfg.MODEL.DEVICE = "meta"
    try:
        with torch.device("meta"):
            model = Trainer.build_model(meta_cfg)
    except Exception as e:  # user models may need real tensors to build
        logger.debug("Not checking the model, optimizer and weights before launch: %s", e)
        return
    if not args.eval_only:
        try:
            Trainer.build_lr_scheduler(cfg, Trainer.build_optimizer(cfg, model))
        except ValueError as e:
            raise UsageError(str(e)) from None
    if not cfg.MODEL.WEIGHTS_ALLOW_SHAPE_MISMATCH:
        _check_checkpoint_fits_model(cfg, args, model)


def _check_checkpoint_fits_model(cfg: CfgNode, args: Any, model: torch.nn.Module) -> None:
    """Refuse, before any process starts, a checkpoint whose shapes do not fit ``model``.

    ``model`` is on the meta device and the file is memory-mapped, so this reads only the
    file's index.

    Raises:
        UsageError: If the file the run would load first has entries of other shapes, or
            MODEL.WEIGHTS is not a readable checkpoint.
    """
    checkpointer = Checkpointer(model, save_dir=cfg.OUTPUT_DIR, save_to_disk=False)
    if args.resume and checkpointer.has_checkpoint():
        path, resuming = checkpointer.get_checkpoint_file(), True
    elif cfg.MODEL.WEIGHTS and os.path.isfile(cfg.MODEL.WEIGHTS):
        path, resuming = cfg.MODEL.WEIGHTS, False
    else:
        return
    if not os.path.isfile(path):
        return  # --resume falls back to an older checkpoint at run time, with a warning
    resizable = shape_changing_state_keys(model)
    model_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in resizable}
    try:
        mismatches = find_shape_mismatches(path, model_shapes)
    except CheckpointError as e:
        if resuming:
            return  # as above: resume skips an unreadable checkpoint and says so
        raise UsageError(f"MODEL.WEIGHTS is not a usable checkpoint: {e}") from None
    if mismatches:
        hint = (
            " It is the checkpoint --resume continues from: run with the config that wrote it, "
            "or train into another OUTPUT_DIR." if resuming else ""
        )
        raise UsageError(shape_mismatch_message(path, mismatches) + hint)


def cli(argv: list[str] | None = None) -> int:
    """Parse the command line, check it, launch the job; return the exit status."""
    args = default_argument_parser().parse_args(argv)
    try:
        preflight(args)
        launch(
            main,
            args.num_gpus,
            num_machines=args.num_machines,
            machine_rank=args.machine_rank,
            dist_url=args.dist_url,
            args=(args,),
        )
    except (UsageError, TimeoutError) as e:
        sys.stderr.write(f"train_net.py: error: {e}\n")
        return 2
    except TrainingPreempted as e:  # one process: raised here directly
        sys.stderr.write(f"train_net.py: {e}\n")
        return PREEMPTED_EXIT_CODE
    except LaunchError as e:
        if e.exit_code == PREEMPTED_EXIT_CODE:
            sys.stderr.write("train_net.py: the job was pre-empted after saving a checkpoint; "
                             "run the same command with --resume to continue.\n")
        else:
            sys.stderr.write(f"train_net.py: the job failed: {e}\n")
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(cli())
