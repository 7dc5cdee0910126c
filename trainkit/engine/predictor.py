"""``DefaultPredictor``: a model, its weights and the test-time resize, for one image at a time."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

from trainkit.checkpoint import Checkpointer
from trainkit.config import CfgNode, ConfigError
from trainkit.data import MetadataCatalog
from trainkit.data import transforms as T
from trainkit.modeling import build_model

__all__ = ["DefaultPredictor"]


class DefaultPredictor:
    """Run the config's model on single images, as detectron2's ``DefaultPredictor`` does.

    Builds ``MODEL.META_ARCHITECTURE`` on ``MODEL.DEVICE``, loads ``MODEL.WEIGHTS`` with
    trainkit's :class:`~trainkit.checkpoint.Checkpointer` (an empty string keeps the
    initial weights) and puts the model in eval mode. Each call resizes the image with
    ``ResizeShortestEdge(INPUT.MIN_SIZE_TEST, INPUT.MAX_SIZE_TEST)`` (``MIN_SIZE_TEST 0``:
    no resize; ``MAX_SIZE_TEST 0``: no cap) and returns the model's prediction for it. For
    batches or several GPUs, build a test loader and call the model yourself.

    Attributes:
        cfg: a copy of the config.
        model: the model, in eval mode.
        metadata: ``MetadataCatalog`` entry of ``DATASETS.TEST[0]`` (if any test set).
        aug: the test-time resize.
        input_format: ``INPUT.FORMAT``, the channel order the model takes.

    Example::

        predictor = DefaultPredictor(cfg)
        logits = predictor(image_bgr)   # HxWx3 uint8, e.g. from cv2.imread
    """

    def __init__(self, cfg: CfgNode):
        """Build the model and load its weights.

        Raises:
            ConfigError: A ``ValueError``: if ``INPUT.FORMAT`` is not ``"RGB"`` or ``"BGR"``
                (and as ``build_model`` does).
            MissingFileError: If ``MODEL.WEIGHTS`` names a file that does not exist.
        """
        self.cfg = cfg.clone()
        self.input_format = self.cfg.INPUT.FORMAT
        if self.input_format not in ("RGB", "BGR"):
            raise ConfigError(
                f"DefaultPredictor takes 3-channel images: INPUT.FORMAT must be RGB or BGR, got "
                f"{self.input_format!r}"
            )
        # The whole model, on MODEL.DEVICE, even for a config that trains it sharded: it loads
        # a sharded checkpoint directory as it loads a file, on one process.
        frozen = self.cfg.is_frozen()
        self.cfg.defrost()
        self.cfg.MODEL.FSDP.ENABLED = False
        if frozen:
            self.cfg.freeze()
        self.model = build_model(self.cfg)
        self.model.eval()
        if len(self.cfg.DATASETS.TEST):
            self.metadata = MetadataCatalog.get(self.cfg.DATASETS.TEST[0])
        Checkpointer(self.model).load(self.cfg.MODEL.WEIGHTS)
        min_size, max_size = self.cfg.INPUT.MIN_SIZE_TEST, self.cfg.INPUT.MAX_SIZE_TEST
        self.aug = T.ResizeShortestEdge([min_size, min_size], max_size or sys.maxsize)

    def __call__(self, original_image: np.ndarray) -> Any:
        """Return the model's prediction for one image.

        Args:
            original_image: ``HxWx3`` array in BGR order (as ``cv2.imread`` gives); it is
                turned into ``INPUT.FORMAT``'s order before the model sees it.

        Returns:
            The model's output, ``model([inputs])[0]`` (the built-in ``ImageClassifier``: logits).
        """
        with torch.no_grad():
            if self.input_format == "RGB":
                original_image = original_image[:, :, ::-1]
            height, width = original_image.shape[:2]
            image = self.aug.get_transform(original_image).apply_image(original_image)
            image = torch.as_tensor(
                np.ascontiguousarray(image.astype("float32").transpose(2, 0, 1))
            )
            device = next(iter(self.model.parameters()), torch.empty(0)).device
            inputs = {"image": image.to(device), "height": height, "width": width}
            return self.model([inputs])[0]
