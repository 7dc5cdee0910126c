#!/usr/bin/env python
"""Train (or evaluate) an image classifier from a config: trainkit's main job.

    python tools/train_net.py --config-file configs/shapes/cnn_small.yaml
    python tools/train_net.py --config-file configs/shapes/cnn_small.yaml --num-gpus 2
    python tools/train_net.py --config-file configs/shapes/cnn_small.yaml --resume
    python tools/train_net.py --config-file configs/shapes/cnn_small.yaml --eval-only \
        MODEL.WEIGHTS output/shapes_cnn_small/model_final.pth
    python tools/train_net.py --config-file configs/shapes/cnn_small.yaml --num-gpus 2 \
        --max-restarts 3            # restarted after a failure; resumes by itself
    torchrun --nproc-per-node 2 --max-restarts 3 tools/train_net.py --config-file ...
    srun python tools/train_net.py --config-file ...   # one SLURM task per process

This file is also the template for a new task: subclass DefaultTrainer and override the
``build_*`` methods that differ (here the mappers and the evaluator). Errors in the config or
the command line end it with one line and exit status 2, from the library.
"""

from trainkit.checkpoint import DetectionCheckpointer
from trainkit.config import get_cfg
from trainkit.data import build_detection_test_loader, build_detection_train_loader
from trainkit.data.mapping.mappers import ClassificationDatasetMapper
from trainkit.engine import DefaultTrainer, default_argument_parser, default_setup, launch
from trainkit.engine.hooks import load_ema_weights
from trainkit.evaluation import ClassificationEvaluator, verify_results
from trainkit.utils import comm


class Trainer(DefaultTrainer):
    """DefaultTrainer for classification: image mappers and a top-1/top-5 evaluator."""

    @classmethod
    def build_train_loader(cls, cfg):
        mapper = ClassificationDatasetMapper(cfg, is_train=True, dataset_names=cfg.DATASETS.TRAIN)
        return build_detection_train_loader(cfg, mapper=mapper)

    @classmethod
    def build_test_loader(cls, cfg, dataset_name):
        mapper = ClassificationDatasetMapper(cfg, is_train=False, dataset_names=[dataset_name])
        return build_detection_test_loader(cfg, dataset_name, mapper=mapper)

    @classmethod
    def build_evaluator(cls, cfg, dataset_name):
        return ClassificationEvaluator(dataset_name)


def setup(args):
    """Build the config from the file and the command-line overrides, then set up the run."""
    cfg = get_cfg()
    if args.config_file:
        cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    default_setup(cfg, args)
    return cfg


def main(args):
    """Train, or evaluate with ``--eval-only``; runs in every process of the job."""
    cfg = setup(args)
    if args.eval_only:
        model = Trainer.build_model(cfg)
        checkpointer = DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR)
        checkpointer.resume_or_load(cfg.MODEL.WEIGHTS, resume=args.resume)
        if cfg.MODEL_EMA.USE_FOR_EVAL:
            resumed = args.resume and checkpointer.has_checkpoint()
            load_ema_weights(
                model, checkpointer.get_checkpoint_file() if resumed else cfg.MODEL.WEIGHTS
            )
        results = Trainer.test(cfg, model)
        if comm.is_main_process():
            verify_results(cfg, results)
        return results
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


if __name__ == "__main__":
    args = default_argument_parser().parse_args()
    print("Command Line Args:", args)
    launch(
        main,
        args.num_gpus,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        dist_url=args.dist_url,
        args=(args,),
        max_restarts=args.max_restarts,
    )
