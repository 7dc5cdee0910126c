"""``DatasetMapper``: the loaders' default mapper (read the image, augment, make tensors).

detectron2's default mapper with its ``@configurable`` signature, for everything but detection: a
record's ``annotations`` pass through as they are (turning them into ``Instances`` is
detection-only), and the detection arguments are accepted but refuse to be switched on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from trainkit.config import CfgNode, configurable
from trainkit.data import detection_utils as utils
from trainkit.data import transforms as T
from trainkit.utils.errors import UsageError

logger = logging.getLogger(__name__)

__all__ = ["DatasetMapper"]


def _refuse_detection_arguments(**arguments: Any) -> None:
    """Raise for the first of detectron2's instance arguments that is switched on."""
    for name, value in arguments.items():
        if value not in (None, False):
            raise UsageError(
                f"DatasetMapper({name}={value!r}) turns annotations into Instances, which is "
                "detection-only and not part of trainkit (MODEL.MASK_ON, MODEL.KEYPOINT_ON and "
                "MODEL.LOAD_PROPOSALS must stay off); keep detectron2's DatasetMapper for "
                "detection, or read record['annotations'] in your own mapper"
            )


class DatasetMapper:
    """Map a record to what a model takes: the image read, augmented, as a CHW tensor.

    For a record (a dict with ``file_name``) it returns a shallow copy with:

    - ``image``: uint8 tensor ``[C, H, W]`` in ``image_format`` after the augmentations
      (``float`` for ``"YUV-BT.601"``);
    - ``height``, ``width``: the size of the image as read (checked against the record's,
      filled in when missing); the augmented size is ``image.shape[1:]``;
    - ``sem_seg``: long tensor ``[H, W]`` read from ``sem_seg_file_name`` (which is
      removed), transformed with the image;
    - everything else as it was: ``annotations`` pass through untouched in training (only
      detection would move them) and are removed in testing, as detectron2 does.

    Random augmentations draw from the sample's generator in a loader (``augmentation_rng``):
    the same for any ``NUM_WORKERS`` and after a resume.
    """

    @configurable
    def __init__(
        self,
        is_train: bool = True,
        *,
        augmentations: Sequence[T.Augmentation | T.Transform],
        image_format: str,
        use_instance_mask: bool = False,
        use_keypoint: bool = False,
        instance_mask_format: str = "polygon",
        keypoint_hflip_indices: np.ndarray | None = None,
        precomputed_proposal_topk: int | None = None,
        recompute_boxes: bool = False,
    ):
        """Create the mapper (or ``DatasetMapper(cfg, is_train)``, see :meth:`from_config`).

        Args:
            is_train: training (keep ``annotations``) or testing (drop them).
            augmentations: applied in order to the image and its label map.
            image_format: ``INPUT.FORMAT``: ``"BGR"``, ``"RGB"``, ``"L"``, ``"YUV-BT.601"``
                or another PIL mode (see :func:`~trainkit.data.detection_utils.read_image`).
            use_instance_mask, use_keypoint, instance_mask_format: detectron2's detection
                arguments; accepted so that calls port, refused when switched on.
            keypoint_hflip_indices, precomputed_proposal_topk, recompute_boxes: the same.

        Raises:
            UsageError: If a detection argument is switched on.
        """
        _refuse_detection_arguments(
            use_instance_mask=use_instance_mask,
            use_keypoint=use_keypoint,
            keypoint_hflip_indices=keypoint_hflip_indices,
            precomputed_proposal_topk=precomputed_proposal_topk,
            recompute_boxes=recompute_boxes,
        )
        self.is_train = is_train
        self.augmentations = T.AugmentationList(augmentations)
        self.image_format, self.instance_mask_format = image_format, instance_mask_format
        mode = "training" if is_train else "inference"
        logger.info("[DatasetMapper] Augmentations used in %s: %s", mode, self.augmentations)

    @classmethod
    def from_config(cls, cfg: CfgNode, is_train: bool = True) -> dict[str, Any]:
        """Arguments from ``cfg``: ``build_augmentation(cfg, is_train)``, ``INPUT.FORMAT``.

        In training with ``INPUT.CROP.ENABLED``, ``RandomCrop(INPUT.CROP.TYPE,
        INPUT.CROP.SIZE)`` comes first. ``MODEL.MASK_ON`` / ``KEYPOINT_ON`` /
        ``LOAD_PROPOSALS`` set the detection arguments (refused when on).
        """
        augs = utils.build_augmentation(cfg, is_train)
        crop = cfg.INPUT.get("CROP", None)
        if is_train and crop is not None and crop.ENABLED:
            augs.insert(0, T.RandomCrop(crop.TYPE, crop.SIZE))
        model = cfg.MODEL
        return {
            "is_train": is_train,
            "augmentations": augs,
            "image_format": cfg.INPUT.FORMAT,
            "use_instance_mask": bool(model.get("MASK_ON", False)),
            "instance_mask_format": cfg.INPUT.get("MASK_FORMAT", "polygon"),
            "use_keypoint": bool(model.get("KEYPOINT_ON", False)),
            "precomputed_proposal_topk": (
                cfg.DATASETS.PRECOMPUTED_PROPOSAL_TOPK_TRAIN
                if model.get("LOAD_PROPOSALS", False)
                else None
            ),
        }

    def __call__(self, dataset_dict: dict[str, Any]) -> dict[str, Any]:
        """Map one record (see the class docstring).

        Raises:
            UsageError: If the record has no ``file_name`` (other records need their own mapper).
            OSError: If an image cannot be read (a loader then tries another record).
            SizeMismatchError: If the image's size differs from the record's.
        """
        if not isinstance(dataset_dict, dict) or "file_name" not in dataset_dict:
            raise UsageError(
                f"record {_keys(dataset_dict)} has no 'file_name' for DatasetMapper, the "
                "loaders' default mapper when mapper=None; pass mapper=... to the loader (or "
                "override build_train_loader/build_test_loader) for records of another kind"
            )
        record = dict(dataset_dict)  # the caller's dict stays as it was
        image = utils.read_image(record["file_name"], format=self.image_format)
        utils.check_image_size(record, image)
        sem_seg = None
        if "sem_seg_file_name" in record:
            sem_seg = utils.read_image(record.pop("sem_seg_file_name"), "L").squeeze(2)
        aug_input = T.AugInput(image, sem_seg=sem_seg)
        self.augmentations(aug_input)
        image, sem_seg = aug_input.image, aug_input.sem_seg
        # ascontiguousarray: a flip leaves negative strides, which torch cannot view.
        chw = np.ascontiguousarray(image.transpose(2, 0, 1))
        if not chw.flags.writeable:  # an image read as it is (PIL's buffer is read-only)
            chw = chw.copy()
        record["image"] = torch.as_tensor(chw)
        if sem_seg is not None:
            record["sem_seg"] = torch.as_tensor(sem_seg.astype("long"))
        if not self.is_train:
            record.pop("annotations", None)
        return record

    @property
    def tfm_gens(self) -> list[T.Augmentation | T.Transform]:
        """detectron2 0.1's name of :attr:`augmentations`, as a list."""
        return list(self.augmentations.augs)

    @tfm_gens.setter
    def tfm_gens(self, augmentations: Sequence[T.Augmentation | T.Transform]) -> None:
        # Subclasses written for detectron2 0.1 replace the augmentations by assigning
        # `self.tfm_gens` after __init__; detectron2 0.2+ silently ignores that (so such a
        # project trains on the default resize), trainkit applies it as its author meant.
        self.augmentations = T.AugmentationList(augmentations)
        logger.info(
            "[DatasetMapper] tfm_gens (detectron2 0.1's name) replaces the augmentations: %s",
            self.augmentations,
        )

    def __repr__(self) -> str:
        return (
            f"DatasetMapper(is_train={self.is_train}, image_format={self.image_format!r}, "
            f"augmentations={self.augmentations})"
        )


def _keys(record: Any) -> str:
    """A short description of a record for messages: its keys."""
    if isinstance(record, dict):
        return "with keys " + ", ".join(repr(k) for k in list(record)[:8])
    return f"of type {type(record).__name__}"
