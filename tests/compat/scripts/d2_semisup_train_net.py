"""A semi-supervised project in the shape of unbiased-teacher, on trainkit.

What such a project brings, written here for trainkit's tests: an ``add_*_config`` (with
``TEST.VAL_LOSS``); a ``DefaultTrainer`` subclass whose ``__init__`` skips
``DefaultTrainer.__init__`` (``TrainerBase.__init__``, then ``self._trainer``, scheduler,
checkpointer, ``cfg``, hooks); a student and an EMA teacher saved together through a
``DetectionCheckpointer`` subclass that overrides ``_load_model``; its own ``train_loop``
with ``EventStorage``; a ``run_step`` that pulls from ``self._trainer._data_loader_iter``,
pseudo-labels unlabeled data with the teacher after a burn-in, and writes metrics through
``comm.gather``; ``EvalHook``s for student and teacher.
"""

import json
import logging
import os
import time
from collections import OrderedDict

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

import trainkit.utils.comm as comm
from trainkit.checkpoint import DetectionCheckpointer
from trainkit.config import CfgNode as CN
from trainkit.config import configurable, get_cfg
from trainkit.data import DatasetCatalog, MetadataCatalog, build_detection_train_loader
from trainkit.engine import (
    DefaultTrainer,
    SimpleTrainer,
    TrainerBase,
    default_argument_parser,
    default_setup,
    hooks,
    launch,
)
from trainkit.evaluation import ClassificationEvaluator
from trainkit.modeling import META_ARCH_REGISTRY
from trainkit.utils.events import EventStorage

logger = logging.getLogger("semisup")


def add_semisup_config(cfg):
    cfg.TEST.VAL_LOSS = True
    cfg.SOLVER.IMG_PER_BATCH_LABEL = 4
    cfg.SOLVER.IMG_PER_BATCH_UNLABEL = 4
    cfg.DATASETS.TRAIN_LABEL = ("semisup_label",)
    cfg.DATASETS.TRAIN_UNLABEL = ("semisup_unlabel",)
    cfg.SEMISUPNET = CN()
    cfg.SEMISUPNET.BURN_UP_STEP = 4
    cfg.SEMISUPNET.EMA_KEEP_RATE = 0.9
    cfg.SEMISUPNET.THRESHOLD = 0.4
    cfg.SEMISUPNET.UNSUP_LOSS_WEIGHT = 2.0


def _toy(n, seed, labeled):
    rng = np.random.default_rng(seed)
    centres = np.eye(3, 4) * 3.0
    records = []
    for i in range(n):
        label = i % 3
        record = {"image_id": i, "x": (centres[label] + rng.normal(size=4)).tolist()}
        record["label"] = label
        if labeled:
            record["instances"] = [label]
        records.append(record)
    return records


DatasetCatalog.register("semisup_label", lambda: _toy(12, 0, True))
DatasetCatalog.register("semisup_unlabel", lambda: _toy(48, 1, False))
DatasetCatalog.register("semisup_val", lambda: _toy(30, 2, True))
MetadataCatalog.get("semisup_val").set(evaluator_type="classification")


def _map(record):
    out = {"x": torch.tensor(record["x"], dtype=torch.float32), "label": record["label"]}
    if "instances" in record:
        out["instances"] = torch.tensor(record["instances"])
    return out


@META_ARCH_REGISTRY.register()
class PseudoLabClassifier(nn.Module):
    @configurable
    def __init__(self, *, num_classes):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, num_classes))

    @classmethod
    def from_config(cls, cfg):
        return {"num_classes": cfg.MODEL.NUM_CLASSES}

    def forward(self, batched_inputs, branch="supervised"):
        logits = self.net(torch.stack([b["x"] for b in batched_inputs]))
        if not self.training:
            return logits
        if branch == "unsup_data_weak":
            return logits.softmax(dim=1)
        keep = [i for i, b in enumerate(batched_inputs) if len(b.get("instances", ())) > 0]
        if not keep:
            return {"loss_cls": logits.sum() * 0.0}
        labels = torch.stack([batched_inputs[i]["instances"][0] for i in keep])
        return {"loss_cls": F.cross_entropy(logits[keep], labels)}


class EnsembleTSModel(nn.Module):
    def __init__(self, teacher, student):
        super().__init__()
        self.modelTeacher = teacher
        self.modelStudent = (
            student.module if isinstance(student, DistributedDataParallel) else student
        )


class TSCheckpointer(DetectionCheckpointer):
    def _load_model(self, checkpoint):
        incompatible = super()._load_model(checkpoint)
        logger.warning("TSCheckpointer._load_model: missing=%s", incompatible.missing_keys)
        print(f"TSCheckpointer._load_model called: missing={incompatible.missing_keys}")
        return incompatible


