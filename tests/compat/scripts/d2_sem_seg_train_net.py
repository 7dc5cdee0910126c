"""A semantic-segmentation project in the shape of detectron2's projects/DeepLab, on trainkit.

The pieces such a project brings, written here for trainkit's tests: an ``add_*_config``
that extends ``MODEL.SEM_SEG_HEAD`` and ``SOLVER``, a head in ``SEM_SEG_HEADS_REGISTRY``
built on ``ASPP``, a backbone in ``BACKBONE_REGISTRY``, its own warm-up/poly LR scheduler on
``_get_warmup_factor_at_iter``, a folder dataset registered through ``load_sem_seg``, a
``DatasetMapper`` with ResizeShortestEdge + RandomCrop_CategoryAreaConstraint + RandomFlip,
``SemSegEvaluator``, and a ``DefaultTrainer`` subclass run by ``launch``.
"""

import math
import os

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.nn import functional as F

import trainkit.data.transforms as T
from trainkit.checkpoint import DetectionCheckpointer
from trainkit.config import get_cfg
from trainkit.data import (
    DatasetCatalog,
    DatasetMapper,
    MetadataCatalog,
    build_detection_train_loader,
)
from trainkit.data.datasets import load_sem_seg
from trainkit.engine import DefaultTrainer, default_argument_parser, default_setup, launch
from trainkit.evaluation import SemSegEvaluator
from trainkit.layers import ASPP, Conv2d, ShapeSpec, get_norm
from trainkit.modeling import BACKBONE_REGISTRY, SEM_SEG_HEADS_REGISTRY, Backbone
from trainkit.solver.lr_scheduler import _get_warmup_factor_at_iter


def add_toyseg_config(cfg):
    cfg.INPUT.CROP.SINGLE_CATEGORY_MAX_AREA = 1.0
    cfg.SOLVER.POLY_LR_POWER = 0.9
    cfg.MODEL.SEM_SEG_HEAD.ASPP_CHANNELS = 8
    cfg.MODEL.SEM_SEG_HEAD.ASPP_DILATIONS = [1, 2, 3]


