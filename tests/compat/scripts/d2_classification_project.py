"""An image-classification project on detectron2's engine, with ``detectron2`` -> ``trainkit``.

Written for trainkit's tests in the shape of such public projects (a classification
meta-architecture over a registered backbone, an ``add_*_config`` that extends detectron2's
defaults, a ``DatasetMapper`` subclass of the 0.1 era that sets ``tfm_gens``, a JSON dataset
registered with an ``evaluator_type``, an evaluator of its own, detectron2's ``train_net.py``
main with its detection-only imports kept). Run it as such a project's README says::

    python d2_classification_project.py --config-file cls.yaml [--num-gpus 2] [--resume]
"""

import itertools
import json
import os
from collections import OrderedDict

import torch
from torch import nn

import trainkit.data.transforms as T
import trainkit.utils.comm as comm
from trainkit.checkpoint import DetectionCheckpointer
from trainkit.config import CfgNode as CN
from trainkit.config.defaults import _C
from trainkit.data import (
    DatasetCatalog,
    MetadataCatalog,
    build_detection_test_loader,
    build_detection_train_loader,
)
from trainkit.data.dataset_mapper import DatasetMapper as _DatasetMapper
from trainkit.engine import DefaultTrainer, default_argument_parser, default_setup, launch
from trainkit.evaluation import (  # noqa: F401  (imported, as train_net.py does, never used)
    CityscapesEvaluator,
    COCOEvaluator,
    DatasetEvaluator,
    PascalVOCDetectionEvaluator,
    verify_results,
)
from trainkit.layers import Conv2d, ShapeSpec, batched_nms, cat  # noqa: F401
from trainkit.modeling.anchor_generator import build_anchor_generator  # noqa: F401
from trainkit.modeling.backbone import Backbone
from trainkit.modeling.backbone.build import BACKBONE_REGISTRY, build_backbone
from trainkit.modeling.backbone.fpn import FPN  # noqa: F401
from trainkit.modeling.meta_arch.build import META_ARCH_REGISTRY
from trainkit.structures import ImageList

# ---- config: the project's keys, added to detectron2's defaults -------------------------
_C.MODEL.TINYNET = CN()
_C.MODEL.TINYNET.WIDTH = 8
_C.MODEL.CLSNET = CN()
_C.MODEL.CLSNET.NUM_CLASSES = 1000
_C.MODEL.CLSNET.INPUT_SIZE = 224


def get_cfg():
    return _C.clone()


# ---- data ------------------------------------------------------------------------------
def register_json_classification(name, json_file):
    DatasetCatalog.register(name, lambda: json.load(open(json_file)))
    MetadataCatalog.get(name).set(json_file=json_file, evaluator_type="classification")


_root = os.environ.get("CLS_PROJECT_DATA", "datasets")
register_json_classification("tiny_cls_train", os.path.join(_root, "train.json"))
register_json_classification("tiny_cls_val", os.path.join(_root, "val.json"))


class DatasetMapper(_DatasetMapper):
    def __init__(self, cfg, is_train=True):
        super().__init__(cfg, is_train)
        size = cfg.MODEL.CLSNET.INPUT_SIZE
        gens = [T.Resize((size, size))]
        if is_train:
            gens += [T.RandomBrightness(0.8, 1.2), T.RandomFlip()]
        self.tfm_gens = gens


# ---- model -----------------------------------------------------------------------------
class TinyNet(Backbone):
    def __init__(self, in_channels, width, num_classes):
        super().__init__()
        self.stem = Conv2d(in_channels, width, 3, stride=2, padding=1, activation=nn.ReLU())
        self.body = Conv2d(width, 2 * width, 3, stride=2, padding=1, activation=nn.ReLU())
        self.linear = nn.Linear(2 * width, num_classes)
        self._out_features = ["linear"]
        self._out_feature_channels = {"linear": num_classes}
        self._out_feature_strides = {"linear": 1}

    def forward(self, x):
        x = self.body(self.stem(x))
        return {"linear": self.linear(x.mean(dim=(2, 3)))}


@BACKBONE_REGISTRY.register()
def build_tinynet_backbone(cfg, input_shape: ShapeSpec):
    return TinyNet(input_shape.channels, cfg.MODEL.TINYNET.WIDTH, cfg.MODEL.CLSNET.NUM_CLASSES)


@META_ARCH_REGISTRY.register()
class ClsNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.bottom_up = build_backbone(cfg)
        self.register_buffer("pixel_mean", torch.Tensor(cfg.MODEL.PIXEL_MEAN).view(-1, 1, 1))
        self.register_buffer("pixel_std", torch.Tensor(cfg.MODEL.PIXEL_STD).view(-1, 1, 1))

    @property
    def device(self):
        return self.pixel_mean.device

    def forward(self, batched_inputs):
        images = [
            (x["image"].to(self.device) - self.pixel_mean) / self.pixel_std for x in batched_inputs
        ]
        images = ImageList.from_tensors(images)
        logits = self.bottom_up(images.tensor)["linear"]
        if self.training:
            labels = torch.as_tensor([x["label"] for x in batched_inputs], device=self.device)
            return {"loss_cls": nn.functional.cross_entropy(logits, labels)}
        return [{"pred_classes": row.topk(1).indices} for row in logits]


# ---- evaluation ------------------------------------------------------------------------
class TopOneEvaluator(DatasetEvaluator):
    def __init__(self, dataset_name):
        self._dataset_name = dataset_name

    def reset(self):
        self._predictions = []

    def process(self, inputs, outputs):
        for inp, out in zip(inputs, outputs):
            self._predictions.append((inp["label"], int(out["pred_classes"][0])))

    def evaluate(self):
        comm.synchronize()
        predictions = list(itertools.chain(*comm.gather(self._predictions, dst=0)))
        if not comm.is_main_process():
            return {}
        correct = sum(gt == pred for gt, pred in predictions)
        return OrderedDict(
            accuracy={"top1": 100.0 * correct / len(predictions), "count": len(predictions)}
        )


class Trainer(DefaultTrainer):
    @classmethod
    def build_train_loader(cls, cfg):
        return build_detection_train_loader(cfg, mapper=DatasetMapper(cfg, True))

    @classmethod
    def build_test_loader(cls, cfg, dataset_name):
        return build_detection_test_loader(cfg, dataset_name, mapper=DatasetMapper(cfg, False))

    @classmethod
    def build_evaluator(cls, cfg, dataset_name, output_folder=None):
        evaluator_type = MetadataCatalog.get(dataset_name).evaluator_type
        if evaluator_type == "classification":
            return TopOneEvaluator(dataset_name)
        if evaluator_type == "coco":
            return COCOEvaluator(dataset_name, cfg, True, output_folder)
        raise NotImplementedError(f"no evaluator for {dataset_name} ({evaluator_type})")


def setup(args):
    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
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
        res = Trainer.test(cfg, model)
        if comm.is_main_process():
            verify_results(cfg, res)
            with open(os.path.join(cfg.OUTPUT_DIR, "eval_only.json"), "w") as f:
                json.dump(res, f)
        return res
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
