"""Reading images for a mapper, checking their size, and the config's default augmentations.

The general part of detectron2's ``detection_utils``: :func:`read_image` (formats, EXIF
orientation), :func:`convert_PIL_to_numpy`, :func:`convert_image_to_rgb`, :func:`check_image_size`,
:func:`build_augmentation` and :func:`check_metadata_consistency`. Its detection-only functions
(instances, boxes, keypoints) are not part of trainkit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from trainkit.config import CfgNode, ConfigError
from trainkit.data import transforms as T
from trainkit.data.catalog import MetadataCatalog
from trainkit.utils.detection_only import detection_only
from trainkit.utils.errors import UsageError
from trainkit.utils.file_io import PathManager

logger = logging.getLogger(__name__)

__all__ = [
    "SizeMismatchError",
    "annotations_to_instances",
    "annotations_to_instances_rotated",
    "build_augmentation",
    "build_transform_gen",
    "check_image_size",
    "check_metadata_consistency",
    "convert_PIL_to_numpy",
    "convert_image_to_rgb",
    "create_keypoint_hflip_indices",
    "filter_empty_instances",
    "gen_crop_transform_with_instance",
    "read_image",
    "transform_instance_annotations",
    "transform_keypoint_annotations",
    "transform_proposals",
]

# RGB (0-1) <-> YUV by ITU-R BT.601; rows are output channels.
_RGB_TO_YUV = np.array(
    [[0.299, 0.587, 0.114], [-0.14713, -0.28886, 0.436], [0.615, -0.51499, -0.10001]]
)
_YUV_TO_RGB = np.array([[1.0, 0.0, 1.13983], [1.0, -0.39465, -0.58060], [1.0, 2.03211, 0.0]])
_EXIF_ORIENTATION = 0x0112  # the EXIF tag PIL's exif_transpose reads


class SizeMismatchError(ValueError):
    """An image's size differs from the ``width``/``height`` its record gives."""


def convert_PIL_to_numpy(image: Any, format: str | None) -> np.ndarray:  # noqa: N802, A002
    """Return a PIL image as an ``HxWxC`` (``HxW`` for ``format=None`` grey) array.

    Args:
        image: a PIL image.
        format: ``"BGR"``, ``"RGB"``, ``"L"`` (``HxWx1``), ``"YUV-BT.601"`` (float, Y in
            [0, 1]), any other PIL mode, or ``None`` to keep the file's own mode.
    """
    if format is not None:
        # PIL has no BGR or YUV mode: read RGB and convert below. An image already in the
        # mode needs no convert(), which would only copy it.
        mode = "RGB" if format in ("BGR", "YUV-BT.601") else format
        image = image.convert(mode) if image.mode != mode else image
    if format == "BGR":
        # PIL packs the channels in BGR order itself: a C-contiguous array, where a reversed
        # view of RGB (``[:, :, ::-1]``) would cost a strided copy (~5x the read) in the first
        # transform that needs contiguous pixels (every PIL resize).
        width, height = image.size
        return np.frombuffer(image.tobytes("raw", "BGR"), np.uint8).reshape(height, width, 3)
    array = np.asarray(image)
    if format == "L":
        return np.expand_dims(array, -1)  # PIL drops the channel axis of grey images
    if format == "YUV-BT.601":
        return np.dot(array / 255.0, _RGB_TO_YUV.T)
    return array


def convert_image_to_rgb(image: Any, format: str) -> np.ndarray:  # noqa: A002
    """Return an ``HxWx3`` uint8 RGB array from an image in ``format`` (e.g. for drawing).

    Args:
        image: ``HxWxC`` numpy array or torch tensor in ``format``.
        format: as in :func:`convert_PIL_to_numpy` (``"L"``: ``HxWx1``).
    """
    from PIL import Image

    image = image if isinstance(image, np.ndarray) else image.cpu().numpy()
    if format == "BGR":
        image = image[:, :, [2, 1, 0]]
    elif format == "YUV-BT.601":
        image = np.dot(image, _YUV_TO_RGB.T) * 255.0
    else:
        if format == "L":
            image = image[:, :, 0]
        image = np.asarray(Image.fromarray(image.astype(np.uint8)).convert("RGB"))
    return np.clip(image, 0, 255).astype(np.uint8) if image.dtype != np.uint8 else image


def _apply_exif_orientation(image: Any) -> Any:
    """Turn ``image`` upright as its EXIF orientation says (cameras store it rotated)."""
    try:
        orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # a broken EXIF block: keep the pixels as they are
        return image
    if orientation == 1:
        return image
    from PIL import ImageOps

    return ImageOps.exif_transpose(image)


def read_image(file_name: str, format: str | None = None) -> np.ndarray:  # noqa: A002
    """Read an image file into an array, upright (EXIF orientation applied).

    Args:
        file_name: a local path, or a URL ``PathManager`` can open.
        format: ``"BGR"``, ``"RGB"``, ``"L"``, ``"YUV-BT.601"``, another PIL mode, or
            ``None`` (the file's own); see :func:`convert_PIL_to_numpy`.

    Returns:
        ``HxWxC`` uint8 (float for YUV) array.

    Raises:
        OSError: If the file cannot be read or decoded (a loader skips such a record).
        UsageError: For a ``detectron2://`` URL (detectron2's downloads).
    """
    from PIL import Image

    if file_name.startswith("detectron2://"):
        raise UsageError(
            f"{file_name!r} is a detectron2 download URL (its model zoo and sample files), "
            "which trainkit does not fetch; download the file and pass its local path."
        )
    # iopath adds nothing for a local file but costs ~20 us an image; URLs go through it.
    opener = PathManager.open if "://" in file_name else open
    with opener(file_name, "rb") as f:
        return convert_PIL_to_numpy(_apply_exif_orientation(Image.open(f)), format)


