#!/usr/bin/env python
"""The main job as one explicit training loop over trainkit's public functions.

    python tools/plain_train_net.py --config-file configs/shapes/cnn_small.yaml
    python tools/plain_train_net.py --config-file configs/shapes/cnn_small.yaml --num-gpus 2
    python tools/plain_train_net.py --config-file configs/shapes/cnn_small.yaml --eval-only \
        MODEL.WEIGHTS output/shapes_cnn_small/model_final.pth

``tools/train_net.py`` runs the same job through ``DefaultTrainer`` and its hooks. This file
spells the loop out — data, forward, backward, optimizer and schedule, metrics, writers,
checkpoints, evaluation — so that research code that does not fit a trainer (several
optimizers, unusual schedules, GANs) can start from a copy of it.

What it leaves out on purpose, and ``DefaultTrainer`` does: a resumed run continues the model,
optimizer, schedule and iteration but not the data order or the random streams (bit-exact
resume), AMP, gradient clipping, pre-emption handling and the stall watchdog. It does
restart with ``--max-restarts N`` like ``tools/train_net.py``: a restarted job resumes
from its newest checkpoint by itself.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from trainkit.checkpoint import DetectionCheckpointer, PeriodicCheckpointer
from trainkit.config import CfgNode, get_cfg
from trainkit.data import build_detection_test_loader, build_detection_train_loader
from trainkit.data.mapping.mappers import ClassificationDatasetMapper
from trainkit.engine import (
    build_writers,
    create_ddp_model,
    default_argument_parser,
    default_setup,
    launch,
)
from trainkit.evaluation import (
    ClassificationEvaluator,
    inference_on_dataset,
    print_csv_format,
    verify_results,
)
from trainkit.launcher import record_run_id, resumes_by_itself
from trainkit.modeling import build_model
from trainkit.solver import build_lr_scheduler, build_optimizer
from trainkit.utils import comm
from trainkit.utils.events import EventStorage

logger = logging.getLogger("trainkit.plain_train_net")


def do_test(cfg: CfgNode, model: torch.nn.Module) -> dict[str, Any]:
    """Evaluate ``model`` on every dataset of ``DATASETS.TEST``; runs on every rank."""
    results: dict[str, Any] = {}
    for dataset_name in cfg.DATASETS.TEST:
        mapper = ClassificationDatasetMapper(cfg, is_train=False)
        data_loader = build_detection_test_loader(cfg, dataset_name, mapper=mapper)
        evaluator = ClassificationEvaluator(dataset_name)
        results[dataset_name] = inference_on_dataset(model, data_loader, evaluator)
        if comm.is_main_process():
            logger.info("Evaluation results for %s in csv format:", dataset_name)
            print_csv_format(results[dataset_name])
    return next(iter(results.values())) if len(results) == 1 else results


def do_train(cfg: CfgNode, model: torch.nn.Module, resume: bool = False) -> None:
    """Train ``model`` for ``SOLVER.MAX_ITER`` iterations; runs on every rank."""
    model.train()
    optimizer = build_optimizer(cfg, model)
    scheduler = build_lr_scheduler(cfg, optimizer)
    checkpointer = DetectionCheckpointer(
        model,
        cfg.OUTPUT_DIR,
        async_save=cfg.SOLVER.CHECKPOINT_ASYNC,
        optimizer=optimizer,
        scheduler=scheduler,
    )
    # A process restarted by --max-restarts (or torchrun/SLURM) continues this run's checkpoints.
    resume = resumes_by_itself(cfg.OUTPUT_DIR, checkpointer.get_checkpoint_file()) or resume
    if comm.is_main_process():
        record_run_id(cfg.OUTPUT_DIR)
    extra = checkpointer.resume_or_load(cfg.MODEL.WEIGHTS, resume=resume)
    # The checkpoint holds the last finished iteration; continue with the next one. Weights
    # loaded from MODEL.WEIGHTS (no --resume) start a new run at 0, whatever they say.
    start_iter = extra.get("iteration", -1) + 1 if resume and checkpointer.has_checkpoint() else 0
    max_iter = cfg.SOLVER.MAX_ITER
    periodic_checkpointer = PeriodicCheckpointer(
        checkpointer, cfg.SOLVER.CHECKPOINT_PERIOD, max_iter=max_iter
    )
    # The writers named in WRITERS (console, metrics.json, TensorBoard by default; W&B, MLflow).
    writers = build_writers(cfg, max_iter) if comm.is_main_process() else []
    data_loader = build_detection_train_loader(
        cfg, mapper=ClassificationDatasetMapper(cfg, is_train=True)
    )
    logger.info("Starting training from iteration %d", start_iter)
    with EventStorage(start_iter) as storage:
        # range first: zip stops before drawing a batch that no iteration would use.
        for cur_iter, batch in zip(range(start_iter, max_iter), data_loader):
            storage.iter = cur_iter
            loss_dict = model(batch)
            losses = sum(loss_dict.values())
            if not torch.isfinite(losses):
                raise FloatingPointError(
                    f"Loss became infinite or NaN at iteration {cur_iter}: {loss_dict}"
                )
            # Averaged over ranks for the log only; each rank steps on its own gradients.
            loss_dict_reduced = {k: v.item() for k, v in comm.reduce_dict(loss_dict).items()}
            if comm.is_main_process():
                storage.put_scalars(total_loss=sum(loss_dict_reduced.values()), **loss_dict_reduced)
            optimizer.zero_grad()
            losses.backward()
            optimizer.step()
            storage.put_scalar("lr", optimizer.param_groups[0]["lr"], smoothing_hint=False)
            scheduler.step()
            is_last = cur_iter == max_iter - 1
            if (
                cfg.TEST.EVAL_PERIOD > 0
                and (cur_iter + 1) % cfg.TEST.EVAL_PERIOD == 0
                and not is_last
            ):
                do_test(cfg, model)
                comm.synchronize()
            if (cur_iter + 1) % cfg.WRITER_PERIOD == 0 or is_last:
                for writer in writers:
                    writer.write()
            periodic_checkpointer.step(cur_iter)
    # With SOLVER.CHECKPOINT_ASYNC the final checkpoint may still be being written.
    checkpointer.wait()
    for writer in writers:
        writer.close()


def setup(args: Any) -> CfgNode:
    """Build the config from the file and the command line, then set up the run."""
    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    # Also rescales cfg to the world size (SOLVER.REFERENCE_WORLD_SIZE), as for train_net.py.
    default_setup(cfg, args)
    return cfg


def main(args: Any) -> dict[str, Any]:
    """Train then evaluate, or only evaluate with ``--eval-only``; runs in every process."""
    cfg = setup(args)
    model = build_model(cfg)
    if args.eval_only:
        DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR).resume_or_load(
            cfg.MODEL.WEIGHTS, resume=args.resume
        )
        return do_test(cfg, model)
    # Gradients are averaged over ranks by DDP; one process trains the bare model.
    ddp_model = create_ddp_model(model, broadcast_buffers=False)
    do_train(cfg, ddp_model, resume=args.resume)
    results = do_test(cfg, model)
    if comm.is_main_process():
        verify_results(cfg, results)
    return results


if __name__ == "__main__":
    args = default_argument_parser().parse_args()
    print("Command Line Args:", args)  # noqa: T201 - a script's own output
    launch(
        main,
        args.num_gpus,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        dist_url=args.dist_url,
        args=(args,),
        max_restarts=args.max_restarts,
    )
