"""A detectron2 project's config code and YAML files, used with trainkit's get_cfg unchanged."""

import textwrap

import pytest

from trainkit.config import CfgNode as CN
from trainkit.config import ConfigError, get_cfg


def add_segmentation_project_config(cfg):
    """What a segmentation project's add_*_config() does: extend detectron2's nodes."""
    cfg.MODEL.SEM_SEG_HEAD.LOSS_TYPE = "hard_pixel_mining"
    cfg.MODEL.SEM_SEG_HEAD.PROJECT_FEATURES = ["res2"]
    cfg.MODEL.SEM_SEG_HEAD.ASPP_DILATIONS = [6, 12, 18]
    cfg.MODEL.RESNETS.RES5_MULTI_GRID = [1, 2, 4]
    cfg.MODEL.BACKBONE.FREEZE_AT = 0
    cfg.INPUT.CROP.SINGLE_CATEGORY_MAX_AREA = 1.0
    cfg.INPUT.COLOR_AUG_SSD = False
    cfg.SOLVER.POLY_LR_POWER = 0.9
    cfg.SOLVER.POLY_LR_CONSTANT_ENDING = 0.0
    cfg.TEST.VAL_LOSS = True  # a semi-supervised project's switch: trainkit's validation loss
    cfg.PROJECT = CN()
    cfg.PROJECT.TEACHER_MOMENTUM = 0.9996


def _write(path, text):
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_add_config_extends_detectron2_nodes():
    cfg = get_cfg()
    add_segmentation_project_config(cfg)
    assert cfg.MODEL.SEM_SEG_HEAD.LOSS_TYPE == "hard_pixel_mining"
    assert cfg.MODEL.SEM_SEG_HEAD.IGNORE_VALUE == 255  # detectron2's key beside the new one
    assert cfg.INPUT.CROP.SINGLE_CATEGORY_MAX_AREA == 1.0
    assert cfg.SOLVER.POLY_LR_POWER == 0.9
    assert cfg.TEST.VAL_LOSS is True
    assert cfg.MODEL.BACKBONE.FREEZE_AT == 0
    # the keys it added are then known to the strict merge
    cfg.merge_from_list(["SOLVER.POLY_LR_POWER", "1.0", "INPUT.CROP.SIZE", "[512, 1024]"])
    assert (cfg.SOLVER.POLY_LR_POWER, cfg.INPUT.CROP.SIZE) == (1.0, [512, 1024])


def test_detectron2_yaml_with_base_and_version_2_merges(tmp_path):
    _write(
        tmp_path / "Base-Segmentation.yaml",
        """\
        VERSION: 2
        MODEL:
          META_ARCHITECTURE: "ImageClassifier"
          BACKBONE:
            NAME: "build_resnet_deeplab_backbone"
          RESNETS:
            DEPTH: 101
            OUT_FEATURES: ["res2", "res5"]
            NORM: "SyncBN"
            STRIDE_IN_1X1: False
          SEM_SEG_HEAD:
            NAME: "DeepLabV3PlusHead"
            IN_FEATURES: ["res2", "res5"]
            NUM_CLASSES: 19
            LOSS_TYPE: "hard_pixel_mining"
          PIXEL_MEAN: [123.675, 116.28, 103.53]
          PIXEL_STD: [58.395, 57.12, 57.375]
        INPUT:
          MIN_SIZE_TRAIN: (512, 768, 1024, 1280)
          MIN_SIZE_TRAIN_SAMPLING: "choice"
          MIN_SIZE_TEST: 1024
          MAX_SIZE_TRAIN: 4096
          MAX_SIZE_TEST: 2048
          CROP:
            ENABLED: True
            TYPE: "absolute"
            SIZE: (512, 1024)
            SINGLE_CATEGORY_MAX_AREA: 1.0
          FORMAT: "RGB"
        DATALOADER:
          NUM_WORKERS: 10
        SOLVER:
          BASE_LR: 0.01
          MAX_ITER: 90000
          STEPS: (60000, 80000)
          LR_SCHEDULER_NAME: "WarmupPolyLR"
          POLY_LR_POWER: 0.9
        TEST:
          AUG:
            ENABLED: False
            MIN_SIZES: (512, 768)
            FLIP: True
        """,
    )
    leaf = _write(
        tmp_path / "deeplab_R_101.yaml",
        """\
        _BASE_: Base-Segmentation.yaml
        MODEL:
          WEIGHTS: ""
          RESNETS:
            RES5_MULTI_GRID: [1, 2, 4]
        SOLVER:
          IMS_PER_BATCH: 8
        """,
    )
    cfg = get_cfg()
    add_segmentation_project_config(cfg)
    cfg.merge_from_file(leaf)
    assert cfg.VERSION == 2
    assert cfg.MODEL.BACKBONE.NAME == "build_resnet_deeplab_backbone"
    assert cfg.MODEL.RESNETS.DEPTH == 101
    assert cfg.MODEL.RESNETS.RES5_MULTI_GRID == [1, 2, 4]
    assert cfg.MODEL.SEM_SEG_HEAD.NUM_CLASSES == 19
    assert cfg.INPUT.MIN_SIZE_TRAIN == (512, 768, 1024, 1280)  # the string read as a tuple
    assert (cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TRAIN) == (1024, 4096)
    assert cfg.INPUT.CROP.SIZE == [512, 1024]  # coerced to the default's list
    assert cfg.SOLVER.STEPS == (60000, 80000)
    assert cfg.SOLVER.IMS_PER_BATCH == 8
    assert cfg.TEST.AUG.MIN_SIZES == (512, 768)
    assert cfg.get_origin("INPUT.MIN_SIZE_TRAIN").endswith("Base-Segmentation.yaml:19")


def test_project_keys_still_need_the_project_config_function(tmp_path):
    # As in detectron2: a key neither detectron2 nor the project's add_*_config() defines is
    # refused, with the closest key named.
    path = _write(tmp_path / "bad.yaml", "SOLVER:\n  POLY_LR_POWR: 0.9\n")
    cfg = get_cfg()
    add_segmentation_project_config(cfg)
    with pytest.raises(ConfigError, match="Did you mean SOLVER.POLY_LR_POWER"):
        cfg.merge_from_file(path)