def _write_split(root, split, count, seed):
    """Images with a red and a blue rectangle on grey; labels 0 (grey), 1 (red), 2 (blue)."""
    image_dir, label_dir = f"{root}/{split}/images", f"{root}/{split}/labels"
    os.makedirs(image_dir, exist_ok=True)
    os.makedirs(label_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    colours = np.array([[90, 90, 90], [210, 30, 30], [30, 30, 210]], np.uint8)
    for i in range(count):
        label = np.zeros((64, 96), np.uint8)
        for cls in (1, 2):
            y, x = rng.integers(0, 40), rng.integers(0, 64)
            label[y : y + 24, x : x + 32] = cls
        label[:2, :2] = 255  # ignored pixels
        Image.fromarray(colours[np.minimum(label, 2)]).save(f"{image_dir}/{i:02d}.jpg")
        Image.fromarray(label).save(f"{label_dir}/{i:02d}.png")
    return label_dir, image_dir


def register_toyseg(root):
    for split, count, seed in (("train", 12, 0), ("val", 4, 1)):
        name = f"toyseg_{split}"
        if name in DatasetCatalog:
            continue
        gt_dir, image_dir = _write_split(root, split, count, seed)
        DatasetCatalog.register(name, lambda g=gt_dir, i=image_dir: load_sem_seg(g, i))
        MetadataCatalog.get(name).set(
            stuff_classes=["grey", "red", "blue"], evaluator_type="sem_seg", ignore_label=255
        )


@BACKBONE_REGISTRY.register()
class ToySegBackbone(Backbone):
    def __init__(self, cfg, input_shape):
        super().__init__()
        self.stem = Conv2d(input_shape.channels, 8, 3, stride=4, padding=1, activation=F.relu)
        self.res5 = Conv2d(8, 16, 3, stride=2, padding=1, activation=F.relu)
        self._out_features = ["res5"]
        self._out_feature_channels = {"res5": 16}
        self._out_feature_strides = {"res5": 8}

    def forward(self, x):
        return {"res5": self.res5(self.stem(x))}


@SEM_SEG_HEADS_REGISTRY.register()
class ToyASPPHead(nn.Module):
    def __init__(self, cfg, input_shape: dict[str, ShapeSpec]):
        super().__init__()
        head = cfg.MODEL.SEM_SEG_HEAD
        self.in_feature = head.IN_FEATURES[0]
        self.ignore_value = head.IGNORE_VALUE
        self.common_stride = head.COMMON_STRIDE
        crop_h, crop_w = cfg.INPUT.CROP.SIZE
        self.aspp = ASPP(
            input_shape[self.in_feature].channels,
            head.ASPP_CHANNELS,
            head.ASPP_DILATIONS,
            norm=head.NORM,
            activation=F.relu,
            pool_kernel_size=(crop_h // self.common_stride, crop_w // self.common_stride),
        )
        self.predictor = Conv2d(head.ASPP_CHANNELS, head.NUM_CLASSES, 1)
        get_norm(head.NORM, 4)  # the norm name must be one trainkit knows

    def forward(self, features, targets=None):
        x = self.predictor(self.aspp(features[self.in_feature]))
        x = F.interpolate(x, scale_factor=self.common_stride, mode="bilinear", align_corners=False)
        if self.training:
            loss = F.cross_entropy(x, targets, ignore_index=self.ignore_value)
            return None, {"loss_sem_seg": loss}
        return x, {}


class WarmupPolyLR(torch.optim.lr_scheduler.LRScheduler):
    def __init__(self, optimizer, max_iters, warmup_factor, warmup_iters, power):
        self.max_iters, self.warmup_factor = max_iters, warmup_factor
        self.warmup_iters, self.power = warmup_iters, power
        super().__init__(optimizer)

    def get_lr(self):
        warmup = _get_warmup_factor_at_iter(
            "linear", self.last_epoch, self.warmup_iters, self.warmup_factor
        )
        decay = math.pow(1.0 - self.last_epoch / self.max_iters, self.power)
        return [base_lr * warmup * decay for base_lr in self.base_lrs]


def build_sem_seg_train_aug(cfg):
    return [
        T.ResizeShortestEdge(
            cfg.INPUT.MIN_SIZE_TRAIN, cfg.INPUT.MAX_SIZE_TRAIN, cfg.INPUT.MIN_SIZE_TRAIN_SAMPLING
        ),
        T.RandomCrop_CategoryAreaConstraint(
            cfg.INPUT.CROP.TYPE,
            cfg.INPUT.CROP.SIZE,
            cfg.INPUT.CROP.SINGLE_CATEGORY_MAX_AREA,
            cfg.MODEL.SEM_SEG_HEAD.IGNORE_VALUE,
        ),
        T.RandomFlip(),
    ]


class Trainer(DefaultTrainer):
    @classmethod
    def build_evaluator(cls, cfg, dataset_name, output_folder=None):
        return SemSegEvaluator(
            dataset_name,
            distributed=True,
            num_classes=cfg.MODEL.SEM_SEG_HEAD.NUM_CLASSES,
            ignore_label=cfg.MODEL.SEM_SEG_HEAD.IGNORE_VALUE,
            output_dir=output_folder or os.path.join(cfg.OUTPUT_DIR, "inference"),
        )

    @classmethod
    def build_train_loader(cls, cfg):
        mapper = DatasetMapper(cfg, is_train=True, augmentations=build_sem_seg_train_aug(cfg))
        return build_detection_train_loader(cfg, mapper=mapper)

    @classmethod
    def build_lr_scheduler(cls, cfg, optimizer):
        return WarmupPolyLR(
            optimizer,
            cfg.SOLVER.MAX_ITER,
            cfg.SOLVER.WARMUP_FACTOR,
            cfg.SOLVER.WARMUP_ITERS,
            cfg.SOLVER.POLY_LR_POWER,
        )


def setup(args):
    cfg = get_cfg()
    add_toyseg_config(cfg)
    cfg.merge_from_list(
        [
            "MODEL.META_ARCHITECTURE", "SemanticSegmentor",
            "MODEL.BACKBONE.NAME", "ToySegBackbone",
            "MODEL.PIXEL_MEAN", [128.0, 128.0, 128.0],
            "MODEL.PIXEL_STD", [64.0, 64.0, 64.0],
            "MODEL.SEM_SEG_HEAD.NAME", "ToyASPPHead",
            "MODEL.SEM_SEG_HEAD.IN_FEATURES", ["res5"],
            "MODEL.SEM_SEG_HEAD.NUM_CLASSES", 3,
            "MODEL.SEM_SEG_HEAD.COMMON_STRIDE", 8,
            "MODEL.SEM_SEG_HEAD.NORM", "",
            "DATASETS.TRAIN", ("toyseg_train",),
            "DATASETS.TEST", ("toyseg_val",),
            "DATALOADER.NUM_WORKERS", 0,
            "INPUT.MIN_SIZE_TRAIN", (48, 56),
            "INPUT.MIN_SIZE_TRAIN_SAMPLING", "choice",
            "INPUT.MAX_SIZE_TRAIN", 120,
            "INPUT.MIN_SIZE_TEST", 64,
            "INPUT.MAX_SIZE_TEST", 96,
            "INPUT.CROP.ENABLED", True,
            "INPUT.CROP.TYPE", "absolute",
            "INPUT.CROP.SIZE", (32, 32),
            "SOLVER.IMS_PER_BATCH", 4,
            "SOLVER.BASE_LR", 0.05,
            "SOLVER.MAX_ITER", 8,
            "SOLVER.WARMUP_ITERS", 2,
            "SOLVER.CHECKPOINT_PERIOD", 4,
            "TEST.EVAL_PERIOD", 8,
            "SEED", 3,
        ]
    )  # fmt: skip
    cfg.merge_from_list(args.opts)
    cfg.freeze()
    default_setup(cfg, args)
    return cfg


def main(args):
    cfg = setup(args)
    register_toyseg(os.path.join(os.path.dirname(os.path.abspath(cfg.OUTPUT_DIR)), "toyseg"))
    if args.eval_only:
        model = Trainer.build_model(cfg)
        DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR).resume_or_load(
            cfg.MODEL.WEIGHTS, resume=args.resume
        )
        return Trainer.test(cfg, model)
    trainer = Trainer(cfg)
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
