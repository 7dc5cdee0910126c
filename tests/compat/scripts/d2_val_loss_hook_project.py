"""A DefaultTrainer with a validation-loss hook, with ``detectron2`` replaced by ``trainkit``.

Written for trainkit's tests in the shape of the widely copied pattern (public projects such
as pawelbeza/ClothesDetectorModel): a ``HookBase`` that runs the model in training mode over
``build_detection_test_loader(cfg, name, DatasetMapper(cfg, True))`` and puts
``validation_loss``, inserted by ``build_hooks`` before the writer; ``hooks[1]`` replaced by
an ``LRScheduler`` subclass that steps a plateau scheduler on that loss; the scheduler chosen
by ``SOLVER.LR_SCHEDULER_NAME`` in ``build_lr_scheduler``; datasets registered in ``setup``
from paths on the command line; the default loaders and mapper. Run it as its README says::

    python d2_val_loss_hook_project.py --config-file cfg.yaml --train-json ... --resume
"""

import json
import logging
import os
import time

import numpy as np
from fvcore.common.param_scheduler import LinearParamScheduler
from torch.optim.lr_scheduler import ReduceLROnPlateau

import trainkit.utils.comm as comm
from trainkit.checkpoint import DetectionCheckpointer
from trainkit.config import get_cfg
from trainkit.data import (
    DatasetCatalog,
    DatasetMapper,
    MetadataCatalog,
    build_detection_test_loader,
)
from trainkit.engine import (
    DefaultTrainer,
    LRScheduler,
    default_argument_parser,
    default_setup,
    launch,
)
from trainkit.engine.train_loop import HookBase
from trainkit.evaluation import ClassificationEvaluator
from trainkit.utils.logger import log_every_n_seconds


class LossEvalHook(HookBase):
    def __init__(self, eval_period, model, data_loader):
        self._model = model
        self._period = eval_period
        self._data_loader = data_loader

    def _do_loss_eval(self):
        start = time.perf_counter()
        losses = []
        for idx, inputs in enumerate(self._data_loader):
            log_every_n_seconds(logging.INFO, f"Validation loss {idx + 1}/{len(self._data_loader)}")
            loss_dict = self._model(inputs)  # training mode: the model returns its losses
            losses.append(sum(float(v) for v in loss_dict.values()))
        self.trainer.storage.put_scalar("validation_loss", float(np.mean(losses)))
        self.trainer.storage.put_scalar("validation_time", time.perf_counter() - start)
        comm.synchronize()
        return losses

    def after_step(self):
        next_iter = self.trainer.iter + 1
        is_final = next_iter == self.trainer.max_iter
        if is_final or (self._period > 0 and next_iter % self._period == 0):
            self._do_loss_eval()


class WarmupReduceLROnPlateau(ReduceLROnPlateau):
    def __init__(self, cfg, optimizer, factor, patience):
        super().__init__(optimizer, mode="min", factor=factor, patience=patience)
        # Kept in __dict__, so torch's state_dict sweeps it (and the config) in.
        self._warmup = LinearParamScheduler(
            cfg.SOLVER.WARMUP_FACTOR * cfg.SOLVER.BASE_LR, cfg.SOLVER.BASE_LR
        )
        self._cfg = cfg

    def step(self, metrics, epoch=None):
        if epoch is not None and epoch < self._cfg.SOLVER.WARMUP_ITERS:
            for group in self.optimizer.param_groups:
                group["lr"] = self._warmup(epoch / self._cfg.SOLVER.WARMUP_ITERS)
            return
        super().step(metrics)


class LRSchedulerWithLossHook(LRScheduler):
    def __init__(self):
        super().__init__()

    def after_step(self):
        latest = self.trainer.storage.latest()
        loss = latest["validation_loss"][0] if "validation_loss" in latest else 1.0
        lr = self._optimizer.param_groups[self._best_param_group_id]["lr"]
        self.trainer.storage.put_scalar("lr", lr, smoothing_hint=False)
        self.scheduler.step(loss, epoch=self.trainer.iter)

    def state_dict(self):
        if isinstance(self.scheduler, ReduceLROnPlateau):
            return self.scheduler.state_dict()
        return {}

    def load_state_dict(self, state_dict):
        if isinstance(self.scheduler, ReduceLROnPlateau):
            self.scheduler.load_state_dict(state_dict)


class Trainer(DefaultTrainer):
    @classmethod
    def build_evaluator(cls, cfg, dataset_name, output_folder=None):
        return ClassificationEvaluator(dataset_name, topk=(1,))

    @classmethod
    def build_lr_scheduler(cls, cfg, optimizer):
        if cfg.SOLVER.LR_SCHEDULER_NAME == "ReduceLROnPlateau":
            return WarmupReduceLROnPlateau(cfg, optimizer, factor=cfg.SOLVER.GAMMA, patience=2)
        return super().build_lr_scheduler(cfg, optimizer)

    def build_hooks(self):
        hooks = super().build_hooks()
        hooks[1] = LRSchedulerWithLossHook()
        hooks.insert(
            -1,
            LossEvalHook(
                self.cfg.TEST.EVAL_PERIOD,
                self.model,
                build_detection_test_loader(
                    self.cfg, self.cfg.DATASETS.TEST[0], DatasetMapper(self.cfg, True)
                ),
            ),
        )
        return hooks


def register_json(name, json_file):
    DatasetCatalog.register(name, lambda: json.load(open(json_file)))
    MetadataCatalog.get(name).set(json_file=json_file)


def setup(args):
    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    cfg.freeze()
    register_json("project_train", args.train_json)
    register_json("project_val", args.val_json)
    default_setup(cfg, args)
    return cfg


def main(args):
    cfg = setup(args)
    if args.eval_only:
        model = Trainer.build_model(cfg)
        DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR).resume_or_load(
            cfg.MODEL.WEIGHTS, resume=args.resume
        )
        res = Trainer.test(cfg, model)
        if comm.is_main_process():
            with open(os.path.join(cfg.OUTPUT_DIR, "eval_only.json"), "w") as f:
                json.dump(res, f)
        return res
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


def get_parser():
    parser = default_argument_parser()
    parser.add_argument("--train-json", default="./dataset/train.json")
    parser.add_argument("--val-json", default="./dataset/val.json")
    return parser


if __name__ == "__main__":
    args = get_parser().parse_args()
    print("Command Line Args:", args)
    launch(
        main,
        args.num_gpus,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        dist_url=args.dist_url,
        args=(args,),
    )