class SemiSupLoader:
    """Yields (labeled strong, labeled weak, unlabeled strong, unlabeled weak) batches."""

    def __init__(self, cfg):
        world = comm.get_world_size()

        def loader(name, total):
            return build_detection_train_loader(
                dataset=DatasetCatalog.get(name), mapper=_map, total_batch_size=total,
                num_workers=cfg.DATALOADER.NUM_WORKERS, aspect_ratio_grouping=False,
            )  # fmt: skip

        assert cfg.SOLVER.IMG_PER_BATCH_LABEL % world == 0
        self.label = loader(cfg.DATASETS.TRAIN_LABEL[0], cfg.SOLVER.IMG_PER_BATCH_LABEL)
        self.unlabel = loader(cfg.DATASETS.TRAIN_UNLABEL[0], cfg.SOLVER.IMG_PER_BATCH_UNLABEL)

    def __iter__(self):
        for labeled, unlabeled in zip(self.label, self.unlabel):
            noisy = [dict(b, x=b["x"] + 0.1 * torch.randn(4)) for b in labeled]
            noisy_u = [dict(b, x=b["x"] + 0.1 * torch.randn(4)) for b in unlabeled]
            yield noisy, labeled, noisy_u, unlabeled


class SemiSupTrainer(DefaultTrainer):
    def __init__(self, cfg):
        cfg = DefaultTrainer.auto_scale_workers(cfg, comm.get_world_size())
        data_loader = self.build_train_loader(cfg)
        model = self.build_model(cfg)
        optimizer = self.build_optimizer(cfg, model)
        self.model_teacher = self.build_model(cfg)
        if comm.get_world_size() > 1:
            model = DistributedDataParallel(model, broadcast_buffers=False)
        TrainerBase.__init__(self)
        self._trainer = SimpleTrainer(model, data_loader, optimizer)
        self.scheduler = self.build_lr_scheduler(cfg, optimizer)
        self.checkpointer = TSCheckpointer(
            EnsembleTSModel(self.model_teacher, model),
            cfg.OUTPUT_DIR,
            optimizer=optimizer,
            scheduler=self.scheduler,
        )
        self.start_iter = 0
        self.max_iter = cfg.SOLVER.MAX_ITER
        self.cfg = cfg
        self.register_hooks(self.build_hooks())

    def resume_or_load(self, resume=True):
        checkpoint = self.checkpointer.resume_or_load(self.cfg.MODEL.WEIGHTS, resume=resume)
        if resume and self.checkpointer.has_checkpoint():
            self.start_iter = checkpoint.get("iteration", -1) + 1
        if isinstance(self.model, DistributedDataParallel):
            self.start_iter = comm.all_gather(self.start_iter)[0]

    @classmethod
    def build_train_loader(cls, cfg):
        return SemiSupLoader(cfg)

    @classmethod
    def build_evaluator(cls, cfg, dataset_name, output_folder=None):
        return ClassificationEvaluator(dataset_name, topk=(1,))

    @classmethod
    def build_test_loader(cls, cfg, dataset_name):
        from trainkit.data import build_detection_test_loader

        return build_detection_test_loader(dataset=DatasetCatalog.get(dataset_name), mapper=_map)

    def train(self):
        self.train_loop(self.start_iter, self.max_iter)
        return getattr(self, "_last_eval_results_teacher", {})

    def train_loop(self, start_iter, max_iter):
        print(f"Starting training from iteration {start_iter}")
        self.iter = self.start_iter = start_iter
        self.max_iter = max_iter
        with EventStorage(start_iter) as self.storage:
            try:
                self.before_train()
                for self.iter in range(start_iter, max_iter):
                    self.before_step()
                    self.run_step_full_semisup()
                    self.after_step()
            finally:
                self.after_train()

    def run_step_full_semisup(self):
        self._trainer.iter = self.iter
        start = time.perf_counter()
        label_q, label_k, unlabel_q, unlabel_k = next(self._trainer._data_loader_iter)
        data_time = time.perf_counter() - start
        if self.iter < self.cfg.SEMISUPNET.BURN_UP_STEP:
            record_dict = self.model(label_q + label_k)
            losses = sum(record_dict.values())
        else:
            keep_rate = 0.0 if self.iter == self.cfg.SEMISUPNET.BURN_UP_STEP else None
            self._update_teacher_model(keep_rate)
            with torch.no_grad():
                probs = self.model_teacher(unlabel_k, branch="unsup_data_weak")
            scores, classes = probs.max(dim=1)
            for datum, score, cls in zip(unlabel_q, scores, classes):
                passed = score > self.cfg.SEMISUPNET.THRESHOLD
                datum["instances"] = cls[None] if passed else torch.zeros(0, dtype=torch.long)
            record_dict = dict(self.model(label_q + label_k))
            record_dict["loss_cls_pseudo"] = self.model(unlabel_q)["loss_cls"]
            losses = record_dict["loss_cls"] + (
                record_dict["loss_cls_pseudo"] * self.cfg.SEMISUPNET.UNSUP_LOSS_WEIGHT
            )
        metrics = dict(record_dict, data_time=data_time)
        self._write_metrics(metrics)
        self.optimizer.zero_grad()
        losses.backward()
        self.optimizer.step()

    def _write_metrics(self, metrics_dict):
        metrics_dict = {
            k: v.detach().cpu().item() if isinstance(v, torch.Tensor) else float(v)
            for k, v in metrics_dict.items()
        }
        all_metrics = comm.gather(metrics_dict)
        if comm.is_main_process():
            data_time = np.max([x.pop("data_time") for x in all_metrics])
            self.storage.put_scalar("data_time", data_time)
            metrics_dict = {k: np.mean([x[k] for x in all_metrics]) for k in all_metrics[0]}
            self.storage.put_scalar("total_loss", sum(metrics_dict.values()))
            self.storage.put_scalars(**metrics_dict)

    @torch.no_grad()
    def _update_teacher_model(self, keep_rate=None):
        keep_rate = self.cfg.SEMISUPNET.EMA_KEEP_RATE if keep_rate is None else keep_rate
        student = self.model.module if comm.get_world_size() > 1 else self.model
        student_dict = student.state_dict()
        new_teacher = OrderedDict(
            (k, student_dict[k] * (1 - keep_rate) + v * keep_rate)
            for k, v in self.model_teacher.state_dict().items()
        )
        self.model_teacher.load_state_dict(new_teacher)

    def build_hooks(self):
        ret = [hooks.IterationTimer(), hooks.LRScheduler(self.optimizer, self.scheduler)]
        if comm.is_main_process():
            ret.append(
                hooks.PeriodicCheckpointer(self.checkpointer, self.cfg.SOLVER.CHECKPOINT_PERIOD)
            )

        def test_student():
            results = self.test(self.cfg, self.model)
            return {k + "_student": v for k, v in results.items()}

        def test_teacher():
            self._last_eval_results_teacher = self.test(self.cfg, self.model_teacher)
            return self._last_eval_results_teacher

        ret.append(hooks.EvalHook(self.cfg.TEST.EVAL_PERIOD, test_student))
        ret.append(hooks.EvalHook(self.cfg.TEST.EVAL_PERIOD, test_teacher))
        if comm.is_main_process():
            ret.append(hooks.PeriodicWriter(self.build_writers(), period=4))
        return ret


