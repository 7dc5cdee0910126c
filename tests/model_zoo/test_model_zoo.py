"""trainkit.model_zoo: shipped configs by name, package data, and no published weights."""

import importlib.resources
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from fvcore.common.param_scheduler import MultiStepParamScheduler

from trainkit import model_zoo
from trainkit.config import CfgNode, instantiate
from trainkit.modeling.image_classifier import ImageClassifier
from trainkit.solver import WarmupParamScheduler
from trainkit.utils.errors import MissingFileError, UsageError

ROOT = Path(__file__).resolve().parents[2]


def test_common_files_resolve_through_the_package_data():
    packaged = importlib.resources.files("trainkit.model_zoo").joinpath("configs")
    for name in ("train.py", "optim.py", "coco_schedule.py"):
        assert packaged.joinpath("common", name).is_file()
        assert model_zoo.get_config_file(f"common/{name}") == str(packaged.joinpath("common", name))


def test_common_train_has_detectron2s_keys():
    train = model_zoo.get_config("common/train.py").train
    assert set(train) >= {
        "output_dir", "init_checkpoint", "max_iter", "amp", "ddp", "checkpointer",
        "eval_period", "log_period", "device",
    }  # fmt: skip
    assert set(train.ddp) == {"broadcast_buffers", "find_unused_parameters", "fp16_compression"}
    assert set(train.checkpointer) == {"period", "max_to_keep"}
    assert train.amp.enabled is False and train.init_checkpoint == ""


def test_common_optimizers_build_with_the_model_set_afterwards():
    optim = model_zoo.get_config("common/optim.py")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    sgd_cfg = optim.SGD
    sgd_cfg.params.model = model
    sgd = instantiate(sgd_cfg)
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["lr"] == 0.02
    assert {g["weight_decay"] for g in sgd.param_groups} == {0.0, 1e-4}  # norms undecayed
    adamw_cfg = optim.AdamW
    adamw_cfg.params.model = model
    adamw_cfg.lr = 0.003
    adamw = instantiate(adamw_cfg)
    # params.base_lr follows optimizer.lr through the interpolation.
    assert isinstance(adamw, torch.optim.AdamW)
    assert {g["lr"] for g in adamw.param_groups} == {0.003}


def test_coco_schedules_are_warmed_up_multi_steps():
    schedules = model_zoo.get_config("common/coco_schedule.py")
    assert {"lr_multiplier_1x", "lr_multiplier_3x", "lr_multiplier_9x"} <= set(schedules)
    one_x = instantiate(schedules.lr_multiplier_1x)
    assert isinstance(one_x, WarmupParamScheduler)
    assert schedules.lr_multiplier_1x.scheduler._target_ is MultiStepParamScheduler
    # warm-up from 0.001 over 1000 of 90000 iterations, then 1, 0.1 at 2/3, 0.01 at 8/9
    assert one_x(0.0) == pytest.approx(0.001)
    assert one_x(0.5) == pytest.approx(1.0)
    assert one_x(0.7) == pytest.approx(0.1)
    assert one_x(0.95) == pytest.approx(0.01)
    three_x = instantiate(schedules.lr_multiplier_3x)
    # 270k iterations: the drops come 60k and 20k before the end
    assert three_x((270000 - 60001) / 270000) == pytest.approx(1.0)
    assert three_x((270000 - 59000) / 270000) == pytest.approx(0.1)


def test_trainkits_own_configs_load_as_cfgnode_and_lazyconfig():
    cfg = model_zoo.get_config("shapes/cnn_small.yaml")
    assert isinstance(cfg, CfgNode) and cfg.SOLVER.MAX_ITER == 1500
    lazy = model_zoo.get_config("shapes/cnn_small.py")
    assert lazy.train.max_iter == 1500
    model = model_zoo.get("shapes/cnn_small.yaml")
    assert isinstance(model, ImageClassifier) and model.training
    assert isinstance(model_zoo.get("shapes/cnn_small.py"), ImageClassifier)


def test_unknown_configs_and_trained_weights_are_one_line_usage_errors():
    with pytest.raises(MissingFileError, match=r"no config 'common/trian\.py'\. Did you mean"):
        model_zoo.get_config_file("common/trian.py")
    for call in (
        lambda: model_zoo.get_checkpoint_url("COCO-Detection/faster_rcnn_R_50_FPN_1x.yaml"),
        lambda: model_zoo.get_config("common/train.py", trained=True),
    ):
        with pytest.raises(UsageError) as info:
            call()
        message = str(info.value)
        assert "\n" not in message
        assert "no model zoo weights" in message and "detectron2://" in message


@pytest.mark.parametrize(
    "path",
    [
        "COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.py",
        "COCO-Detection/faster_rcnn_R_50_FPN_1x.yaml",
        "common/data/coco.py",
        "common/models/mask_rcnn_fpn.py",
    ],
)
def test_detectron2_detection_configs_say_they_are_detection_only(path):
    with pytest.raises(MissingFileError) as info:
        model_zoo.get_config(path)
    message = str(info.value)
    assert "\n" not in message and "Did you mean" not in message
    assert f"{path!r} is one of detectron2's detection configs" in message
    assert "detection-only" in message


def test_detectron2_import_path():
    from trainkit.model_zoo.model_zoo import get_checkpoint_url

    assert get_checkpoint_url is model_zoo.get_checkpoint_url


@pytest.mark.slow
def test_a_built_wheel_ships_the_configs(tmp_path):
    # Built from a copy: pip builds in the source tree and would leave build/ in the checkout.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("setup.py", "README.md", "MANIFEST.in", "pyproject.toml"):
        shutil.copy(ROOT / name, source / name)
    for name in ("trainkit", "configs"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = tmp_path.glob("trainkit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (
        "common/train.py",
        "common/optim.py",
        "common/coco_schedule.py",
        "shapes/cnn_small.yaml",
        "shapes/cnn_small.py",
        "Base-Shapes.yaml",
    ):
        assert f"trainkit/model_zoo/configs/{name}" in names, name
