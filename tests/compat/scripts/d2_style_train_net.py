"""A training script written for detectron2, with ``detectron2`` replaced by ``trainkit``.

Nothing else differs from how a detectron2 user writes one: a @configurable model in the
meta-architecture registry, a @configurable mapper, datasets in DatasetCatalog,
build_detection_train_loader(cfg, mapper=...), DetectionCheckpointer, EventStorage used from
inside the model, a custom hook, a DefaultTrainer subclass, default_setup and launch.
"""

import json
import os

import numpy as np
import torch
from torch import nn

from trainkit.checkpoint import DetectionCheckpointer
from trainkit.config import configurable, get_cfg
from trainkit.data import DatasetCatalog, MetadataCatalog, build_detection_train_loader
from trainkit.engine import DefaultTrainer, default_argument_parser, default_setup, hooks, launch
from trainkit.modeling import META_ARCH_REGISTRY
from trainkit.utils import comm
from trainkit.utils.events import get_event_storage


def _toy_dicts(n, seed):
    rng = np.random.default_rng(seed)
    return [
        {
            "image_id": i,
            "x": rng.normal(size=4).tolist(),
            "label": int(i % 3),
            "height": 4,
            "width": 4 + (i % 2),
        }
        for i in range(n)
    ]


DatasetCatalog.register("toy_train", lambda: _toy_dicts(96, 0))
MetadataCatalog.get("toy_train").set(thing_classes=["a", "b", "c"])


class ToyMapper:
    @configurable
    def __init__(self, is_train: bool, noise: float):
        self.is_train = is_train
        self.noise = noise

    @classmethod
    def from_config(cls, cfg, is_train=True):
        return {"is_train": is_train, "noise": cfg.GLOBAL.HACK * 0.01}

    def __call__(self, dataset_dict):
        x = torch.tensor(dataset_dict["x"], dtype=torch.float32)
        if self.is_train:
            x = x + self.noise
        return {"x": x, "label": torch.tensor(dataset_dict["label"])}


@META_ARCH_REGISTRY.register()
class ToyClassifier(nn.Module):
    @configurable
    def __init__(self, *, num_classes: int, hidden: int = 8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    @classmethod
    def from_config(cls, cfg):
        return {"num_classes": cfg.MODEL.NUM_CLASSES}

    def forward(self, batched_inputs):
        x = torch.stack([b["x"] for b in batched_inputs])
        logits = self.net(x)
        if not self.training:
            return logits
        labels = torch.stack([b["label"] for b in batched_inputs])
        accuracy = (logits.argmax(1) == labels).float().mean()
        get_event_storage().put_scalar("toy/accuracy", accuracy.item())
        return {"loss_cls": nn.functional.cross_entropy(logits, labels)}


class RecordIterations(hooks.HookBase):
    def __init__(self, path):
        self.path = path
        self.seen = []

    def after_step(self):
        self.seen.append(self.trainer.iter)

    def after_train(self):
        if comm.is_main_process():
            with open(self.path, "w") as f:
                json.dump({"seen": self.seen, "max_iter": self.trainer.max_iter}, f)


class Trainer(DefaultTrainer):
    @classmethod
    def build_train_loader(cls, cfg):
        return build_detection_train_loader(cfg, mapper=ToyMapper(cfg, is_train=True))

    def build_hooks(self):
        ret = super().build_hooks()
        ret.append(RecordIterations(os.path.join(self.cfg.OUTPUT_DIR, "seen.json")))
        return ret


def setup(args):
    cfg = get_cfg()
    cfg.MODEL.META_ARCHITECTURE = "ToyClassifier"
    cfg.MODEL.NUM_CLASSES = 3
    cfg.DATASETS.TRAIN = ("toy_train",)
    cfg.DATASETS.TEST = ()
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.SOLVER.IMS_PER_BATCH = 8
    cfg.SOLVER.BASE_LR = 0.1
    cfg.SOLVER.MAX_ITER = 12
    cfg.SOLVER.STEPS = (8,)
    cfg.SOLVER.WARMUP_ITERS = 2
    cfg.SOLVER.CHECKPOINT_PERIOD = 6
    cfg.merge_from_list(args.opts)
    cfg.freeze()
    default_setup(cfg, args)
    return cfg


def main(args):
    cfg = setup(args)
    if args.eval_only:
        model = Trainer.build_model(cfg)
        DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR).resume_or_load(
            cfg.MODEL.WEIGHTS, resume=args.resume
        )
        return {"weights_sum": float(sum(p.sum() for p in model.parameters()))}
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
    )
