"""Find, load and build the configs trainkit ships, by their path under ``configs/``."""

from __future__ import annotations

import importlib.resources
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainkit.checkpoint import DetectionCheckpointer
from trainkit.config import CfgNode, LazyConfig, get_cfg, instantiate
from trainkit.config.cfg_node import did_you_mean
from trainkit.modeling import build_model
from trainkit.utils.errors import MissingFileError, UsageError

__all__ = ["get", "get_checkpoint_url", "get_config", "get_config_file"]

logger = logging.getLogger(__name__)

_CONFIG_SUFFIXES = (".yaml", ".py")


def _config_roots() -> list[Path]:
    """Where configs are looked up, first match wins.

    1. ``trainkit/model_zoo/configs``: package data; a built wheel also holds a copy of the
       repository's ``configs/`` there (setup.py's build step);
    2. the repository's ``configs/`` beside the package, in a source checkout (editable
       installs), so it is never duplicated in the tree.
    """
    packaged = Path(str(importlib.resources.files("trainkit.model_zoo").joinpath("configs")))
    checkout = Path(__file__).resolve().parents[2] / "configs"
    return [root for root in (packaged, checkout) if root.is_dir()]


def _available() -> list[str]:
    names = {
        path.relative_to(root).as_posix()
        for root in _config_roots()
        for path in root.rglob("*")
        if path.suffix in _CONFIG_SUFFIXES and path.is_file()
    }
    return sorted(names)


# The folders and files of detectron2's configs/ that describe detection: its model zoo's
# tasks, and the data and model parts of configs/common/ (train.py, optim.py and the
# schedules are task-agnostic and shipped).
_DETECTRON2_DETECTION_CONFIGS = (
    "COCO-Detection/",
    "COCO-InstanceSegmentation/",
    "COCO-Keypoints/",
    "COCO-PanopticSegmentation/",
    "Cityscapes/",
    "Detectron1-Comparisons/",
    "LVISv0.5-InstanceSegmentation/",
    "LVISv1-InstanceSegmentation/",
    "Misc/",
    "PascalVOC-Detection/",
    "new_baselines/",
    "quick_schedules/",
    "common/data/",
    "common/models/",
    "Base-RCNN-",
    "Base-RetinaNet",
)


def get_config_file(config_path: str) -> str:
    """Return the path of a shipped config.

    Args:
        config_path: its path under ``configs/``, e.g. ``"shapes/cnn_small.yaml"`` or
            ``"common/train.py"``.

    Raises:
        MissingFileError: If trainkit ships no such config: the message lists the closest,
            or says that one of detectron2's detection configs is detection-only.
    """
    for root in _config_roots():
        path = root / config_path
        if path.is_file():
            return str(path)
    if config_path.lstrip("./").startswith(_DETECTRON2_DETECTION_CONFIGS):
        raise MissingFileError(
            f"{config_path!r} is one of detectron2's detection configs (detection models, "
            "COCO-style data and evaluators), which are detection-only and not shipped by "
            "trainkit: keep detectron2 for it, or write a config for your own model on "
            "trainkit's common/train.py, common/optim.py and common/coco_schedule.py."
        )
    available = _available()
    raise MissingFileError(
        f"trainkit's model zoo has no config {config_path!r}.{did_you_mean(config_path, available)}"
        f" Available: {', '.join(available)}."
    )


def get_checkpoint_url(config_path: str) -> str:
    """Refuse: trainkit publishes no trained weights (detectron2 returns its model zoo's URL).

    Raises:
        UsageError: Always, saying what to do instead.
    """
    raise UsageError(
        f"trainkit has no model zoo weights, so there is no trained checkpoint for "
        f"{config_path!r} (detectron2:// URLs are detectron2's model zoo, which trainkit does "
        "not read); train the config (tools/train_net.py or tools/lazyconfig_train_net.py) "
        "and use its model_final.pth as MODEL.WEIGHTS or train.init_checkpoint."
    )


def get_config(config_path: str, trained: bool = False) -> Any:
    """Return a shipped config: a ``CfgNode`` for ``.yaml``, a LazyConfig for ``.py``.

    Args:
        config_path: see :func:`get_config_file`.
        trained: detectron2 sets the trained weights here; trainkit has none, so ``True``
            raises (see :func:`get_checkpoint_url`).

    Raises:
        MissingFileError: If there is no such config.
        UsageError: If ``trained`` is True.
    """
    if trained:
        get_checkpoint_url(config_path)
    path = get_config_file(config_path)
    if path.endswith(".yaml"):
        cfg = get_cfg()
        cfg.merge_from_file(path)
        return cfg
    return LazyConfig.load(path)


def get(config_path: str, trained: bool = False, device: str | None = None) -> nn.Module:
    """Build the model of a shipped config, in training mode.

    Its weights are loaded when the config names some (``MODEL.WEIGHTS``, or
    ``train.init_checkpoint`` for a LazyConfig).

    Args:
        config_path: see :func:`get_config_file`.
        trained: see :func:`get_config`.
        device: where to put the model; default the config's, or the CPU without CUDA.
    """
    cfg = get_config(config_path, trained)
    if device is None and not torch.cuda.is_available():
        device = "cpu"
    if isinstance(cfg, CfgNode):
        if device is not None:
            cfg.MODEL.DEVICE = device
        model = build_model(cfg)
        weights = cfg.MODEL.WEIGHTS
    else:
        model = instantiate(cfg.model)
        if device is not None:
            model = model.to(device)
        weights = cfg.get("train", {}).get("init_checkpoint", "")
    if weights:
        DetectionCheckpointer(model).load(weights)
    return model