def setup(args):
    cfg = get_cfg()
    add_semisup_config(cfg)
    cfg.merge_from_list(
        [
            "MODEL.META_ARCHITECTURE", "PseudoLabClassifier",
            "MODEL.NUM_CLASSES", 3,
            "DATASETS.TEST", ("semisup_val",),
            "DATALOADER.NUM_WORKERS", 0,
            "SOLVER.BASE_LR", 0.1,
            "SOLVER.MAX_ITER", 12,
            "SOLVER.STEPS", (10,),
            "SOLVER.WARMUP_ITERS", 2,
            "SOLVER.CHECKPOINT_PERIOD", 6,
            "TEST.EVAL_PERIOD", 6,
            "SEED", 5,
        ]
    )  # fmt: skip
    cfg.merge_from_list(args.opts)
    cfg.freeze()
    default_setup(cfg, args)
    return cfg


def main(args):
    cfg = setup(args)
    if args.eval_only:
        model = SemiSupTrainer.build_model(cfg)
        ensemble = EnsembleTSModel(SemiSupTrainer.build_model(cfg), model)
        TSCheckpointer(ensemble, save_dir=cfg.OUTPUT_DIR).resume_or_load(
            cfg.MODEL.WEIGHTS, resume=args.resume
        )
        results = SemiSupTrainer.test(cfg, ensemble.modelTeacher)
        if comm.is_main_process():
            with open(os.path.join(cfg.OUTPUT_DIR, "eval_only.json"), "w") as f:
                json.dump(results, f)
        return results
    trainer = SemiSupTrainer(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


if __name__ == "__main__":
    args = default_argument_parser().parse_args()
    launch(
        main,
        args.num_gpus,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        dist_url=args.dist_url,
        args=(args,),
    )