def check_image_size(dataset_dict: dict[str, Any], image: np.ndarray) -> None:
    """Check the record's ``width``/``height`` against ``image``; fill in the missing ones.

    Raises:
        SizeMismatchError: If a given size differs from the image's.
    """
    actual = {"width": image.shape[1], "height": image.shape[0]}
    given = {k: dataset_dict[k] for k in actual if k in dataset_dict}
    if any(int(v) != actual[k] for k, v in given.items()):
        where = dataset_dict.get("file_name", "the image")
        raise SizeMismatchError(
            f"{where} is {actual['width']}x{actual['height']} (WxH) but its record says "
            f"{dataset_dict.get('width', '?')}x{dataset_dict.get('height', '?')}; fix the "
            "record's width/height (or the image: an EXIF rotation swaps them)"
        )
    for key, value in actual.items():
        dataset_dict.setdefault(key, value)


def build_augmentation(cfg: CfgNode, is_train: bool) -> list[T.Augmentation]:
    """The config's default augmentations: resize the shorter side, and flip in training.

    Training: ``ResizeShortestEdge(INPUT.MIN_SIZE_TRAIN, INPUT.MAX_SIZE_TRAIN,
    INPUT.MIN_SIZE_TRAIN_SAMPLING)`` then ``RandomFlip`` as ``INPUT.RANDOM_FLIP`` says
    (``"horizontal"``, ``"vertical"`` or ``"none"``). Testing: ``ResizeShortestEdge(
    INPUT.MIN_SIZE_TEST, INPUT.MAX_SIZE_TEST, "choice")`` (``MIN_SIZE_TEST 0``: no resize;
    ``MAX_SIZE_* 0``: no cap).

    Raises:
        ConfigError: A ``ValueError`` naming the key out of range.
    """
    inp = cfg.INPUT
    if is_train:
        min_size, max_size = inp.MIN_SIZE_TRAIN, inp.MAX_SIZE_TRAIN
        style = inp.MIN_SIZE_TRAIN_SAMPLING
        if style not in ("range", "choice"):
            raise ConfigError(
                f"INPUT.MIN_SIZE_TRAIN_SAMPLING must be 'range' or 'choice', got {style!r}"
            )
        if style == "range" and len(min_size) != 2:
            raise ConfigError(
                f"INPUT.MIN_SIZE_TRAIN with sampling 'range' is [min, max], got {list(min_size)}; "
                "set INPUT.MIN_SIZE_TRAIN_SAMPLING choice for a list of sizes"
            )
    else:
        min_size, max_size, style = inp.MIN_SIZE_TEST, inp.MAX_SIZE_TEST, "choice"
    augmentation: list[T.Augmentation] = [
        T.ResizeShortestEdge(min_size, max_size if max_size > 0 else 2**62, style)
    ]
    if is_train:
        flip = inp.RANDOM_FLIP
        if flip not in ("horizontal", "vertical", "none"):
            raise ConfigError(
                f"INPUT.RANDOM_FLIP must be 'horizontal', 'vertical' or 'none', got {flip!r}"
            )
        if flip != "none":
            augmentation.append(
                T.RandomFlip(horizontal=flip == "horizontal", vertical=flip == "vertical")
            )
    return augmentation


build_transform_gen = build_augmentation  # detectron2's older name


def check_metadata_consistency(key: str, dataset_names: Sequence[str]) -> None:
    """Check that every dataset's metadata has the same value for ``key``.

    Raises:
        AttributeError: If a dataset's metadata has no ``key``.
        ValueError: If two datasets disagree (both values are logged).
    """
    if not dataset_names:
        return
    values = [getattr(MetadataCatalog.get(name), key) for name in dataset_names]
    for name, value in zip(dataset_names, values):
        if value != values[0]:
            logger.error("Metadata %r of dataset %r is %s", key, name, value)
            logger.error("Metadata %r of dataset %r is %s", key, dataset_names[0], values[0])
            raise ValueError(
                f"datasets {dataset_names[0]!r} and {name!r} have different metadata {key!r}; "
                "train or evaluate them together only if they agree"
            )


# detectron2's detection functions of this module: they import, and calling one says why not.
_ANNOTATIONS = "turning annotations into Instances"
annotations_to_instances = detection_only("annotations_to_instances", __name__, _ANNOTATIONS)
annotations_to_instances_rotated = detection_only(
    "annotations_to_instances_rotated", __name__, _ANNOTATIONS
)
filter_empty_instances = detection_only("filter_empty_instances", __name__, "filtering Instances")
transform_instance_annotations = detection_only(
    "transform_instance_annotations", __name__, "moving boxes, masks and keypoints with a transform"
)
transform_keypoint_annotations = detection_only(
    "transform_keypoint_annotations", __name__, "moving keypoints with a transform"
)
transform_proposals = detection_only("transform_proposals", __name__, "moving box proposals")
create_keypoint_hflip_indices = detection_only(
    "create_keypoint_hflip_indices", __name__, "keypoint flip pairs"
)
gen_crop_transform_with_instance = detection_only(
    "gen_crop_transform_with_instance", __name__, "a crop around an instance's box"
)
