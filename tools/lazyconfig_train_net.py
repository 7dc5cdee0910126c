#!/usr/bin/env python
"""Train (or evaluate) from a LazyConfig, in the shape of detectron2's tool of the same name.

    python tools/lazyconfig_train_net.py --config-file configs/shapes/cnn_small.py
    python tools/lazyconfig_train_net.py --config-file configs/shapes/cnn_small.py --num-gpus 2
    python tools/lazyconfig_train_net.py --config-file configs/shapes/cnn_small.py --resume
    python tools/lazyconfig_train_net.py --config-file configs/shapes/cnn_small.py \
        train.max_iter=100 optimizer.lr=0.001          # overrides: KEY=VALUE
    python tools/lazyconfig_train_net.py --config-file configs/shapes/cnn_small.py --eval-only \
        train.init_checkpoint=output/shapes_cnn_small_lazy/model_final.pth
    python tools/lazyconfig_train_net.py --config-file configs/shapes/cnn_small.py --print-config

Everything is built from the config with ``instantiate``: ``model``, ``optimizer`` (its
``params.model`` is set to the model here), ``dataloader.train`` / ``test`` / ``evaluator``,
``lr_multiplier`` (an fvcore ``ParamScheduler`` on [0, 1), stretched over ``train.max_iter``)
and the ``train`` settings of ``configs/common/train.py`` (``trainkit.model_zoo``). To train
something else, add keys to your config and copy this file.

Unlike detectron2's, ``--resume`` continues bit for bit, as ``tools/train_net.py`` does: the
checkpoints hold the run state (every rank's RNG states and loader position,
:class:`~trainkit.engine.run_state.RunState`), so every rank runs the checkpoint hook (it
gathers them). A data config without a ``seed`` (detectron2's ``common/data/*.py``) lets the
loader draw one; a resume then continues the checkpoint's stream with the seed it saved.
A LazyConfig is not rescaled to ``--num-gpus``: the batch in the config is
the total over all processes, and the lr and length stay as written.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import torch
from omegaconf import OmegaConf

from trainkit.checkpoint import DetectionCheckpointer, is_sharded
from trainkit.config import LazyConfig, instantiate
from trainkit.engine import (
    AMPTrainer,
    SimpleTrainer,
    default_argument_parser,
    default_setup,
    default_writers,
    hooks,
    launch,
)
from trainkit.engine.amp_trainer import default_precision
from trainkit.engine.defaults import create_ddp_model
from trainkit.engine.run_state import RunState, upgrade_run_state
from trainkit.evaluation import inference_on_dataset, print_csv_format
from trainkit.launcher import resumes_by_itself
from trainkit.modeling import gathered_parameters, shard_model
from trainkit.utils import comm
from trainkit.utils.errors import UsageError

logger = logging.getLogger("trainkit.lazyconfig_train_net")


def do_test(cfg: Any, model: Any) -> dict[str, Any]:
    """Evaluate ``model`` with ``dataloader.test`` and ``.evaluator`` if the config has them.

    Runs on every rank (the evaluation gathers).
    """
    if "evaluator" not in cfg.dataloader:
        return {}
    # Sharded (train.fsdp): the parameters gathered once, so ranks may run unequal batches.
    with gathered_parameters(model):
        results = inference_on_dataset(
            model, instantiate(cfg.dataloader.test), instantiate(cfg.dataloader.evaluator)
        )
    if comm.is_main_process():
        print_csv_format(results)
    return results


def do_train(args: argparse.Namespace, cfg: Any) -> None:
    """Train the config's model for ``train.max_iter`` iterations; runs on every rank.

    Args:
        args: the command line (``--resume``).
        cfg: a LazyConfig with ``model``, ``optimizer``, ``dataloader.train``,
            ``lr_multiplier`` and ``train`` (``output_dir``, ``init_checkpoint``,
            ``max_iter``, ``amp.enabled``, ``ddp``, ``checkpointer``, ``eval_period``,
            ``log_period``, ``device``).
    """
    model = instantiate(cfg.model)
    logger.info("Model:\n%s", model)
    model = place_model(cfg, model)

    # After sharding: fully_shard replaces the parameters the optimizer must hold.
    cfg.optimizer.params.model = model
    optimizer = instantiate(cfg.optimizer)
    train_loader = instantiate(cfg.dataloader.train)

    if not is_sharded(model):
        model = create_ddp_model(model, **cfg.train.ddp)
    trainer_class = AMPTrainer if cfg.train.amp.enabled else SimpleTrainer
    trainer = trainer_class(model, train_loader, optimizer)
    output_dir = cfg.train.output_dir
    # The data seed of the config, else the one the loader drew (shared by all ranks).
    run_state = RunState(trainer, output_dir=output_dir)
    # The run state is saved under "trainer", where detectron2 saves the trainer's state.
    checkpointer = DetectionCheckpointer(model, output_dir, trainer=run_state)
    trainer.register_hooks(
        [
            hooks.IterationTimer(),
            hooks.LRScheduler(scheduler=instantiate(cfg.lr_multiplier)),
            # On every rank (detectron2: rank 0 only): the save gathers every rank's state.
            hooks.PeriodicCheckpointer(checkpointer, **cfg.train.checkpointer, run_state=run_state),
            hooks.EvalHook(cfg.train.eval_period, lambda: do_test(cfg, model)),
            hooks.PeriodicWriter(
                default_writers(output_dir, cfg.train.max_iter), period=cfg.train.log_period
            )
            if comm.is_main_process()
            else None,
        ]
    )
    start_iter = resume_or_load(trainer, checkpointer, run_state, cfg, resume=args.resume)
    try:
        trainer.train(start_iter, cfg.train.max_iter)
    finally:
        trainer.batches.close()
        checkpointer.wait()


def place_model(cfg: Any, model: Any) -> Any:
    """Move ``model`` to ``train.device``, or shard it there with ``train.fsdp.enabled``.

    Sharded, a model built on the CPU is moved shard by shard; with ``train.amp.enabled`` its
    parameters are gathered in the device's AMP dtype (``AMPTrainer`` then runs no autocast).
    """
    fsdp = OmegaConf.select(cfg, "train.fsdp", default=None)
    if fsdp is None or not fsdp.enabled:
        return model.to(cfg.train.device)
    device = torch.device(cfg.train.device)
    return shard_model(
        model,
        shard_size=fsdp.shard_size,
        reshard_after_forward=fsdp.reshard_after_forward,
        param_dtype=default_precision(device.type) if cfg.train.amp.enabled else None,
        device=device,
        shard_size_name="train.fsdp.shard_size",
    )


def resume_or_load(
    trainer: SimpleTrainer,
    checkpointer: DetectionCheckpointer,
    run_state: RunState,
    cfg: Any,
    resume: bool,
) -> int:
    """Resume from the last checkpoint or load ``train.init_checkpoint``; return the start iter.

    With ``resume`` and a checkpoint in ``train.output_dir``, the weights and the run state
    (optimizer, schedule, hooks, RNG states, loader position) are restored and training goes
    on with the iteration after the saved one. A restarted job (``--max-restarts``) always
    resumes.
    """
    output_dir = cfg.train.output_dir
    resume = resumes_by_itself(output_dir, checkpointer.get_checkpoint_file()) or resume
    # The weights only: the run state needs the trainer's hooks, so it is restored below.
    checkpoint = checkpointer.resume_or_load(
        cfg.train.init_checkpoint, resume=resume, checkpointables=[]
    )
    if not (resume and checkpointer.has_checkpoint()):
        return 0
    state = upgrade_run_state(checkpoint)
    saved_seed = state.get("seed")
    if (
        OmegaConf.select(cfg, "dataloader.train.seed", default=None) is None
        and saved_seed is not None
        and saved_seed != getattr(trainer.data_loader, "seed", saved_seed)
    ):
        # The config leaves the data seed to be drawn (detectron2's configs do), and this
        # process drew another one: continue the checkpoint's data stream instead.
        logger.info("Continuing the data stream of the checkpoint (seed %d)", saved_seed)
        cfg.dataloader.train.seed = run_state.seed = saved_seed
        trainer.reset_data_loader(lambda: instantiate(cfg.dataloader.train))
    run_state.load_state_dict(state)
    # The checkpoint holds the last finished iteration; continue with the next one.
    return trainer.iter + 1


def main(args: argparse.Namespace) -> dict[str, Any] | None:
    """Train, or evaluate with ``--eval-only``; runs in every process of the job."""
    if not args.config_file:
        raise UsageError("--config-file is required: the LazyConfig (.py or .yaml) to train.")
    cfg = LazyConfig.load(args.config_file)
    cfg = LazyConfig.apply_overrides(cfg, args.opts)
    default_setup(cfg, args)

    if args.eval_only:
        model = place_model(cfg, instantiate(cfg.model))
        if not is_sharded(model):
            model = create_ddp_model(model)
        DetectionCheckpointer(model, cfg.train.output_dir).resume_or_load(
            cfg.train.init_checkpoint, resume=args.resume
        )
        return do_test(cfg, model)
    do_train(args, cfg)
    return None


if __name__ == "__main__":
    args = default_argument_parser().parse_args()
    launch(
        main,
        args.num_gpus,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        dist_url=args.dist_url,
        args=(args,),
        max_restarts=args.max_restarts,
    )
